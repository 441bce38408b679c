"""Config of ``experiments/tail_qa.py``: heavy-tailed knowledge QA on synthetic biographies.

Launch::

    python -m experiments tail_qa --scale quick --out runs/tail_qa

Biographies of paper A (Wang et al. 2025, arXiv 2509.26030, Sec. 5) on tail_lm's model.
``amemory reproduce`` runs the reduced set without its own grid, at the learning rates
tail_lm chose on the corpus for the same model. Full scale: m = 15 (the paper's size).
"""

from __future__ import annotations

from ml_collections import ConfigDict

from experiments.configs import new_config
from experiments.configs.tail_lm import SEEDS, base_lm

# Paper A (Wang et al. 2025, arXiv 2509.26030), Sec. 5: first-token accuracy at 10k steps (non-gated), groups 11 / 13 / 15 of m = 15.
PAPER_FTA = {
    "muon": (1.000, 1.000, 0.976),
    "adam": (1.000, 0.890, 0.264),
    "sgd": (0.422, 0.294, 0.126),
    "muon_vo+ffn": (1.000, 0.998, 0.954),
    "muon_qk": (1.000, 0.940, 0.286),
}


def base_bio(scale: str = "quick") -> ConfigDict:
    """The LM run config on biographies (tail_lm's model and optimizer settings)."""
    quick = scale == "quick"
    c = base_lm(scale)
    c.data.update(kind="biographies", batch_size=32)
    c.data.biographies.update(m=8 if quick else 15, eval_per_group=256 if quick else 1200)
    c.update(steps=300 if quick else 10000, eval_every=50 if quick else 500, spectrum_every=0)
    return c


def get_config(scale: str = "quick") -> ConfigDict:
    """The tail_qa experiment config; ``ValueError`` if ``scale`` is not one of ``SCALES``."""
    c, quick = new_config(scale)
    c.base = base_bio(scale)
    # Variants: "<optimizer>" trains that optimizer (Muon on hidden matrices, Adam on the
    # rest; "adam" everything Adam; "sgd" everything SGD with momentum), and
    # "muon_<roles>" puts Muon on those roles only.
    c.variants = ("muon", "adam", "sgd", "muon_vo+ffn", "muon_qk")
    c.sweep = True  # grid-search adam, muon, sgd learning rates on base.seed (else use `lr`)
    c.seeds = SEEDS  # initialisation seeds of the compared runs (vmapped; same data order)
    c.lr_grid = ConfigDict()
    c.lr_grid.adam = (1e-3, 3e-3, 1e-2) if quick else (3e-4, 1e-3, 3e-3)
    c.lr_grid.muon = (0.01, 0.02, 0.05) if quick else (0.005, 0.01, 0.02)
    c.lr_grid.sgd = (0.03, 0.1, 0.3)  # heavy-ball momentum 0.9 (sgd_momentum)
    # Learning rates used when sweep is False (defaults: the middle of each grid;
    # amemory reproduce sets adam and muon to tail_lm's choice).
    c.lr = ConfigDict({"adam": 3e-3, "muon": 0.02, "sgd": 0.1})
    c.lr_source = "config defaults, the middle of each grid"  # stated in the report
    c.sgd_momentum = 0.9  # SGD + momentum baseline of the paper
    # The tail groups whose FTA the paper reports (11, 13, 15 of m = 15): m-4, m-2, m.
    c.tail_offsets = (4, 2, 0)
    return c
