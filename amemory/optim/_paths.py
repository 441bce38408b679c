"""Pytree key paths as plain tuples / strings (shared by muon, routing, diagnostics)."""

from __future__ import annotations

from typing import Any

import jax

__all__ = ["path_keys", "path_str"]


def path_keys(path: tuple[Any, ...]) -> tuple[str | int, ...]:
    """Turn a jax key path into a tuple of ``str`` / ``int`` keys.

    ``DictKey("w") -> "w"``, ``SequenceKey(3) -> 3``, ``GetAttrKey("mu") -> "mu"``,
    ``FlattenedIndexKey(i) -> i``; anything else -> ``str(key)``.
    """
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
    return tuple(out)


def path_str(path: tuple[Any, ...]) -> str:
    """``("layers", 0, "attn", "q", "kernel") -> "layers/0/attn/q/kernel"`` (root -> ``"."``)."""
    return "/".join(str(k) for k in path_keys(path)) or "."
