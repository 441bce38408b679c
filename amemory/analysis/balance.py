"""Balance of an associative memory across classes: per-class error, gap Δ, one-step ϱ^ε.

Paper A (Wang et al. 2025, arXiv 2509.26030, Section 5) measures how evenly a memory has
learned its K facts by the probability of the correct answer of each query,
``q_k = [f_W(E_k)]_k``: the gap ``Δ(W) = max_k q_k - min_k q_k``, and the one-step balance
``ϱ^ε = inf_{η >= 0} min_k q_k(W_η)`` subject to ``max_k q_k(W_η) >= 1 - ε``, with
``W_η = W_0 - η G(W_0)``. A balanced optimizer has ``ϱ^ε`` close to ``1 - ε``, an
imbalanced one close to 0.

Functions take ``[..., K, K]`` probability matrices (row k = query k, as
``amemory.models.memory.probabilities`` returns) or ``[..., K]`` correct-class
probabilities, in ``jax.numpy``; the ϱ^ε search and the head/tail split run on the host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


def per_class_top1_error(probs: jax.Array) -> jax.Array:
    """Top-1 error per class: 1 where ``argmax_i probs[k, i] != k``, else 0.

    Args:
      probs: ``[..., K, K]`` predictions (or logits), row k = query k.

    Returns:
      ``[..., K]`` float array of 0/1 (ties resolved by the first maximum, as argmax).

    Raises:
      ValueError: if the last two axes are not square.
    """
    shape = jnp.shape(probs)
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise ValueError(f"probs must be [..., K, K] (row k = query k), got shape {shape}")
    k = shape[-1]
    return (jnp.argmax(probs, axis=-1) != jnp.arange(k)).astype(jnp.result_type(probs, 1.0))


def _check_correct(correct: jax.Array) -> None:
    if jnp.ndim(correct) < 1:
        raise ValueError(f"correct must be [..., K], got a scalar of shape {jnp.shape(correct)}")


def gap(correct: jax.Array) -> jax.Array:
    """Paper A's gap ``Δ = max_k q_k - min_k q_k`` of correct-class probabilities.

    Args:
      correct: ``[..., K]`` correct-class probabilities ``q_k = probs[..., k, k]``.

    Returns:
      ``[...]`` gap in ``[0, 1]``; 0 means perfectly balanced.

    Raises:
      ValueError: if ``correct`` is a scalar.
    """
    _check_correct(correct)
    return jnp.max(correct, axis=-1) - jnp.min(correct, axis=-1)


def error_ratio(correct: jax.Array) -> jax.Array:
    """Worst over best class error, ``(1 - min_k q_k) / (1 - max_k q_k)``.

    Paper A's Theorems 5.3/5.4: for Muon this ratio is ``1 + O(log K / K)``; for GD it grows
    without bound as training proceeds.

    Args:
      correct: ``[..., K]`` correct-class probabilities, all ``< 1``.

    Returns:
      ``[...]`` ratio >= 1 (inf if the best class has probability exactly 1).

    Raises:
      ValueError: if ``correct`` is a scalar.
    """
    _check_correct(correct)
    return (1.0 - jnp.min(correct, axis=-1)) / (1.0 - jnp.max(correct, axis=-1))


class RhoResult(NamedTuple):
    """Result of :func:`one_step_rho`.

    Attributes:
      rho: ϱ^ε, the smallest worst-class probability over feasible step sizes.
      eta_boundary: smallest feasible step size found (``max_k q_k = 1 - ε`` to ``rtol``).
      n_feasible_grid: number of feasible grid points (diagnostic).
      rho_boundary: ``min_k q_k`` at ``eta_boundary`` (= ``rho`` when ``min_k q_k`` is
        non-decreasing on the feasible set).
    """

    rho: float
    eta_boundary: float
    n_feasible_grid: int
    rho_boundary: float


def one_step_rho(
    correct_fn: Callable[[np.ndarray], np.ndarray],
    eps: float,
    *,
    eta_max: float,
    eta_min: float | None = None,
    n_grid: int = 129,
    rtol: float = 1e-13,
) -> RhoResult:
    """One-step balance ``ϱ^ε`` of paper A (Section 5.2; module docstring) by search over η.

    ``q`` is evaluated on a geometric grid of ``n_grid`` step sizes in ``[eta_min, eta_max]``;
    the first grid interval where ``max_k q_k`` crosses ``1 - ε`` is refined by nested
    sub-grids of ``n_grid`` points (one compiled shape) to relative width ``rtol``; ``ϱ^ε``
    is the minimum of ``min_k q_k`` over the boundary and all feasible grid points: exact
    when ``min_k q_k`` is non-decreasing on the feasible set (one step of GD, SignGD and
    Muon from ``W_0 = 0``), a grid approximation of the infimum otherwise.

    Args:
      correct_fn: float64 step sizes ``[n]`` -> correct-class probabilities ``[n, K]``.
      eps: ε in (0, 1).
      eta_max: largest step size searched, > 0 and feasible.
      eta_min: smallest step size searched, infeasible; default ``eta_max * 1e-8``.
      n_grid: number of geometric grid points, >= 3.
      rtol: relative tolerance on the boundary step size, > 0.

    Returns:
      :class:`RhoResult`.

    Raises:
      ValueError: on an argument out of range, a ``correct_fn`` output that is not
        ``[n, K]``, or when ``eta_max`` is infeasible or ``eta_min`` feasible.
    """
    if not 0.0 < eps < 1.0:
        raise ValueError(f"eps must lie in (0, 1), got {eps}")
    if not eta_max > 0:
        raise ValueError(f"eta_max must be > 0, got {eta_max}")
    eta_min = eta_max * 1e-8 if eta_min is None else eta_min
    if not 0 < eta_min < eta_max:
        raise ValueError(f"eta_min must satisfy 0 < eta_min < eta_max={eta_max}, got {eta_min}")
    if n_grid < 3:
        raise ValueError(f"n_grid must be >= 3, got {n_grid}")
    if not rtol > 0:
        raise ValueError(f"rtol must be > 0, got {rtol}")

    def q_of(etas: np.ndarray) -> np.ndarray:
        q = np.asarray(correct_fn(np.asarray(etas, dtype=np.float64)), dtype=np.float64)
        if q.ndim != 2 or q.shape[0] != len(etas):
            raise ValueError(f"correct_fn must return [n, K], got shape {q.shape}")
        return q

    target = 1.0 - eps
    grid = np.geomspace(eta_min, eta_max, n_grid)
    q = q_of(grid)
    feasible = q.max(axis=1) >= target
    if not feasible.any():
        raise ValueError(
            f"no step size up to eta_max={eta_max} reaches max_k q_k >= 1 - eps = {target}; "
            "increase eta_max"
        )
    first = int(np.argmax(feasible))
    if first == 0:
        raise ValueError(
            f"eta_min={eta_min} is already feasible (max_k q_k >= {target}); decrease eta_min"
        )
    lo, hi = grid[first - 1], grid[first]
    at_boundary, best = float(q[first].min()), float(q[feasible].min())
    while hi - lo > rtol * hi:
        sub = np.linspace(lo, hi, n_grid)
        qs = q_of(sub)
        feas = qs.max(axis=1) >= target
        feas[-1] = True  # hi is feasible by construction
        k = max(int(np.argmax(feas)), 1)
        lo, hi = sub[k - 1], sub[k]
        best = min(best, float(qs[feas].min()))
        at_boundary = float(qs[k].min())
    return RhoResult(
        rho=best,
        eta_boundary=float(hi),
        n_feasible_grid=int(feasible.sum()),
        rho_boundary=at_boundary,
    )


def head_tail_masks(prior: object) -> tuple[np.ndarray, np.ndarray]:
    """Split classes into head and tail at the largest gap of the sorted log-frequencies.

    For paper A's two-level prior (Assumption 5.2) this recovers exactly its L head classes.

    Args:
      prior: ``[K]`` positive class frequencies, not all equal, K >= 2.

    Returns:
      ``(head, tail)``: two boolean ``[K]`` masks, complementary.

    Raises:
      ValueError: if prior is not 1-D with K >= 2, has non-positive entries, or is
        constant (no head/tail split exists).
    """
    p = np.asarray(prior, dtype=np.float64)
    if p.ndim != 1 or p.size < 2:
        raise ValueError(f"prior must be [K] with K >= 2, got shape {p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p <= 0):
        raise ValueError("prior must be finite and positive")
    lp = np.sort(np.log(p))[::-1]
    drops = lp[:-1] - lp[1:]
    if drops.max() <= 0:
        raise ValueError("prior is constant: no head/tail split")
    cut = int(np.argmax(drops))
    head = np.log(p) > 0.5 * (lp[cut] + lp[cut + 1])
    return head, ~head
