"""Hyperball (MuonH, AdamH): weights and updates at fixed Frobenius norms, no weight decay.

Per matrix ``W`` (every matrix of a stack on its own: one per layer and per expert of a
``[L, E, d, f]`` leaf, never one norm across them), with ``R = ||W_0||_F`` fixed at
``init`` and ``u`` the base optimizer's direction (Muon's orthogonalised momentum, Adam's
``m / sqrt(v)``)::

    W' = W - lr R u / ||u||_F                 (the update is the fraction lr of R)
    W_next = R W' / ||W'||_F                  (back onto the sphere of radius R)

so ``lr`` is the angular step and weight decay has nothing left to do. Source: Wen, Dang,
Lyu, Ma, Liang, "Fantastic Pretraining Optimizers and Where to Find Them II: Hyperball
Optimization", arXiv 2606.16899, Sec. 2 (the Hyperball update; the paper's own text was
not reachable here, the rule follows NVIDIA Emerging-Optimizers' ``MuonHyperball``, which
takes ``R`` from each parameter's norm, and Marin #8621: the norm is per expert).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from amemory.optim._matrices import MatrixAxes, leaf_layouts
from amemory.optim.muon import scale_by_muon

__all__ = ["HyperballState", "adamh", "muonh", "scale_by_hyperball"]


class HyperballState(NamedTuple):
    count: jax.Array  # [] int32, steps taken (for a learning-rate schedule)
    radius: Any  # tree like params, each [batch] float32: ||W_0||_F per matrix


def _norms(tree: Any, matrix_axes: MatrixAxes) -> tuple[list, Any, list, list]:
    """Leaves, treedef, layouts and per-matrix Frobenius norms ``[batch]`` (float32)."""
    leaves, treedef, lays = leaf_layouts(tree, matrix_axes)
    mats = [lay.to_matrix(x).astype(jnp.float32) for x, lay in zip(leaves, lays, strict=True)]
    return mats, treedef, lays, [jnp.sqrt(jnp.sum(m * m, axis=(1, 2))) for m in mats]


def scale_by_hyperball(
    learning_rate: optax.ScalarOrSchedule, *, matrix_axes: MatrixAxes = None, eps: float = 1e-8
) -> optax.GradientTransformation:
    """The Hyperball step after a direction: the returned update moves ``W`` to ``W_next``.

    Args:
      learning_rate: float or schedule: the update's norm as a fraction of ``R``.
      matrix_axes: which axes of a leaf form its matrices (``amemory.optim.muon``'s rule;
        other axes are batch axes, each batch entry keeps its own radius).
      eps: floor of the norms divided by (a zero direction leaves ``W`` unchanged).

    Returns:
      ``optax.GradientTransformation`` whose ``update`` needs ``params``.

    Raises:
      ValueError: a leaf that is not a matrix under ``matrix_axes``, a zero-norm matrix at
        ``init`` (its radius would be 0), or ``params=None`` at ``update``.
    """

    def init_fn(params):
        _, treedef, _, radius = _norms(params, matrix_axes)
        if any(not bool(jnp.all(r > 0)) for r in radius if not isinstance(r, jax.core.Tracer)):
            raise ValueError("hyperball: a matrix has zero Frobenius norm at init (radius 0)")
        return HyperballState(jnp.zeros([], jnp.int32), treedef.unflatten(radius))

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("hyperball: update needs params (the weights are projected)")
        lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
        u, treedef, lays, u_norm = _norms(updates, matrix_axes)
        w, _, _, _ = _norms(params, matrix_axes)
        out = []
        for ui, un, wi, r, lay, p in zip(
            u,
            u_norm,
            w,
            treedef.flatten_up_to(state.radius),
            lays,
            jax.tree.leaves(params),
            strict=True,
        ):
            r = r[:, None, None]
            moved = wi - lr * r * ui / jnp.maximum(un, eps)[:, None, None]
            moved_norm = jnp.sqrt(jnp.sum(moved * moved, axis=(1, 2), keepdims=True))
            new = r * moved / jnp.maximum(moved_norm, eps)
            out.append(lay.from_matrix(new - wi).astype(p.dtype))
        return treedef.unflatten(out), HyperballState(
            optax.safe_increment(state.count), state.radius
        )

    return optax.GradientTransformation(init_fn, update_fn)


def muonh(learning_rate: optax.ScalarOrSchedule, **options: Any) -> optax.GradientTransformation:
    """MuonH: :func:`amemory.optim.scale_by_muon` (every ``MuonOptions`` field in
    ``options``), then :func:`scale_by_hyperball` on Muon's ``matrix_axes`` (arXiv
    2606.16899). The shape scaling is irrelevant (the update is renormalised).

    Raises:
      ValueError: an unknown option or a bad value (from ``MuonOptions``).
    """
    tx = scale_by_muon(**options)
    axes = options.get("matrix_axes")
    return optax.chain(tx, scale_by_hyperball(learning_rate, matrix_axes=axes))


def adamh(
    learning_rate: optax.ScalarOrSchedule,
    *,
    b1: float = 0.9,
    b2: float = 0.95,
    eps: float = 1e-8,
    matrix_axes: MatrixAxes = None,
) -> optax.GradientTransformation:
    """AdamH: ``optax.scale_by_adam`` then :func:`scale_by_hyperball` (arXiv 2606.16899).

    Raises:
      ValueError: a leaf that is not a matrix under ``matrix_axes``.
    """
    return optax.chain(
        optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
        scale_by_hyperball(learning_rate, matrix_axes=matrix_axes),
    )
