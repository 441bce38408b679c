"""Config of ``experiments/one_layer.py``: paper A Fig. 4 on the one-layer memory.

Launch::

    python -m experiments one_layer --scale quick --out runs/one_layer

Full scale: K = 999, the paper's Fig. 4b/c.
"""

from __future__ import annotations

from ml_collections import ConfigDict

from experiments.configs import new_config


def get_config(scale: str = "quick") -> ConfigDict:
    """The one_layer experiment config; ``ValueError`` if ``scale`` is not one of ``SCALES``."""
    c, quick = new_config(scale)
    c.K = 150 if quick else 999  # classes = embedding dim d (Assumption 5.1); K % 3 == 0 (coupled)
    c.alpha = 0.8  # two-level prior: head mass (paper A, arXiv 2509.26030, Fig. 4: 0.8)
    c.beta = 0.2  # two-level prior: head fraction L/K (Fig. 4: 0.2)
    # heavy-tailed prior: counts of the K most frequent words of this corpus
    c.corpus = "shakespeare"
    c.priors = ("two_level", "corpus")  # which priors to run
    c.embeddings = ("decoupled", "coupled")  # E = Et = I, and paper A's ZYZ-rotation blocks
    c.optimizers = ("gd", "signgd", "muon")  # no momentum, as in the theorems
    c.eps = 0.1  # one-step balance rho^eps: smallest eta with max_k f_kk >= 1 - eps
    c.one_step_points = 60  # eta values of the one-step sweep (log-spaced in mean correct logit)
    c.one_step_max_logit = 40.0  # sweep up to this mean correct-class logit
    c.steps = 300 if quick else 600  # steps of the many-step trajectories
    # Constant learning rates of the many-step runs. eta_GD = gd_times_pmax_inv / p_max
    # (linear stability needs eta p_max <~ 1, paper B, arXiv 2602.05725). SignGD moves the
    # correct logit by eta and each wrong one by -eta, hence half Muon's eta.
    c.lr = ConfigDict({"gd_times_pmax_inv": 0.5, "signgd": 0.025, "muon": 0.05})
    # Thresholds of the verdicts (stated in the report): a path is "balanced" when its
    # largest gap stays below `balanced`, "imbalanced" when it exceeds `imbalanced`.
    c.balanced = 0.2
    c.imbalanced = 0.5
    return c
