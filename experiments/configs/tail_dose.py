"""Config of ``experiments/tail_dose.py``: Muon's lead over Adam against tail heaviness.

Launch::

    python -m experiments.tail_dose --scale quick --out runs/tail_dose

Two legs, each holding model, steps, batch (so tokens) and facts fixed while only the
frequency law moves:

* ``qa``: the biography QA of tail_qa (``amemory.data.biographies``) with the selection
  law S_g = round(2^(alpha (m-g))) (frequency ∝ rank^-alpha over the same 2^m people and
  attributes; alpha = 1 is paper A's law, 0 uniform). Quick: m = 6 (64 people), a
  2-layer d=64 decoder, batch 16, 200 steps.
* ``lm``: tail_lm's quick model on Shakespeare with a BPE vocabulary of ``vocabs`` tokens
  (a larger vocabulary has a heavier token tail; same text, same steps x 16 x 64 tokens).
  These are steps_ratio's vocabulary sizes, so their Adam and Muon runs are shared.

Per point: Adam, Muon and SignGD (hidden matrices; Adam elsewhere) learning rates chosen
on a grid by seed 0 (QA: final training loss; LM: final validation loss), then trained on
the held-out seeds ``seeds`` (vmapped).
Full scale: the qa leg at tail_qa's quick size (m = 8, d=128, batch 32, 300 steps) with a
finer alpha grid, the lm leg unchanged.
"""

from __future__ import annotations

from ml_collections import ConfigDict

from experiments.configs import SCALES as SCALES
from experiments.configs import new_config
from experiments.configs.tail_lm import SEEDS, base_lm
from experiments.configs.tail_qa import base_bio


def get_config(scale: str = "quick") -> ConfigDict:
    """Return the tail_dose config.

    Raises:
      ValueError: if ``scale`` is not one of ``SCALES``.
    """
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
    # qa leg: Adam and SignGD one step higher (on tail_qa's grid both chose its top edge)
    c.qa_lr_grid = ConfigDict({"adam": (3e-3, 1e-2, 3e-2), "muon": (0.01, 0.02, 0.05),
                               "signgd": (1e-3, 3e-3, 1e-2)})  # fmt: skip
    return c
