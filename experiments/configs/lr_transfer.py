"""Config of ``experiments/lr_transfer.py``: the optimal learning rate against width.

Launch (CPU hours; not in ``amemory reproduce``'s default job; docs/lr-transfer.md)::

    python -m experiments lr_transfer --scale quick --out runs/lr_transfer

tail_lm's quick model (2 layers, heads of 32, d_ff = 4d, 512-token BPE on Shakespeare,
300 steps of 16 x 64 tokens) at widths 64-512; a 7-point factor-2 grid per optimizer.
Full scale: 5 held-out seeds instead of 3.
"""

from __future__ import annotations

from ml_collections import ConfigDict

from experiments.configs import new_config, tail_lm


def get_config(scale: str = "quick") -> ConfigDict:
    """The lr_transfer config; ``ValueError`` if ``scale`` is not one of ``SCALES``."""
    c, quick = new_config(scale)
    c.base = tail_lm.base_lm("quick")
    c.widths = (64, 128, 256, 512)  # d_model; depth, head width and d_ff / d fixed
    c.base_width, c.test_width = 64, 512  # the rate is transferred from base to test width
    # label -> NAME[:FIELD=VALUE,...] (optimizer.name and optimizer.* fields, as `amemory
    # coordcheck --variant`); a new parametrization joins here by its config fields
    c.optimizers = ConfigDict(
        {"adam": "adam", "muon": "muon:shape_scale=spectral", "signgd": "signgd"}
    )
    c.lr_grid = ConfigDict({  # peak rates of the cosine schedule: 7 points, factor 2
        "adam": tuple(3e-3 * 2.0**k for k in range(-3, 4)),
        "muon": tuple(0.02 * 2.0**k for k in range(-3, 4)),
        "signgd": tuple(1e-3 * 2.0**k for k in range(-3, 4)),
    })  # fmt: skip
    c.max_extend = 3  # grid points added beyond an edge that holds the best rate
    c.seeds = tail_lm.SEEDS if quick else (1, 2, 3, 4, 5)  # held-out initialisation seeds
    c.half_threshold = 0.6  # claim (c): "about half the steps" = a ratio below this
    return c
