"""Checks of paper B (Li et al. 2026); filled in below."""
