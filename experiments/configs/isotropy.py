"""Config of ``experiments/isotropy.py``: isotropy of VO / FFN matrices over training.

Launch::

    python -m experiments.isotropy --scale quick --out runs/isotropy

Several seeds trained together in one vmapped program (``config.seeds``), Muon and Adam,
the tail_lm model on the corpus; spectrum metrics (normalised SVD entropy, effective
rank, top-10 energy, Q75/25; ``amemory.analysis.spectrum``) of VO (per head W_o W_v),
W_in and W_out every ``spectrum_every`` steps; mean and spread across seeds.
Quick scale: 5 seeds, 300 steps (CPU minutes). Full: 10 seeds as in paper A.
Learning rates: tail_lm's quick-scale grid choice (Adam 3e-3, Muon 0.02; its run on
2026-11-21 chose these from 1e-3/3e-3/1e-2 and 0.01/0.02/0.05).
"""

from __future__ import annotations

from ml_collections import ConfigDict

from experiments.configs import SCALES as SCALES
from experiments.configs import new_config
from experiments.configs.tail_lm import base_lm


def get_config(scale: str = "quick") -> ConfigDict:
    """Return the isotropy experiment config.

    Raises:
      ValueError: if ``scale`` is not one of ``SCALES``.
    """
    c, quick = new_config(scale)
    c.base = base_lm(scale)
    c.base.seeds = tuple(range(5 if quick else 10))  # vmapped seeds (papers: 10)
    c.base.spectrum_every = 25 if quick else 250
    c.base.spectrum_roles = "vo+ffn"
    c.optimizers = ("adam", "muon")
    c.matrix_roles = "hidden"
    c.lr = ConfigDict()
    c.lr.adam = 3e-3
    c.lr.muon = 0.02
    c.metrics = ("entropy", "effective_rank", "top10_energy", "q75_25")
    return c
