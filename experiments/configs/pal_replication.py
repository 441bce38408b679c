"""Config of ``experiments/pal_replication.py``: facebookresearch/pal's scaling-law grid.

Launch (about 20 CPU-minutes; outside the default job)::

    amemory reproduce --only pal_replication

The values below are pal's (``projects/scaling_law/grid_experiments/run.py``: defaults
``N = 100``, ``M = 5``, ``alpha = 2``, and its ``finer_dim`` grid) except ``d`` and
``batch_sizes``, subsets of pal's grid chosen for the CPU budget.
"""

from __future__ import annotations

from ml_collections import ConfigDict

from experiments.configs import new_config


def get_config(scale: str = "quick") -> ConfigDict:
    """The pal_replication config (one size: pal's); ``ValueError`` for an unknown scale."""
    c, _ = new_config(scale)
    # pal's committed grid: projects/scaling_law/grid_experiments/res/finer_dim/all.jsonl.gz
    # in a local clone of github.com/facebookresearch/pal (required; nothing is downloaded).
    c.pal_results = ""
    c.N, c.M, c.alpha = 100, 5, 2.0  # inputs, classes (y = x mod M), Zipf exponent
    c.d = (10, 20, 50, 100)  # of pal's 10, 20, 50, 100, 200, 500, 1000
    c.batch_sizes = (256, 1024)  # of pal's 16, 64, 256, 1024
    c.lrs = (0.1, 1.0, 10.0, 100.0)  # pal's
    c.seeds = tuple(range(42, 52))  # pal's seed numbers (fed to jax.random)
    c.optimizers = ("sgd", "signgd", "muon", "adam")
    return c
