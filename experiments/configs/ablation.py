"""Config of ``experiments/ablation.py``: paper A Table 1, Muon on a subset of roles.

Launch::

    python -m experiments ablation --scale quick --out runs/ablation

tail_lm's model, seeds and chosen learning rates for every subset (inside ``amemory
reproduce`` the "none" and "all" rows are tail_lm's Adam and Muon runs, shared through the
cache). ``amemory reproduce`` runs the reduced set none, qk, vo+ffn, all with the non-gated
FFN. Full scale: the tail_lm full model.
"""

from __future__ import annotations

from ml_collections import ConfigDict

from experiments.configs import tail_lm

# Wang et al. 2025 (arXiv 2509.26030), Table 1: 160M NanoGPT on FineWeb, validation loss
# at 10k steps.
PAPER_TABLE = {
    "gelu": {
        "all": 3.5654, "none": 3.9242, "qk": 3.8925, "vo": 3.7644, "v": 3.8301,
        "o": 3.7712, "w_in": 3.7170, "w_out": 3.7023, "vo+ffn": 3.5858,
    },
    "swiglu": {
        "all": 3.5125, "none": 3.8837, "qk": 3.8518, "vo": 3.6874, "v": 3.7482,
        "o": 3.7604, "w_in": 3.7918, "w_out": 3.7843, "vo+ffn": 3.5312,
    },
}  # fmt: skip


def get_config(scale: str = "quick") -> ConfigDict:
    """The ablation config: tail_lm's base model and LR grids plus the subsets; ``ValueError``
    if ``scale`` is not one of ``SCALES``."""
    c = tail_lm.get_config(scale)
    c.optimizers = ("adam", "muon")  # only these two LRs are needed
    # Roles given to Muon ("all" = every hidden matrix, "none" = Adam everywhere).
    c.subsets = ("none", "qk", "vo", "v", "o", "w_in", "w_out", "ffn", "vo+ffn", "all")
    c.ffn_kinds = ("gelu", "swiglu")  # non-gated and gated FFN (model.ffn)
    # Verdict thresholds on the share of Muon's gain, (L_none - L_S) / (L_none - L_all):
    c.vo_ffn_min_share = 0.7  # paper: 0.94 (non-gated), 0.95 (gated)
    c.qk_max_share = 0.3  # paper: 0.09 (non-gated), 0.09 (gated)
    return c
