"""Hyperball (MuonH, AdamH): weights and updates at fixed Frobenius norms, no weight decay.

Per matrix ``W`` (each layer and expert of a stack on its own, never one norm across
them: Marin #8621), with ``R = ||W_0||_F`` fixed at ``init`` and ``u`` the base optimizer's
direction: ``W <- R normalize(W - lr R normalize(u))``, ``normalize(x) = x / ||x||_F``, so
``lr`` is the angular step. Source: Wen et al., arXiv 2606.16899 (full text not reachable
here, so no equation numbers: the rule follows the authors' announcement and NVIDIA
Emerging-Optimizers' ``MuonHyperball``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from amemory.optim._matrices import MatrixAxes, leaf_layouts
from amemory.optim.distributed import auto_sharded
from amemory.optim.muon import scale_by_muon

__all__ = ["HyperballState", "adamh", "muonh", "scale_by_hyperball"]


class HyperballState(NamedTuple):
    count: jax.Array  # [] int32, steps taken (for a learning-rate schedule)
    radius: Any  # tree like params, each [batch, 1, 1] float32: ||W_0||_F per matrix


def _frobenius(m: jax.Array) -> jax.Array:
    return jnp.sqrt(jnp.sum(jnp.square(m), axis=(1, 2), keepdims=True))  # [batch, 1, 1]


def scale_by_hyperball(
    learning_rate: optax.ScalarOrSchedule, *, matrix_axes: MatrixAxes = None, eps: float = 1e-8
) -> optax.GradientTransformation:
    """The Hyperball step after a direction (the update moves ``W`` onto its sphere).

    Args:
      learning_rate: float or schedule: the update's norm as a fraction of ``R``.
      matrix_axes: ``amemory.optim.muon``'s rule; batch axes (and the heads of a per-head
        view) keep their own radius.
      eps: floor of the norms divided by (a zero direction leaves ``W`` unchanged).

    Raises:
      ValueError: a leaf that is not a matrix under ``matrix_axes``, a zero-norm matrix at
        ``init``, or ``params=None`` at ``update``.
    """

    def matrices(tree):
        leaves, treedef, lays = leaf_layouts(tree, matrix_axes)
        mats = [lay.to_matrix(x).astype(jnp.float32) for x, lay in zip(leaves, lays, strict=True)]
        return treedef, lays, mats

    def init_fn(params):
        treedef, _, ws = matrices(params)
        radius = [_frobenius(w) for w in ws]
        if any(not isinstance(r, jax.core.Tracer) and not bool(jnp.all(r > 0)) for r in radius):
            raise ValueError("hyperball: a matrix has zero Frobenius norm at init (radius 0)")
        return HyperballState(jnp.zeros([], jnp.int32), treedef.unflatten(radius))

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("hyperball: update needs params (the weights are projected)")
        lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
        treedef, lays, us = matrices(updates)
        ws, radius = matrices(params)[2], treedef.flatten_up_to(state.radius)
        out = []
        for u, w, r, lay, p in zip(us, ws, radius, lays, jax.tree.leaves(params), strict=True):
            moved = w - lr * r * u / jnp.maximum(_frobenius(u), eps)
            new = r * moved / jnp.maximum(_frobenius(moved), eps)
            out.append(lay.from_matrix(new - w).astype(p.dtype))
        return treedef.unflatten(out), state._replace(count=optax.safe_increment(state.count))

    return auto_sharded(optax.GradientTransformation(init_fn, update_fn))


def _no_decay(weight_decay: Any) -> None:
    if weight_decay:
        raise ValueError(f"weight_decay={weight_decay!r}: Hyperball has none (set it to 0)")


def muonh(
    learning_rate: optax.ScalarOrSchedule, *, weight_decay: Any = 0.0, **options: Any
) -> optax.GradientTransformation:
    """MuonH: :func:`amemory.optim.scale_by_muon` (``options``: ``MuonOptions`` fields), then
    :func:`scale_by_hyperball` on Muon's ``matrix_axes``; the shape scale cancels out.

    Raises:
      ValueError: a non-zero ``weight_decay``, or a bad Muon option.
    """
    _no_decay(weight_decay)
    tx = scale_by_muon(**options)
    return optax.chain(
        tx, scale_by_hyperball(learning_rate, matrix_axes=options.get("matrix_axes"))
    )


def adamh(
    learning_rate: optax.ScalarOrSchedule, *, weight_decay: Any = 0.0, b1: float = 0.9,
    b2: float = 0.95, eps: float = 1e-8, matrix_axes: MatrixAxes = (-2, -1),
) -> optax.GradientTransformation:  # fmt: skip
    """AdamH: ``optax.scale_by_adam``, then :func:`scale_by_hyperball` (by default one
    radius per trailing 2-D matrix: leading axes, layers or experts, are stacks).

    Raises:
      ValueError: a non-zero ``weight_decay``.
    """
    _no_decay(weight_decay)
    adam = optax.scale_by_adam(b1=b1, b2=b2, eps=eps)
    return optax.chain(adam, scale_by_hyperball(learning_rate, matrix_axes=matrix_axes))
