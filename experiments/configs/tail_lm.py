"""Config of ``experiments/tail_lm.py``: Muon vs Adam vs SignGD per token-frequency bucket.

Launch::

    python -m experiments tail_lm --scale quick --out runs/tail_lm

Quick scale: a small vocabulary so that the rare buckets recur often enough to be
learned in 300 steps. ``amemory reproduce`` drops SignGD (no claim rests on it). Full
scale: the ``small`` preset.

``base_lm(scale)`` is the transformer run config shared by tail_lm, ablation, isotropy
and scaling, so identical runs are trained once inside ``amemory reproduce``.
"""

from __future__ import annotations

from ml_collections import ConfigDict

from experiments.configs import check_scale, lm, new_config

#: Initialisation seeds of the compared runs (trained together), held out from the
#: learning-rate choice on ``base.seed``; every seed reads ``base.seed``'s data order.
SEEDS = (1, 2, 3)


def base_lm(scale: str = "quick") -> ConfigDict:
    """The LM run config (experiments/configs/lm.py) with this project's experiment sizes.

    Hyper-parameters follow paper A (Wang et al. 2025, arXiv 2509.26030) where it states
    them. ``ValueError`` if ``scale`` is not one of ``SCALES``.
    """
    quick = check_scale(scale)
    c = lm.get_config(scale)
    c.model.preset = "small"
    if quick:
        c.model.update(d_model=128, n_layers=2, n_heads=4, d_ff=512)
        c.data.update(vocab_size=512, seq_len=64, batch_size=16, eval_batches=8)
        c.schedule.warmup_steps = 30
        c.update(steps=300, eval_every=25, spectrum_every=25)  # isotropy reads the spectra
    else:
        c.data.update(vocab_size=8192, seq_len=128, batch_size=32, eval_batches=16)
        c.schedule.warmup_steps = 200
        c.update(steps=5000, eval_every=250, spectrum_every=500)
    c.data.n_buckets = 5
    c.optimizer.update(b1=0.8, b2=0.95, momentum=0.95, nesterov=False, weight_decay=0.0)
    c.checkpoint_every = 0  # only the final checkpoint
    c.keep_checkpoints = 1
    c.progress = False  # amemory reproduce shows one bar per stage instead
    c.seed = 0
    return c


def get_config(scale: str = "quick") -> ConfigDict:
    """The tail_lm experiment config; ``ValueError`` if ``scale`` is not one of ``SCALES``."""
    c, quick = new_config(scale)
    c.base = base_lm(scale)
    c.optimizers = ("adam", "muon", "signgd")  # Adam first: its chosen LR drives the Adam half
    # of the Muon / SignGD runs (embeddings, head, norms always Adam).
    c.muon_roles = "hidden"  # roles given to Muon / SignGD: q k v o w_in w_out (w_gate)
    c.seeds = SEEDS  # the compared runs' initialisation seeds (vmapped); () = base.seed only
    # Learning-rate grids (per step, peak of the cosine schedule); the lowest final
    # validation loss wins. Reported in the result with the chosen value.
    c.lr_grid = ConfigDict()
    c.lr_grid.adam = (1e-3, 3e-3, 1e-2) if quick else (3e-4, 1e-3, 3e-3, 1e-2)
    c.lr_grid.muon = (0.01, 0.02, 0.05) if quick else (0.005, 0.01, 0.02, 0.05)
    c.lr_grid.signgd = (3e-4, 1e-3, 3e-3) if quick else (1e-4, 3e-4, 1e-3, 3e-3)
    return c
