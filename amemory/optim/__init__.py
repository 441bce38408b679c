"""amemory.optim: Muon family, SignGD and role routing as pure Optax transformations.

Imports nothing of amemory outside this package.

- ``orthogonalize``: matrix kernels (Newton-Schulz coefficient sets, exact polar
  factor, orthogonality error, singular-value range).
- ``muon``: ``scale_by_muon``/``muon``, ``collect_diagnostics`` (also re-exports
  the NorMuon names).
- ``normuon``: ``scale_by_normuon``/``normuon`` (Muon plus per-neuron normalisation).
- ``_muon_core`` (private): the momentum -> orthogonalise -> shape-scale path that
  Muon and NorMuon share; ``_matrices`` (private): leaves as matrix stacks
  (``matrix_axes``), shape-grouped batched orthogonalisation, ``ns_mesh``.
- ``sign``: ``signgd``, ``signum``. Adam is ``optax.adam``/``optax.adamw``.
- ``distributed``: the owner layout for parameters sharded over a device mesh
  (``muon(..., ns_mesh=(mesh, "fsdp"))``: whole matrices per device, all-to-all in and
  out, no collective inside Newton-Schulz), ``describe_layout``,
  ``owner_state_shardings``.
- ``routing``: roles -> transforms (``routed``, ``label_params``, ``routing_table``).
- ``presets``: peer-faithful Muon settings (``muon(lr, preset=NAME)``).
"""

from amemory.optim.distributed import (
    DISTRIBUTED_MODES,
    OwnerStacks,
    describe_layout,
    owner_state_shardings,
)
from amemory.optim.muon import (
    MOMENTUM_FORMS,
    ORTHOGONALIZERS,
    SHAPE_SCALES,
    MuonState,
    collect_diagnostics,
    muon,
    scale_by_muon,
    shape_scale_factor,
)
from amemory.optim.normuon import NorMuonState, normuon, scale_by_normuon
from amemory.optim.orthogonalize import (
    COEFFICIENT_SETS,
    coefficient_table,
    newton_schulz,
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

__all__ = [
    "COEFFICIENT_SETS",
    "DISTRIBUTED_MODES",
    "GROUPS",
    "MOMENTUM_FORMS",
    "ORTHOGONALIZERS",
    "PRESETS",
    "REST",
    "ROLES",
    "SHAPE_SCALES",
    "MuonState",
    "NorMuonState",
    "OwnerStacks",
    "RoutingRow",
    "coefficient_table",
    "collect_diagnostics",
    "describe_layout",
    "format_routing_table",
    "label_params",
    "muon",
    "newton_schulz",
    "normuon",
    "orthogonality_error",
    "owner_state_shardings",
    "parse_spec",
    "polar",
    "preset_options",
    "routed",
    "routing_table",
    "scale_by_muon",
    "scale_by_normuon",
    "shape_scale_factor",
    "signgd",
    "signum",
    "singular_value_range",
]
