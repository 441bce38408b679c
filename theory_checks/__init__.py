"""Numerical checks of the statements of Wang et al. 2025 and Li et al. 2026."""
