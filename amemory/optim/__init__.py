"""amemory.optim: Muon family, SignGD and role routing as pure Optax transformations.

Imports nothing of amemory outside this package (and nothing of Flax).

- ``orthogonalize``: matrix kernels (Newton-Schulz with coefficient sets,
  pre-conditionings and the Gram form with restarts; exact polar factor; the LMOs of
  other norm balls; orthogonality error, singular-value range).
- ``muon``: ``scale_by_muon``/``muon``; ``MuonOptions`` (``_muon_core``) holds every
  option of the family once.
- ``normuon``: ``scale_by_normuon``/``normuon`` (per-neuron second moment) and
  ``scale_by_adamuon``/``adamuon`` (per-entry second moment).
- ``contrib``: a drop-in for ``optax.contrib.muon`` (same signature and state) on
  amemory's kernels.
- ``sign``: ``signgd``, ``signum``. Adam is ``optax.adam``/``optax.adamw``.
- ``distributed``: the owner layout for parameters sharded over a device mesh
  (``muon(..., ns_mesh=(mesh, "fsdp"))``: whole matrices per device, all-to-all in and
  out, no collective inside Newton-Schulz), ``describe_layout``,
  ``owner_state_shardings``.
- ``routing``: the role vocabulary (``ROLES``, ``GROUPS``) and roles -> transforms
  (``routed``, ``label_params``, ``routing_table``); ``nnx_roles``: roles and matrix
  axes of standard ``flax.nnx`` layers for foreign models.
- ``presets``: peer-faithful Muon settings (``muon(lr, preset=NAME)``).
- ``diagnostics``: ``collect_diagnostics`` (orthogonality error, update RMS).
- private: ``_muon_core`` (options and the shared update path), ``_matrices`` (leaves as
  matrix stacks, shape-grouped batched orthogonalisation, ``ns_mesh``), ``_chain``
  (``decoupled``: weight decay and learning rate after a direction), ``_paths`` (path
  normalisation; ``path_keys``/``path_str`` are public).
"""

from amemory.optim import contrib
from amemory.optim._chain import decoupled
from amemory.optim._muon_core import MuonOptions
from amemory.optim._paths import path_keys, path_str
from amemory.optim.diagnostics import collect_diagnostics
from amemory.optim.distributed import (
    DISTRIBUTED_MODES,
    OwnerStacks,
    describe_layout,
    owner_state_shardings,
)
from amemory.optim.muon import (
    MOMENTUM_FORMS,
    NUCLEAR_SCALES,
    ORTHOGONALIZERS,
    SHAPE_SCALES,
    MuonState,
    muon,
    scale_by_muon,
    shape_scale_factor,
)
from amemory.optim.nnx_roles import HEAD_NAMES, NnxLayers, nnx_layers, nnx_matrix_axes, nnx_role
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
from amemory.optim.routing import (
    GROUPS,
    REST,
    ROLES,
    RoutingRow,
    format_routing_table,
    label_params,
    parse_spec,
    routed,
    routing_table,
)
from amemory.optim.sign import signgd, signum

#: The optimizers of this package by name: name -> ``factory(learning_rate, *, weight_decay,
#: weight_decay_mask, ...)``. ``amemory.train`` derives its allowed optimizer names from it.
OPTIMIZERS = {
    "muon": muon,
    "normuon": normuon,
    "adamuon": adamuon,
    "signgd": signgd,
    "signum": signum,
}

__all__ = [
    "COEFFICIENT_SETS",
    "DISTRIBUTED_MODES",
    "GROUPS",
    "HEAD_NAMES",
    "MOMENTUM_FORMS",
    "NORMS",
    "NS_METHODS",
    "NUCLEAR_SCALES",
    "OPTIMIZERS",
    "ORTHOGONALIZERS",
    "PRECONDITIONINGS",
    "PRESETS",
    "REST",
    "ROLES",
    "SHAPE_SCALES",
    "AdaMuonState",
    "MuonOptions",
    "MuonState",
    "NnxLayers",
    "NorMuonState",
    "OwnerStacks",
    "RoutingRow",
    "adamuon",
    "coefficient_table",
    "collect_diagnostics",
    "contrib",
    "decoupled",
    "describe_layout",
    "format_routing_table",
    "label_params",
    "muon",
    "newton_schulz",
    "nnx_layers",
    "nnx_matrix_axes",
    "nnx_role",
    "norm_ball_lmo",
    "normuon",
    "orthogonality_error",
    "owner_state_shardings",
    "parse_spec",
    "path_keys",
    "path_str",
    "polar",
    "preset_options",
    "routed",
    "routing_table",
    "scale_by_adamuon",
    "scale_by_muon",
    "scale_by_normuon",
    "shape_scale_factor",
    "signgd",
    "signum",
    "singular_value_range",
]
