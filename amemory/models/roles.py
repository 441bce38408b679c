"""Parameter roles of :mod:`amemory.models.transformer`, read from parameter paths.

The role vocabulary (:data:`ROLES`, groups) is ``amemory.optim.routing``'s, defined
there once; this module only classifies paths. Every trainable parameter of the
transformer has one role: ``q, k, v, o``
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

from amemory.optim import GROUPS, ROLES, path_keys

ATTN_ROLES = GROUPS["qk"] + GROUPS["vo"]
FFN_ROLES = GROUPS["ffn"]
_NORM_MODULES = ("attn_norm", "mlp_norm", "final_norm", "q_norm", "k_norm")
_EMBED_MODULES = ("embed", "pos_embed")


def _key_name(entry: Any) -> str | int:
    if isinstance(entry, str) and entry.isdigit():
        return int(entry)
    if isinstance(entry, (int, np.integer)) and not isinstance(entry, bool):
        return int(entry)
    if isinstance(entry, str):
        return entry
    raise ValueError(f"unrecognised path entry {entry!r}")


def _normalise_path(path: Any) -> tuple[str | int, ...]:
    """Path keys, with ``amemory.optim``'s normalisation (nnx ``value`` keys dropped)."""
    if isinstance(path, str):
        path = path.split("/")
    return tuple(_key_name(p) for p in path_keys(tuple(path)))


def role_of(path: Any, leaf: Any = None) -> str:
    """The role of a parameter from its path.

    Args:
      path: a tuple of keys such as ``("layers", 3, "attn", "v", "kernel")`` (ints or digit
        strings for list indices; ``jax.tree_util`` key entries are accepted, so this works
        inside ``tree_map_with_path``, also on ``nnx.state(model)`` whose paths end in an
        ``nnx.Variable``'s ``value`` key), or the string ``"layers/3/attn/v/kernel"``.
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
    if len(p) == 5 and p[0] == "layers" and isinstance(p[1], int):
        parent_ok = (p[2] == "attn" and module in ATTN_ROLES) or (
            p[2] == "mlp" and module in FFN_ROLES
        )
        if parent_ok and leaf == "kernel":
            return module
        if parent_ok and leaf == "bias":
            return "bias"
    raise bad


def param_roles(params: Any) -> Any:
    """Same-structure pytree of role strings for every leaf of ``params``.

    Suitable as ``role_fn`` source for ``amemory.optim.routing``; works on params with a
    leading seed axis too (roles depend only on paths).

    Raises:
      ValueError: naming the first leaf whose role cannot be determined.
    """
    return jax.tree_util.tree_map_with_path(role_of, params)
