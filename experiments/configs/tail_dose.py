"""Config of ``experiments/tail_dose.py``: Muon's lead over Adam against tail heaviness.

Launch: ``python -m experiments tail_dose --scale quick --out runs/tail_dose``.
The lm leg runs tail_lm's quick model at steps_ratio's vocabulary sizes (their Adam and
Muon runs are the same runs). Full: the qa leg at tail_qa's quick size; the lm leg
unchanged.
"""

from __future__ import annotations

from ml_collections import ConfigDict

from experiments.configs import new_config
from experiments.configs.tail_lm import SEEDS, base_lm
from experiments.configs.tail_qa import base_bio


def get_config(scale: str = "quick") -> ConfigDict:
    """The tail_dose config; ``ValueError`` if ``scale`` is not one of ``SCALES``."""
    c, quick = new_config(scale)
    c.legs = ("qa", "lm")
    c.optimizers = ("adam", "muon", "signgd")  # Adam first: its LR is the others' Adam half
    c.seeds = SEEDS
    c.qa_base = base_bio("quick")
    if quick:
        c.qa_base.data.biographies.m = 6
        c.qa_base.data.biographies.eval_per_group = 192  # every question of every person
        c.qa_base.data.batch_size = 16
        c.qa_base.model.update(d_model=64, n_heads=2, d_ff=256)
        c.qa_base.steps, c.qa_base.eval_every, c.qa_base.schedule.warmup_steps = 200, 25, 20
    c.qa_base.data.biographies.zipf = 1.0  # replaced by each alpha
    c.alphas = (0.0, 0.5, 1.0, 1.5) if quick else (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5)
    c.lm_base = base_lm("quick")  # tail_lm's quick model at every vocabulary
    c.vocabs = (512, 2048, 8192)
    c.lr_grid = ConfigDict()  # peak LR of the cosine schedule, per optimizer (lm leg:
    c.lr_grid.adam = (1e-3, 3e-3, 1e-2)  # steps_ratio's and tail_lm's grids)
    c.lr_grid.muon = (0.01, 0.02, 0.05)
    c.lr_grid.signgd = (3e-4, 1e-3, 3e-3)
    # Points trained at stated rates instead of a grid ("alpha<x>" / "V<v>" -> rates): V=512's
    v512 = {"adam": 3e-3, "muon": 0.02, "signgd": 1e-3}
    c.given_lr = ConfigDict({"V2048": v512, "V8192": v512} if quick else {})
    # qa leg: Adam and SignGD one step higher than tail_qa's (its top edge was chosen)
    c.qa_lr_grid = ConfigDict({"adam": (1e-3, 3e-3, 1e-2, 3e-2), "muon": (0.01, 0.02, 0.05),
                               "signgd": (1e-3, 3e-3, 1e-2)})  # fmt: skip
    return c
