"""Experiments reproducing the papers' figures; one module per experiment."""
