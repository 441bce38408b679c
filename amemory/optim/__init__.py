"""amemory.optim: Muon family, SignGD and role routing as pure Optax transformations.

Imports nothing of amemory outside this package (and nothing of Flax).

- ``orthogonalize``: matrix kernels (Newton-Schulz, exact polar factor, norm-ball LMOs,
  orthogonality error, singular-value range).
- ``muon``: ``scale_by_muon``/``muon``; ``MuonOptions`` holds every option of the family.
- ``normuon``: NorMuon (per-neuron second moment) and AdaMuon (per-entry).
- ``hyperball``: MuonH and AdamH (fixed-norm weights); ``qk_clip``: QK-Clip (MuonClip).
- ``contrib``: a drop-in for ``optax.contrib.muon`` on amemory's kernels.
- ``sign``: ``signgd``, ``signum``. Adam is ``optax.adam``/``optax.adamw``.
- ``distributed``: the owner layout for parameters sharded over a device mesh.
- ``routing``: roles -> transforms (``routed``, ``routing_table``), model-agnostic;
  ``nnx_roles``: roles and matrix axes of standard ``flax.nnx`` layers.
- ``presets``: peer-faithful Muon settings (``muon(lr, preset=NAME)``);
  ``diagnostics``: ``collect_diagnostics``.
- private: ``_muon_core`` (options, shared update steps), ``_matrices`` (matrix stacks,
  the orthogonalisation dispatcher), ``_chain`` (decay and lr), ``_paths`` (paths).
"""

from collections.abc import Callable
from typing import NamedTuple

import optax

from amemory.optim import contrib
from amemory.optim._chain import decoupled, sgd
from amemory.optim._matrices import matrix_layout
from amemory.optim._muon_core import (
    MOMENTUM_FORMS,
    NUCLEAR_SCALES,
    ORTHOGONALIZERS,
    SHAPE_SCALES,
    MuonOptions,
    shape_scale_factor,
)
from amemory.optim._paths import path_keys, path_str
from amemory.optim.diagnostics import collect_diagnostics
from amemory.optim.distributed import (
    DISTRIBUTED_MODES,
    OwnerStacks,
    describe_layout,
    owner_state_shardings,
)
from amemory.optim.hyperball import adamh, muonh, scale_by_hyperball
from amemory.optim.muon import MuonState, muon, scale_by_muon
from amemory.optim.nnx_roles import (
    HEAD_NAMES,
    NnxLayers,
    nnx_layers,
    nnx_matrix_axes,
    nnx_per_head_matrix_axes,
    nnx_role,
)
from amemory.optim.normuon import (
    AdaMuonState,
    NorMuonState,
    adamuon,
    normuon,
    scale_by_adamuon,
    scale_by_normuon,
)
from amemory.optim.orthogonalize import (
    COEFFICIENT_SETS,
    NORMS,
    NS_METHODS,
    PRECONDITIONINGS,
    coefficient_table,
    newton_schulz,
    norm_ball_lmo,
    orthogonality_error,
    polar,
    singular_value_range,
)
from amemory.optim.presets import PRESETS, preset_options
from amemory.optim.qk_clip import qk_clip
from amemory.optim.routing import (
    REST,
    Roles,
    RoutingRow,
    format_routing_table,
    label_params,
    parse_roles,
    parse_spec,
    routed,
    routing_table,
)
from amemory.optim.sign import signgd, signum


class OptimizerInfo(NamedTuple):
    """One row of :data:`OPTIMIZERS`."""

    factory: Callable[..., optax.GradientTransformation]  # (lr, *, weight_decay, **options)
    default_lr: float  # a starting peak learning rate, not a tuned optimum
    orthogonalizes: bool = False  # matrix leaves only; takes matrix_axes, ns_mesh, diagnostics
    normalizes: bool = False  # a second moment after orthogonalising (owner stacks by orientation)
    options: tuple[str, ...] = ()  # keyword options a run config passes (amemory.train)


_MUON_OPTIONS = ("momentum", "nesterov", "orthogonalizer", "ns_steps", "ns_dtype")

#: The optimizers by name; ``amemory.train`` derives its names, default learning rates and
#: orthogonalising set from it. Default learning rates: Muon Keller Jordan's 0.02; AdaMuon
#: (update RMS 0.2), SignGD and Signum an Adam-like step; SGD a heavy-ball step.
OPTIMIZERS: dict[str, OptimizerInfo] = {
    "muon": OptimizerInfo(muon, 0.02, True, False, ("preset", *_MUON_OPTIONS, "shape_scale")),
    "normuon": OptimizerInfo(normuon, 0.02, True, True, (*_MUON_OPTIONS, "shape_scale")),
    "adamuon": OptimizerInfo(adamuon, 3e-3, True, True, _MUON_OPTIONS),
    "signgd": OptimizerInfo(signgd, 1e-3),
    "signum": OptimizerInfo(signum, 1e-3, options=("beta",)),
    "sgd": OptimizerInfo(sgd, 0.05, options=("momentum", "nesterov")),
    # Hyperball: lr is the step as a fraction of each matrix's (fixed) norm
    "muonh": OptimizerInfo(muonh, 0.05, True, False, _MUON_OPTIONS),
    "adamh": OptimizerInfo(adamh, 0.05, options=("b1", "b2", "eps")),
}

__all__ = [
    "COEFFICIENT_SETS", "DISTRIBUTED_MODES", "HEAD_NAMES", "MOMENTUM_FORMS", "NORMS", "NS_METHODS",
    "NUCLEAR_SCALES", "OPTIMIZERS", "OptimizerInfo", "ORTHOGONALIZERS", "PRECONDITIONINGS",
    "PRESETS", "REST", "Roles", "SHAPE_SCALES", "AdaMuonState", "MuonOptions", "MuonState",
    "NnxLayers", "NorMuonState", "OwnerStacks", "RoutingRow", "adamh", "adamuon",
    "coefficient_table", "collect_diagnostics", "contrib", "decoupled", "describe_layout",
    "format_routing_table", "label_params", "matrix_layout", "muon", "muonh", "newton_schulz",
    "nnx_layers", "nnx_matrix_axes", "nnx_per_head_matrix_axes", "nnx_role", "norm_ball_lmo",
    "normuon", "orthogonality_error", "owner_state_shardings", "parse_roles", "parse_spec",
    "path_keys", "path_str", "polar", "preset_options", "routed", "routing_table", "qk_clip",
    "scale_by_adamuon", "scale_by_hyperball", "scale_by_muon", "scale_by_normuon", "sgd",
    "shape_scale_factor", "signgd", "signum", "singular_value_range",
]  # fmt: skip
