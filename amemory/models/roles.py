"""Parameter roles of :mod:`amemory.models.transformer`, read from parameter paths.

Every trainable parameter has one role from :data:`ROLES` (design.md): ``q, k, v, o``
(attention kernels), ``w_in, w_gate, w_out`` (FFN kernels), ``embed`` (token and
learned-position tables), ``head`` (untied output kernel), ``norm`` (normalisation
scales and biases), ``bias`` (biases of Linear layers). :func:`role_of` is directly a
``role_fn`` for ``amemory.optim.routing``; a path it cannot classify is a ValueError,
never a silent default.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

ROLES = ("q", "k", "v", "o", "w_in", "w_gate", "w_out", "embed", "head", "norm", "bias")
ATTN_ROLES = ("q", "k", "v", "o")
FFN_ROLES = ("w_in", "w_gate", "w_out")
_NORM_MODULES = ("attn_norm", "mlp_norm", "final_norm", "q_norm", "k_norm")
_EMBED_MODULES = ("embed", "pos_embed")


def _key_name(entry: Any) -> str | int:
    for attr in ("key", "idx", "name"):
        if hasattr(entry, attr):
            entry = getattr(entry, attr)
            break
    if isinstance(entry, str) and entry.isdigit():
        return int(entry)
    if isinstance(entry, (int, np.integer)) and not isinstance(entry, bool):
        return int(entry)
    if isinstance(entry, str):
        return entry
    raise ValueError(f"unrecognised path entry {entry!r}")


def _normalise_path(path: Any) -> tuple[str | int, ...]:
    if isinstance(path, str):
        path = path.split("/")
    return tuple(_key_name(p) for p in path)


def role_of(path: Any, leaf: Any = None) -> str:
    """The role of a parameter from its path.

    Args:
      path: a tuple of keys such as ``("layers", 3, "attn", "v", "kernel")`` (ints or digit
        strings for list indices; ``jax.tree_util`` key entries are accepted, so this works
        inside ``tree_map_with_path``), or the string ``"layers/3/attn/v/kernel"``. The
        stacked layout of ``scan_layers=True`` (``"layers/attn/v/kernel"``, leaf
        ``[L, D, D]``) has the same roles: the layer index is not read.
      leaf: ignored; accepted so that ``role_of`` is directly a ``role_fn(path, leaf)`` for
        ``amemory.optim.routing``.

    Returns:
      one of :data:`ROLES`: ``q, k, v, o`` (attention kernels), ``w_in, w_gate, w_out``
      (FFN kernels), ``embed`` (token and learned-position tables), ``head`` (untied output
      kernel), ``norm`` (every parameter of a normalisation layer, scales and LayerNorm
      biases), ``bias`` (biases of Linear layers).

    Raises:
      ValueError: if the path is not a parameter of :class:`Transformer`.
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
    block = _block_path(p)
    if block is not None and len(block) == 3:
        group = block[0]
        parent_ok = (group == "attn" and module in ATTN_ROLES) or (
            group == "mlp" and module in FFN_ROLES
        )
        if parent_ok and leaf == "kernel":
            return module
        if parent_ok and leaf == "bias":
            return "bias"
    raise bad


def _block_path(p: tuple[str | int, ...]) -> tuple[str | int, ...] | None:
    """The path inside a block: ``layers/3/attn/q/kernel`` (per-layer layout) and
    ``layers/attn/q/kernel`` (stacked layout, leading ``[L]`` axis) both give
    ``("attn", "q", "kernel")``; None outside ``layers``."""
    if len(p) < 2 or p[0] != "layers":
        return None
    return p[2:] if isinstance(p[1], int) else p[1:]


def param_roles(params: Any) -> Any:
    """Same-structure pytree of role strings for every leaf of ``params``.

    Suitable as ``role_fn`` source for ``amemory.optim.routing``; works on params with a
    leading seed axis too (roles depend only on paths).

    Raises:
      ValueError: naming the first leaf whose role cannot be determined.
    """
    return jax.tree_util.tree_map_with_path(role_of, params)


def matrix_axes(path: Any, leaf: Any = None) -> tuple[int, int] | None:
    """Matrix axes ``(fan_in_axis, fan_out_axis)`` of a parameter, for Muon's ``matrix_axes``.

    Kernels and embedding tables are matrices in their last two axes ``[..., fan_in,
    fan_out]``; any leading axis (the layer axis ``[L]`` of the stacked layout) is a batch
    axis, so each layer's matrix is orthogonalised on its own. Norm scales and biases are
    not matrices (None), even when stacked to ``[L, D]``; routing one to Muon is an error
    raised by ``amemory.optim`` with the leaf's path.

    Args:
      path: a parameter path, as for :func:`role_of`.
      leaf: ignored (the callable form of ``amemory.optim``'s ``matrix_axes``).

    Raises:
      ValueError: if the path is not a parameter of the Transformer.
    """
    del leaf
    return None if role_of(path) in ("norm", "bias") else (-2, -1)
