"""Pytree key paths as plain tuples / strings: the one place parameter paths are normalised.

``flax.nnx.Optimizer`` calls ``tx.init`` on ``nnx.state(model)``, whose key paths end in
an attribute key ``value`` (``l1/kernel/value``), and ``tx.update`` on pure arrays
(``l1/kernel``); :func:`path_keys` drops that key, so role and ``matrix_axes`` functions
see one path at both. Its entries are ``str`` / ``int`` keys (flax ``traverse_util``'s
form: ``path[-1] == "kernel"``) that also answer to ``jax.tree_util`` key entries'
``.key``, ``.name`` and, on indices, ``.idx``: a role function written for either works.
"""

from __future__ import annotations

from typing import Any

import jax

__all__ = ["path_keys", "path_str"]


class Key(str):
    """A ``str`` path entry that also reads as a ``DictKey`` / ``GetAttrKey`` (``.key``)."""

    key = name = property(str.__str__)


class Index(int):
    """An ``int`` path entry that also reads as a ``SequenceKey`` (``.idx``, ``.key``)."""

    idx = key = property(int.__int__)


def path_keys(path: tuple[Any, ...]) -> tuple[str | int, ...]:
    """Turn a jax key path into a tuple of ``str`` / ``int`` keys (:class:`Key` / :class:`Index`).

    ``DictKey("w") -> "w"``, ``SequenceKey(3) -> 3``, ``GetAttrKey("mu") -> "mu"``,
    ``FlattenedIndexKey(i) -> i``; anything else -> ``str(key)``. A trailing
    ``GetAttrKey("value")`` (the array inside an ``nnx.Variable``) is dropped.
    """
    last = path[-1] if path else None  # an nnx.Variable's array, not a dict key "value"
    if isinstance(last, jax.tree_util.GetAttrKey) and last.name == "value":
        path = path[:-1]
    out: list[str | int] = []
    for k in path:
        if isinstance(k, str | int):
            out.append(k)
        elif isinstance(k, jax.tree_util.DictKey):
            out.append(k.key if isinstance(k.key, int) else str(k.key))
        elif isinstance(k, jax.tree_util.SequenceKey):
            out.append(k.idx)
        elif isinstance(k, jax.tree_util.GetAttrKey):
            out.append(k.name)
        elif isinstance(k, jax.tree_util.FlattenedIndexKey):
            out.append(k.key)
        else:
            out.append(str(k))
    return tuple(Index(k) if isinstance(k, int) else Key(k) for k in out)


def path_str(path: tuple[Any, ...]) -> str:
    """``("layers", 0, "attn", "q", "kernel") -> "layers/0/attn/q/kernel"`` (root -> ``"."``)."""
    return "/".join(str(k) for k in path_keys(path)) or "."
