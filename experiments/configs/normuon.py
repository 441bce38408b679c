"""Config of ``experiments/normuon.py``: NorMuon's premise on the corpus LM.

Launch::

    python -m experiments normuon --scale quick --out runs/normuon
    amemory reproduce --only normuon

tail_lm's model, data, seeds and learning-rate grids (NorMuon on Muon's grid).
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
