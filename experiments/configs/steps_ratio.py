"""Config of ``experiments/steps_ratio.py``: steps Muon needs to reach Adam's final loss, by size.

Launch::

    python -m experiments steps_ratio --scale quick --out runs/steps_ratio
    python -m experiments steps_ratio --scale full --out runs/steps_ratio_full

Sizes vary one factor at a time around tail_lm's quick model, whose size reuses tail_lm's
grid and seeded runs. Quick scale: the claim at d=128, the largest size the main job's
budget holds. Full scale: the whole one-factor sweep, the claim at d=256, the reference at
d=128 and d=256, Adam's betas and Muon on shorter schedules.
"""

from __future__ import annotations

from ml_collections import ConfigDict

from experiments.configs import new_config, tail_lm


def get_config(scale: str = "quick") -> ConfigDict:
    """Return the steps_ratio config; ``ValueError`` if ``scale`` is not one of ``SCALES``."""
    c, quick = new_config(scale)
    # tail_lm's quick model and schedule; the sizes below override width, depth, vocabulary
    c.base = tail_lm.base_lm("quick")  # unchanged, so tail_lm's runs are reused at d=128
    c.widths = (64, 128) if quick else (64, 128, 256)  # d_model at depth 2, vocabulary 512
    c.depths = (2,) if quick else (1, 2, 4)  # n_layers at d=128, vocabulary 512
    c.vocabs = (512,) if quick else (512, 2048, 8192)  # BPE vocabulary at d=128, depth 2
    c.seeds = tail_lm.SEEDS  # held-out initialisation seeds of the compared runs
    c.lr_grid = ConfigDict()
    c.lr_grid.adam = (1e-3, 3e-3, 1e-2)  # peak LR of the cosine schedule, per step
    c.lr_grid.muon = (0.01, 0.02, 0.05)
    # Sizes searched on the smaller grid `lr_grid_small` (stated per size in the report)
    c.small_grid_sizes = ()
    c.lr_grid_small = ConfigDict({"adam": (1e-3, 3e-3), "muon": (0.01, 0.02)})
    # Sizes whose grid is skipped: the LRs in `lr` are used (stated in the report).
    c.fixed_lr_sizes = ()
    c.lr = ConfigDict({"adam": 3e-3, "muon": 0.02})
    c.lr_source = "tail_lm's quick-scale grid choice"
    # Plain optax + flax reference (experiments/reference_lm.py) at these sizes
    c.reference_sizes = ("d128",) if quick else ("d128", "d256")
    # Muon on shorter schedules (fractions of the steps) at the base size (budget-matched)
    c.budget_fractions = () if quick else (0.6, 0.8)
    # Adam with other (b1, b2) at the base size and its chosen LR: is paper A's
    # (0.8, 0.95) a handicap of the baseline?
    c.adam_betas = () if quick else ((0.9, 0.95), (0.9, 0.999))
    # The claim: "about half the steps" = a ratio at most this (on the seed interval).
    c.half_threshold = 0.6
    c.test_size = "d128" if quick else "d256"  # where the claim is tested
    return c
