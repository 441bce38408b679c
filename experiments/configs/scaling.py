"""Config of ``experiments/scaling.py``: paper B's scaling laws.

Launch::

    python -m experiments scaling --scale quick --out runs/scaling

Part 1: paper B.2's synthetic memory; part 2: the data-scaling envelope on tail_lm's
model (the largest budget is tail_lm's run length, so those runs are shared with tail_lm).
"""

from __future__ import annotations

from ml_collections import ConfigDict

from experiments.configs import new_config, tail_lm


def get_config(scale: str = "quick") -> ConfigDict:
    """The scaling experiment config; ``ValueError`` if ``scale`` is not one of ``SCALES``."""
    c, quick = new_config(scale)
    c.parts = ("synthetic", "envelope")  # which parts to run
    # ---- synthetic (paper B) ----
    c.M = 100 if quick else 400  # groups
    c.C = 2 if quick else 2  # classes per group (K = M * C)
    c.betas = (1.5, 2.5)  # power-law exponents over groups (paper B: beta > 1)
    c.noise = 0.1  # label noise alpha
    c.T_grid = (16, 32, 64, 128, 256, 512) if quick else (16, 32, 64, 128, 256, 512, 1024, 2048)
    c.gd_lr_times_p1_inv = 1.0  # eta_GD = this / p_1 (linear stability: eta p_1 <~ 1)
    c.muon_c = 2.0  # eta_Muon = muon_c * log(K) / T; needs muon_c log K >= log(1 + K(1-a)/a)
    # Verdict: Muon's excess * (T / log K)^2 over the upper half of the T grid must stay
    # below `muon_bound_factor` x its maximum over the lower half (bounded, not growing).
    c.muon_bound_factor = 2.0
    # ---- envelope (real corpus) ----
    lm = tail_lm.get_config(scale)
    c.base = lm.base
    c.muon_roles = "hidden"
    c.budgets = (75, 150, 300) if quick else (1250, 2500, 5000)  # steps; the last = base.steps
    c.lr_grid = ConfigDict({"adam": lm.lr_grid.adam, "muon": lm.lr_grid.muon})
    return c
