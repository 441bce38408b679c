"""Samplers and exact population quantities for associative-memory tasks.

A task is a prior p over K queries (:mod:`amemory.data.frequencies`) and answers with
label noise α (paper B, B.1), ``p(i | k) = (1 - α) 1[i = k] + α / K``: a noisy answer is
uniform over all K classes, the true one included (it differs from the query with
probability α (K - 1) / K, not α).

Sources: Li et al. 2026 (arXiv 2602.05725), label-noise model; Wang et al.
2025 (arXiv 2509.26030) is the noiseless case α = 0.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from amemory.data.frequencies import _check_int, _check_real


def _check_noise(noise) -> float:
    return _check_real("noise", noise, 0.0, 1.0, False, True)


def _check_prior(prior) -> np.ndarray:
    p = np.asarray(prior, dtype=np.float64)
    if p.ndim != 1 or p.size == 0:
        raise ValueError(f"prior must be a non-empty 1-D array, got shape {p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ValueError("prior must have finite, non-negative entries")
    if abs(p.sum() - 1.0) > 1e-6:
        raise ValueError(f"prior must sum to 1 (tolerance 1e-6), got sum {p.sum()!r}")
    return p


def conditional(K: int, noise: float = 0.0) -> np.ndarray:
    """Exact answer distribution p(i | k) = (1 - noise) 1[i = k] + noise / K.

    Args:
      K: number of classes, integer >= 1; noise: label-noise rate α in [0, 1).

    Returns:
      float64 array [K, K]; row k is p(. | k) and sums to 1.

    Raises:
      ValueError: naming ``K`` or ``noise`` when out of range.
    """
    K = _check_int("K", K, 1)
    a = _check_noise(noise)
    return (1.0 - a) * np.eye(K) + a / K


def joint(prior, noise: float = 0.0) -> np.ndarray:
    """Exact population joint P[k, i] = p_k p(i | k) of (query k, answer i).

    Args:
      prior: [K] class prior summing to 1; noise: label-noise rate α in [0, 1).

    Returns:
      float64 array [K, K] summing to 1.

    Raises:
      ValueError: naming ``prior`` or ``noise`` when invalid.
    """
    p = _check_prior(prior)
    return p[:, None] * conditional(p.size, noise)


def optimal_loss(prior, noise: float = 0.0) -> float:
    """Bayes-optimal population cross-entropy L* = Σ_k p_k H(p(. | k)) in nats, the infimum
    of paper B's loss, attained at p̂ = p(. | k); per query
    H = -(1 - α + α/K) log(1 - α + α/K) - (K - 1)(α/K) log(α/K).

    Args:
      prior: [K] class prior summing to 1.
      noise: label-noise rate α in [0, 1).

    Returns:
      L* as a Python float (nats); 0.0 when noise == 0.

    Raises:
      ValueError: naming ``prior`` or ``noise`` when invalid.
    """
    p = _check_prior(prior)
    a = _check_noise(noise)
    K = p.size
    if a == 0.0:
        return 0.0
    hit = 1.0 - a + a / K
    h = -hit * math.log(hit) - (K - 1) * (a / K) * math.log(a / K)
    return float(h * p.sum())


def sample_pairs(
    key: jax.Array, prior, batch_size: int, noise: float = 0.0
) -> tuple[jax.Array, jax.Array]:
    """Sample i.i.d. (query, answer) pairs: k ~ prior, i ~ p(. | k) with label noise.

    Deterministic in ``key``. The prior is validated on the host, so under ``jax.jit``
    ``prior``, ``batch_size`` and ``noise`` must be static (or use :func:`make_sampler`).

    Args:
      key: a ``jax.random`` key.
      prior: [K] class prior summing to 1 (numpy or jax array).
      batch_size: B, integer >= 1.
      noise: label-noise rate α in [0, 1).

    Returns:
      (queries, answers), both int32 arrays of shape [B] with values in [0, K).

    Raises:
      ValueError: naming ``prior``, ``batch_size`` or ``noise`` when invalid.
    """
    p = _check_prior(prior)
    B = _check_int("batch_size", batch_size, 1)
    a = _check_noise(noise)
    kq, kflip, kuni = jax.random.split(key, 3)
    with np.errstate(divide="ignore"):
        logp = jnp.asarray(np.log(p), dtype=jnp.float32)
    queries = jax.random.categorical(kq, logp, shape=(B,)).astype(jnp.int32)
    if a == 0.0:
        return queries, queries
    flip = jax.random.bernoulli(kflip, a, shape=(B,))
    uniform = jax.random.randint(kuni, (B,), 0, p.size, dtype=jnp.int32)
    answers = jnp.where(flip, uniform, queries).astype(jnp.int32)
    return queries, answers


def make_sampler(prior, batch_size: int, noise: float = 0.0):
    """A jitted ``sample(key) -> (queries [B] int32, answers [B] int32)`` for a fixed task.

    The numbers of :func:`sample_pairs` with the same key, validated once here, so the
    returned function takes a traced key inside ``jax.jit`` / ``jax.lax.scan``.

    Raises:
      ValueError: naming ``prior``, ``batch_size`` or ``noise`` when invalid.
    """
    p = _check_prior(prior)
    sample_pairs(jax.random.key(0), p, batch_size, noise)  # validates all arguments

    @jax.jit
    def sample(key):
        return sample_pairs(key, p, batch_size, noise)

    return sample
