"""Benchmarks: `amemory bench optim` and `amemory bench train`."""
