"""Parameter roles of :mod:`amemory.models.transformer`, read from parameter paths.

Every trainable parameter has one role from :data:`ROLES` (the vocabulary, defined once,
here; :data:`GROUPS` names sets of roles for routing specs):

* ``q, k, v, o``: multi-head attention kernels; ``w_in, w_gate, w_out``: dense FFN kernels;
* ``q_down, q_up, q_rope, kv_down, k_up, v_up, k_rope`` (and ``q``, ``o``): multi-head
  latent attention (:mod:`amemory.models.attention`);
* ``router``; ``expert_w_in, expert_w_gate, expert_w_out`` (stacked ``[E, ...]``);
  ``shared_w_in, shared_w_gate, shared_w_out``: mixture of experts (:mod:`amemory.models.moe`);
* ``embed`` (token and learned-position tables), ``head`` (untied output kernel),
  ``norm`` (normalisation scales and biases), ``bias`` (biases of Linear layers),
  ``dense`` (a Linear kernel whose place the path does not tell: foreign models).

Paths are matched on their module names, never on the layer index (``layers/3/attn/v/kernel``
and the scanned ``layers/attn/v/kernel`` both read ``v``). :data:`role_of` is an
``amemory.optim.routing.Roles`` with this vocabulary, directly a ``role_fn`` for
``amemory.optim.routed``; a path it cannot classify is a ValueError.
"""

from __future__ import annotations

from typing import Any

import jax

from amemory.optim import Roles, path_keys

ATTN_ROLES = ("q", "k", "v", "o")
MLA_ROLES = ("q", "q_down", "q_up", "q_rope", "kv_down", "k_up", "v_up", "k_rope", "o")
FFN_ROLES = ("w_in", "w_gate", "w_out")
MOE_ROLES = ("router",) + tuple(f"expert_{r}" for r in FFN_ROLES)
MOE_ROLES += tuple(f"shared_{r}" for r in FFN_ROLES)
# The vocabulary. Adding a role is one entry here or above; a group, one entry of GROUPS.
ROLES: tuple[str, ...] = ATTN_ROLES + FFN_ROLES + ("dense", "embed", "head", "norm", "bias")
ROLES += MLA_ROLES[1:-1] + MOE_ROLES
_QK = ("q", "k", "q_down", "q_up", "q_rope", "kv_down", "k_up", "k_rope")
_VO = ("v", "o", "v_up")
_FFN = FFN_ROLES + MOE_ROLES[1:]
# qk: query/key paths (MLA's kv_down feeds keys and values; it is counted with qk);
# vo: value/output; ffn: dense, routed-expert and shared-expert FFN matrices; hidden:
# all of them. The MoE router is in no group: it goes to the "rest" rule (Adam).
GROUPS: dict[str, tuple[str, ...]] = {
    "qk": _QK,
    "vo": _VO,
    "ffn": _FFN,
    "hidden": _QK + _VO + _FFN + ("dense",),
    "none": (),
}
# Matrices of the blocks (every role but embeddings, head, norms, biases and the router).
HIDDEN_ROLES = tuple(r for r in GROUPS["hidden"] if r != "dense")
_NORM_MODULES = ("attn_norm", "mlp_norm", "final_norm", "q_norm", "k_norm")
_EMBED_MODULES = ("embed", "pos_embed")
# Block-level paths (after "layers/<i>/" or "layers/") -> role of the kernel; the
# matching "bias" leaf of the same Linear has role "bias".
_KERNELS: dict[tuple[str, ...], str] = {
    **{("attn", r): r for r in set(ATTN_ROLES + MLA_ROLES)},
    **{("mlp", r): r for r in FFN_ROLES},
    ("mlp", "router"): "router",
    **{("mlp", "shared", r): f"shared_{r}" for r in FFN_ROLES},
}
# Stacked expert leaves: a bare Param named by its FFN role (no "kernel" level).
_STACKED: dict[tuple[str, ...], str] = {("mlp", "experts", r): f"expert_{r}" for r in FFN_ROLES}


def _normalise_path(path: Any) -> tuple[str | int, ...]:
    """``amemory.optim.path_keys`` (nnx ``value`` keys dropped) with digit strings as ints."""
    keys = path_keys(tuple(path.split("/") if isinstance(path, str) else path))
    return tuple(int(k) if isinstance(k, int) or k.isdigit() else k for k in keys)


def _role_of(path: Any, leaf: Any = None) -> str:
    """The role of a parameter from its path.

    Args:
      path: a tuple of keys such as ``("layers", 3, "attn", "v", "kernel")`` (ints or digit
        strings for list indices; ``jax.tree_util`` key paths, ``nnx.state`` ones included),
        or the string ``"layers/3/attn/v/kernel"``; the layer index may be absent (scanned
        layers: ``"layers/attn/v/kernel"``).
      leaf: ignored (``role_of`` is directly a ``role_fn(path, leaf)``).

    Returns one of :data:`ROLES`; raises ``ValueError`` if the path is not a parameter of
    :class:`Transformer`.
    """
    p = _normalise_path(path)
    bad = ValueError(f"cannot classify parameter path {'/'.join(map(str, p))!r}; roles: {ROLES}")
    if len(p) < 2 or not isinstance(p[-1], str):
        raise bad
    leaf, module = p[-1], p[-2]
    if any(m in _NORM_MODULES for m in p[:-1]) and leaf in ("scale", "bias"):
        if module in _NORM_MODULES:
            return "norm"
        raise bad
    if len(p) == 2 and module in _EMBED_MODULES and leaf == "embedding":
        return "embed"
    if len(p) == 2 and module == "head" and leaf in ("kernel", "bias"):
        return "head" if leaf == "kernel" else "bias"
    if p[0] != "layers":
        raise bad
    block = p[2:] if len(p) > 1 and isinstance(p[1], int) else p[1:]
    if any(not isinstance(s, str) for s in block):
        raise bad
    if block in _STACKED:
        return _STACKED[block]
    if block[:-1] in _KERNELS and leaf == "kernel":
        return _KERNELS[block[:-1]]
    if block[:-1] in _KERNELS and leaf == "bias" and block[-2] != "router":
        return "bias"
    raise bad


role_of = Roles(_role_of, ROLES, GROUPS)


def param_roles(params: Any) -> Any:
    """Same-structure pytree of role strings for every leaf of ``params`` (seed axes too:
    roles depend only on paths). Raises ``ValueError`` naming the first leaf without one."""
    return jax.tree_util.tree_map_with_path(role_of, params)


def matrix_axes(path: Any, leaf: Any = None) -> tuple[int, int] | None:
    """Matrix axes ``(fan_in_axis, fan_out_axis)`` of a parameter, for Muon's ``matrix_axes``.

    Kernels and embedding tables are matrices in their last two axes ``[..., fan_in,
    fan_out]``; leading axes (layers ``[L]`` stacked, experts ``[E]``) are batch axes, so
    each layer's (and expert's) matrix is orthogonalised on its own. Norm scales and biases
    are not matrices (None), even when stacked to ``[L, D]``.

    ``path`` as for :func:`role_of`; ``leaf`` ignored (the callable form of Muon's
    ``matrix_axes``). Raises ``ValueError`` if the path is not a Transformer parameter.
    """
    del leaf
    return None if role_of(path) in ("norm", "bias") else (-2, -1)
