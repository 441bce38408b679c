"""amemory.optim: Muon family, SignGD and role routing as pure Optax transformations.

Imports nothing of amemory outside this package. See ``orthogonalize`` for the
matrix kernels (Newton-Schulz, exact polar), ``muon`` for the optimizers,
``sign`` for SignGD/Signum, ``routing`` for role-based partitioning and
``presets`` for peer-faithful Muon settings.
"""

from amemory.optim.orthogonalize import (
    COEFFICIENT_SETS,
    coefficient_table,
    newton_schulz,
    orthogonality_error,
    polar,
    singular_value_range,
)
from amemory.optim.sign import signgd, signum

__all__ = [
    "COEFFICIENT_SETS",
    "coefficient_table",
    "newton_schulz",
    "orthogonality_error",
    "polar",
    "signgd",
    "signum",
    "singular_value_range",
]
