"""Config of ``experiments/normuon.py``: NorMuon's premise on the corpus LM.

Launch::

    python -m experiments normuon --scale quick --out runs/normuon
    amemory reproduce --only normuon

tail_lm's model and data (quick: d=128, 2 layers, 512-token BPE, 300 steps). Muon's
learning rate and Adam's (embeddings, head, norms) are tail_lm's grid choice on seed 0;
NorMuon's is chosen on its own grid on seed 0. Both are then trained on tail_lm's 3
held-out initialisation seeds (the engine, one vmapped run each) for the validation
loss at equal steps, and by the plain loop of ``experiments/reference_lm.py`` with the
same seeds, batches and settings, which records the per-output-neuron norms of every
step's update of every hidden matrix. Quick scale: about 3 minutes of 2 idle CPU cores
beyond tail_lm's runs (3 grid runs, one 3-seed engine run, two 3-seed plain runs).
"""

from __future__ import annotations

from ml_collections import ConfigDict

from experiments.configs import new_config, tail_lm
from experiments.configs.tail_lm import SEEDS, base_lm


def get_config(scale: str = "quick") -> ConfigDict:
    """The normuon experiment config; ``ValueError`` if ``scale`` is not one of ``SCALES``."""
    c, _ = new_config(scale)
    c.base = base_lm(scale)
    c.seeds = SEEDS  # held-out initialisation seeds (vmapped; same data order)
    grid = tail_lm.get_config(scale).lr_grid  # tail_lm's grids; NorMuon on Muon's
    c.lr_grid = ConfigDict({"adam": grid.adam, "muon": grid.muon, "normuon": grid.muon})
    c.muon_roles = "hidden"  # roles given to Muon / NorMuon (Adam elsewhere)
    c.log_every = 10  # steps between records of the update's neuron-norm statistics
    return c
