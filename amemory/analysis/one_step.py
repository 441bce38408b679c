"""The science kernel of the one-layer memory: the papers' optimizers, one step, ϱ^ε.

What ``experiments/`` and ``theory_checks/`` both need: paper A/B's momentum-free GD,
SignGD and Muon as Optax transforms (:func:`optimizer`), one step's update computed by the
optimizer itself (:func:`unit_update`, so the checks test the library), and paper A's
one-step balance ``ϱ^ε`` of a task-space direction (:func:`first_crossing_rho`) with its
GD closed form. ``ϱ^ε`` is an infimum over step sizes; for one step of GD and Muon from
``W_0 = 0`` it is attained at the first η where ``max_k q_k`` reaches ``1 - ε`` (the first
crossing), the reading used for coupled SignGD too, whose infimum is 0
(``docs/science.md#one-step-balance``). Imports amemory.optim (pure Optax) only.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from amemory.analysis import balance

OPTIMIZERS = ("gd", "signgd", "muon")


def optimizer(name: str, learning_rate: optax.ScalarOrSchedule) -> optax.GradientTransformation:
    """Paper A/B's momentum-free optimizer ``name`` as an Optax transformation.

    ``gd``: ``optax.sgd`` (``W ← W - η G``); ``signgd``: :func:`amemory.optim.signgd`
    (``W ← W - η sign(G)``, Adam with β1 = β2 = 0); ``muon``: :func:`amemory.optim.muon`
    with the exact polar factor, no momentum, no Nesterov and no shape scaling
    (``W ← W - η msgn(G)``). Sources: Wang et al. 2025 (arXiv 2509.26030), Section 5;
    Li et al. 2026 (arXiv 2602.05725), Section 2.

    Args:
      name: one of :data:`OPTIMIZERS`.
      learning_rate: float or optax schedule, η (SignGD: the move of every entry; Muon:
        the spectral norm of the move).

    Raises:
      ValueError: for an unknown name.
    """
    from amemory import optim

    if name == "gd":
        return optax.sgd(learning_rate)
    if name == "signgd":
        return optim.signgd(learning_rate)
    if name == "muon":
        return optim.muon(
            learning_rate, momentum=0.0, nesterov=False, orthogonalizer="polar", shape_scale="none"
        )
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")


def unit_update(name: str, grad: jax.Array) -> jax.Array:
    """Update ``U`` of one step of ``name`` with learning rate 1, so ``W_η = W + η U``:
    ``-G``, ``-sign(G)`` or ``-msgn(G)`` (run through :func:`optimizer`, jit-friendly).

    Args:
      name: one of :data:`OPTIMIZERS`.
      grad: gradient ``[d_out, d_in]``.

    Returns:
      ``[d_out, d_in]`` update, dtype of ``grad``.

    Raises:
      ValueError: for an unknown name.
    """
    tx = optimizer(name, 1.0)
    update, _ = tx.update(grad, tx.init(grad), grad)
    return update


@functools.cache
def _task_q() -> Callable[[jax.Array, jax.Array], jax.Array]:
    def one(dhat, eta):  # row k of eta * D̂ᵀ = logits of query k
        return jnp.diagonal(jax.nn.softmax(eta * dhat.T, axis=-1))

    return jax.jit(lambda d, etas: jax.lax.map(lambda e: one(d, e), etas, batch_size=8))


def task_correct_fn(dhat: Any) -> Callable[[np.ndarray], np.ndarray]:
    """``η [n] -> q [n, K]``: correct-class probabilities of ``Ŵ = η D̂`` in task space.

    ``D̂ = ẼᵀUE`` is a one-step update in task space (``[answer i, query k]``, as
    ``amemory.models.memory.task_space`` returns; for orthonormal embeddings these are the
    model's ``correct_probabilities(η U, E, Ẽ)``); step sizes are mapped 8 at a time.

    Args:
      dhat: ``[K, K]`` task-space update.

    Returns:
      a function of ``[n]`` step sizes returning ``[n, K]`` numpy probabilities.

    Raises:
      ValueError: if ``dhat`` is not square.
    """
    d = jnp.asarray(dhat)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise ValueError(f"dhat must be a square [K, K] task-space update, got {d.shape}")
    return lambda etas: np.asarray(_task_q()(d, jnp.asarray(etas, d.dtype)))


def first_crossing_rho(
    dhat: Any, eps: float, *, n_grid: int = 65, rtol: float = 1e-13
) -> balance.RhoResult:
    """Paper A's one-step balance ``ϱ^ε`` of a task-space update, first-crossing reading.

    The class with the largest smallest margin ``m = max_k min_{i≠k} (D̂_kk - D̂_ik)``
    reaches ``1 - ε`` by ``η = log((K-1)(1-ε)/ε) / m``; the search
    (:func:`amemory.analysis.balance.one_step_rho`) runs to twice that.
    ``result.rho_boundary`` is the first-crossing value, ``result.rho`` the infimum
    reading restricted to the searched range.

    Args:
      dhat: ``[K, K]`` task-space update (see :func:`task_correct_fn`).
      eps: ε in (0, 1); n_grid: grid size of the search, >= 3.
      rtol: relative precision of the crossing η (1e-13 suits float64; a float32
        ``dhat`` needs no better than ~1e-7).

    Returns:
      :class:`amemory.analysis.balance.RhoResult`.

    Raises:
      ValueError: if no class has all margins positive, or on bad ``eps``/``n_grid``/``rtol``.
    """
    d = np.asarray(dhat, dtype=np.float64)
    K = d.shape[0]
    margins = np.diag(d)[None, :] - d  # [i, k]: D̂_kk - D̂_ik
    np.fill_diagonal(margins, np.inf)
    m = float(margins.min(axis=0).max())
    if not m > 0:
        raise ValueError(f"no class has all margins > 0 (best smallest margin {m}): ϱ^ε undefined")
    if not 0.0 < eps < 1.0:
        raise ValueError(f"eps must lie in (0, 1), got {eps}")
    eta_max = 2.0 * math.log(max(K - 1, 1) * (1 - eps) / eps + 2.0) / m
    return balance.one_step_rho(
        task_correct_fn(dhat), eps, eta_max=eta_max, n_grid=n_grid, rtol=rtol
    )


def gd_one_step_rho(prior: Any, eps: float) -> float:
    """Closed form of one-step GD balance from ``W_0 = 0`` with orthonormal embeddings.

    One GD step of size η gives query k a margin ``η p_k`` over every wrong answer, so
    ``q_k(η) = 1 / (1 + (K-1) e^{-η p_k})``, increasing in η; the best class reaches
    ``1 - ε`` at ``η = log x / p_max`` with ``x = (1/ε - 1)(K - 1)``, and then
    ``ϱ^ε = x^r / (x^r + K - 1)``, ``r = p_min / p_max``. For paper A's two-level prior
    ``r = min{α(1-β)/(β(1-α)), β(1-α)/(α(1-β))}``, the exponent of Theorem 5.3
    (Wang et al. 2025, arXiv 2509.26030; derivation in
    ``docs/science.md#gd-one-step-closed-form``).

    Args:
      prior: ``[K]`` positive class frequencies (K >= 2).
      eps: ε in (0, 1).

    Returns:
      ``ϱ^ε`` (float, dimensionless).

    Raises:
      ValueError: on a prior that is not ``[K]`` positive with K >= 2, or eps outside (0, 1).
    """
    p = np.asarray(prior, dtype=np.float64)
    if p.ndim != 1 or p.size < 2 or not np.all(p > 0):
        raise ValueError(f"prior must be a positive [K] array with K >= 2, got shape {p.shape}")
    if not 0.0 < eps < 1.0:
        raise ValueError(f"eps must lie in (0, 1), got {eps}")
    K = p.size
    r = p.min() / p.max()
    x = (1.0 / eps - 1.0) * (K - 1)
    return float(x**r / (x**r + K - 1))
