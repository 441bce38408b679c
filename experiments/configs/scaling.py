"""Config of ``experiments/scaling.py``: paper B's scaling laws.

Launch::

    python -m experiments scaling --scale quick --out runs/scaling

Part 1 (synthetic, paper B.2): the one-layer memory in task space with a hierarchical
power-law prior (M groups of C classes, group mass ~ g^-beta) and label noise; excess
loss L(T) - L* after T steps for GD (eta = gd_lr_times_p1_inv / p_1, constant) and Muon
(eta = muon_c log K / T, a fresh run per T), fitted power-law exponents.
Part 2 (real corpus): a data-scaling envelope: for each step budget the minimum final
validation loss over a learning-rate grid, for Adam and Muon (the tail_lm model; the
largest budget equals tail_lm's run length, so those runs are shared with tail_lm).
Quick scale: K = 200, T = 16..512, two betas (about a minute), and budgets 75/150/300
steps x 3 learning rates x 2 optimizers (about 18 short runs, CPU minutes).
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
