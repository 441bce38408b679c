"""Config of ``experiments/isotropy.py``: isotropy of VO / FFN matrices over training.

Launch::

    python -m experiments isotropy --scale quick --out runs/isotropy

Spectrum metrics (``amemory.analysis.spectrum``) of VO (W_o W_v per layer), W_in and
W_out every ``spectrum_every`` steps. Quick scale: tail_lm's seeds and model, so inside
``amemory reproduce`` these are tail_lm's seeded runs at tail_lm's chosen rates. Full: 10
seeds as in paper A.
"""

from __future__ import annotations

from ml_collections import ConfigDict

from experiments.configs import new_config
from experiments.configs.tail_lm import SEEDS, base_lm


def get_config(scale: str = "quick") -> ConfigDict:
    """The isotropy experiment config; ``ValueError`` if ``scale`` is not one of ``SCALES``."""
    c, quick = new_config(scale)
    c.base = base_lm(scale)
    c.seeds = SEEDS if quick else tuple(range(10))  # vmapped seeds (paper A: 10)
    c.base.spectrum_every = 25 if quick else 250
    c.base.spectrum_roles = "vo+ffn"
    c.optimizers = ("adam", "muon")
    c.muon_roles = "hidden"
    c.lr = ConfigDict({"adam": 3e-3, "muon": 0.02})
    c.lr_source = "config defaults (tail_lm's quick-scale choice)"  # stated in the report
    c.metrics = ("entropy", "effective_rank", "top10_energy", "q75_25")
    return c
