"""Read the diagnostics that Muon-family states keep (``diagnostics=True``).

Sources: none beyond amemory's own definitions (``orthogonalize.orthogonality_error``).
"""

from __future__ import annotations

from typing import Any

import jax

from amemory.optim._paths import path_str

__all__ = ["collect_diagnostics"]


def _is_family_state(x: Any) -> bool:
    """A Muon-family state: a NamedTuple with ``count``, ``mu`` and ``diagnostics`` fields."""
    fields = getattr(type(x), "_fields", ())
    return isinstance(x, tuple) and {"count", "mu", "diagnostics"} <= set(fields)


def collect_diagnostics(opt_state: Any) -> dict[str, jax.Array]:
    """Flatten the diagnostics stored in every Muon-family state inside ``opt_state``.

    Walks any nesting (``chain``, ``partition``/``routed``, ``inject_hyperparams``) and
    returns ``{"ortho_error/<leaf path>": [] float32, "update_rms/<leaf path>": ...}`` for
    every matrix leaf whose transform has ``diagnostics=True`` (empty if none): the
    orthogonality error (``orthogonalize.orthogonality_error``, averaged over batch axes)
    of the direction before any scaling, and the RMS of the transform's output (before
    learning rate and weight decay).
    """
    out: dict[str, jax.Array] = {}
    nodes = jax.tree_util.tree_flatten_with_path(opt_state, is_leaf=_is_family_state)[0]
    for _, node in nodes:
        if not _is_family_state(node) or node.diagnostics is None:
            continue
        for name, tree in node.diagnostics.items():
            for path, value in jax.tree_util.tree_flatten_with_path(tree)[0]:
                out[f"{name}/{path_str(path)}"] = value
    return out
