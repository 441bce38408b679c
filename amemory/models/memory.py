"""One-layer linear associative memory of papers A and B, and its embedding builders.

Model (docs/science.md, "The one-layer associative memory"): K classes (facts), fixed key
embeddings E ``[d_in, K]`` (column E_k: the key of query k), value embeddings Ẽ
``[d_out, K]`` (column Ẽ_i: the value of answer i), trained memory W ``[d_out, d_in]``; for
query k the prediction is ``f_W(E_k) = softmax(Ẽᵀ W E_k)`` over the K answers.

The functions are pure ``jax.numpy`` (jit/grad/vmap-able, dtype of their inputs) and
validate static shapes before any tracing (a ``ValueError`` names the argument). The
builders return ``(E, Et)``, ``Et`` standing for Ẽ, in ``dtype`` (default: float64 under
x64, else float32).

Index convention used throughout:

* ``task_space(W, E, Et)[i, k] = Ẽ_iᵀ W E_k`` (answer i, query k), i.e. ``ẼᵀWE``;
* ``logits(W, E, Et)[k, i]`` is the same number: row k holds the K logits of query k,
  so ``logits = task_space.T`` and ``probabilities`` is its row-wise softmax.

Sources: Wang et al. 2025 (arXiv 2509.26030), Section 5 and Appendix F; Li et al. 2026
(arXiv 2602.05725), model and label-noise loss.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# Paper A (Appendix, SignGD counter-example): Ẽ = I ⊗ R(value angles), E = I ⊗ R(key angles).
COUPLED_VALUE_ANGLES = (3.638, 2.949, 5.218)
COUPLED_KEY_ANGLES = (1.715, 0.876, 3.098)


def _check_shapes(W: Any, E: Any, Et: Any) -> int:
    """Validates W [d_out, d_in], E [d_in, K], Et [d_out, K]; returns K."""
    w, e, et = (jnp.shape(a) for a in (W, E, Et))
    if len(w) != 2 or len(e) != 2 or len(et) != 2 or (e[0], et[0], e[1]) != (w[1], w[0], et[1]):
        raise ValueError(
            f"E must be [d_in, K] and Et [d_out, K] to match W [d_out, d_in]; got W {w}, "
            f"E {e}, Et {et}"
        )
    return int(e[1])


def _check_noise(noise: Any) -> None:
    if isinstance(noise, (int, float, np.floating, np.integer)) and not 0.0 <= noise <= 1.0:
        raise ValueError(f"noise must lie in [0, 1], got {noise}")


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_sizes(builder: str, K: Any, d: Any, min_K: int = 1, d_ge_K: bool = True):
    """Validated ``(K, d)`` of an embedding builder (``d >= K`` when ``d_ge_K``)."""
    K, d = _check_int("K", K, min_K), _check_int("d", d, 1)
    if d_ge_K and d < K:
        raise ValueError(f"{builder} needs d >= K, got d={d} < K={K}")
    return K, d


def _float_dtype(dtype: Any) -> Any:
    """The requested dtype, or the default float (float64 under x64, else float32)."""
    return jnp.zeros(()).dtype if dtype is None else jnp.dtype(dtype)


def task_space(W: jax.Array, E: jax.Array, Et: jax.Array) -> jax.Array:
    """The memory in the embedding basis, Ŵ = Ẽᵀ W E.

    Args:
      W: memory ``[d_out, d_in]``; E: keys ``[d_in, K]``; Et: values ``[d_out, K]`` (Ẽ).

    Returns:
      ``[K, K]`` array with entry ``[i, k] = Ẽ_iᵀ W E_k`` (answer i, query k). With
      orthonormal embeddings the training dynamics in this basis do not depend on E, Ẽ
      (paper B, B.1).

    Raises:
      ValueError: if the shapes do not fit together.
    """
    _check_shapes(W, E, Et)
    return Et.T @ W @ E


def logits(W: jax.Array, E: jax.Array, Et: jax.Array) -> jax.Array:
    """Logits of every query over every answer, ``[K, K]``: row k holds ``Ẽᵀ W E_k``, the K
    logits of query k (paper A, A.1). Shapes as :func:`task_space`, whose transpose this is.

    Raises:
      ValueError: if the shapes do not fit together.
    """
    _check_shapes(W, E, Et)
    return (W @ E).T @ Et


def probabilities(W: jax.Array, E: jax.Array, Et: jax.Array) -> jax.Array:
    """Predictions ``f_W(E_k) = softmax(Ẽᵀ W E_k)``: ``[K, K]`` row-stochastic, entry
    ``[k, i]`` the probability of answer i given query k (``s_ik`` in paper A's gradient).
    Shapes and errors as :func:`logits`."""
    return jax.nn.softmax(logits(W, E, Et), axis=-1)


def correct_probabilities(W: jax.Array, E: jax.Array, Et: jax.Array) -> jax.Array:
    """The probability of the correct answer per query, ``[f_W(E_k)]_k``, ``[K]``: its max
    minus min is the gap Δ(W) of paper A (A.2). Shapes and errors as :func:`logits`."""
    return jnp.diagonal(probabilities(W, E, Et))


def per_class_loss(W: jax.Array, E: jax.Array, Et: jax.Array, noise: Any = 0.0) -> jax.Array:
    """Per-query cross-entropy ``L_k = -Σ_i p(i|k) log f_i(E_k)`` in nats.

    Label noise (paper B, B.1): ``p(i|k) = (1 - noise) 1[i = k] + noise / K``.

    Args: ``W, E, Et`` as in :func:`task_space`; ``noise`` in ``[0, 1]`` (float or traced).
    Returns ``[K]`` losses in nats (``population_loss = Σ_k p_k L_k``). Raises ValueError
    on bad shapes or a concrete noise outside ``[0, 1]``.
    """
    _check_noise(noise)
    z = logits(W, E, Et)
    logp = jax.nn.log_softmax(z, axis=-1)  # [K, K]
    clean = -jnp.diagonal(logp)  # [K]
    uniform = -jnp.mean(logp, axis=-1)  # [K] = -(1/K) Σ_i log f_i
    return (1.0 - noise) * clean + noise * uniform


def population_loss(
    W: jax.Array, E: jax.Array, Et: jax.Array, prior: jax.Array, noise: Any = 0.0
) -> jax.Array:
    """Population cross-entropy ``L(W) = -Σ_k p_k Σ_i p(i|k) log f_i(E_k)`` in nats.

    With ``noise = 0`` this is paper A's ``L(W) = -Σ_k p_k log [f_W(E_k)]_k``; with label
    noise α it is paper B's ``E[-log p̂(i|j)]``. At ``W = 0`` it equals ``log K`` and its
    gradient is ``-Ẽ X Eᵀ`` with ``X = diag(p) - (1/K) 1 pᵀ`` (paper A, A.1; for
    ``noise > 0`` the gradient at 0 is ``-(1 - noise) Ẽ X Eᵀ``).

    Args:
      W, E, Et: as in :func:`task_space`.
      prior: class frequencies p ``[K]`` (non-negative, summing to 1; not renormalised).
      noise: label-noise level in ``[0, 1]``.

    Returns a scalar in nats (dtype of the inputs); raises ValueError on bad shapes, a
    prior not of shape ``[K]``, or concrete noise outside ``[0, 1]``.
    """
    k = _check_shapes(W, E, Et)
    if jnp.shape(prior) != (k,):
        raise ValueError(f"prior must have shape [K]=({k},), got {jnp.shape(prior)}")
    return jnp.dot(prior, per_class_loss(W, E, Et, noise))


def sampled_loss(
    W: jax.Array, E: jax.Array, Et: jax.Array, queries: jax.Array, answers: jax.Array
) -> jax.Array:
    """Mean cross-entropy over a sampled minibatch of (query, answer) pairs, in nats.

    ``-(1/B) Σ_b log f_{answers[b]}(E_{queries[b]})``; an unbiased estimate of
    :func:`population_loss` when queries ~ prior and answers ~ p(·|query)
    (e.g. ``amemory.data.memory_tasks.sample_pairs``).

    Args:
      W, E, Et: as in :func:`task_space`.
      queries, answers: ``[B]`` int class indices in ``[0, K)``.

    Returns a scalar in nats; raises ValueError on bad shapes or if queries/answers are not
    1-D of equal length.
    """
    _check_shapes(W, E, Et)
    if jnp.ndim(queries) != 1 or jnp.shape(queries) != jnp.shape(answers):
        raise ValueError(
            f"queries and answers must both be [B], got {jnp.shape(queries)} and "
            f"{jnp.shape(answers)}"
        )
    z = (W @ E[:, queries]).T @ Et  # [B, K]
    logp = jax.nn.log_softmax(z, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, answers[:, None], axis=-1))


def zyz_rotation(a: float, b: float, c: float) -> np.ndarray:
    """The ZYZ Euler rotation R(a, b, c) = R_z(a) R_y(b) R_z(c) of paper A, float64 ``[3, 3]``
    (Wang et al., arXiv 2509.26030, coupled embeddings; docs/science.md)."""
    ca, sa, cb, sb, cc, sc = (math.cos(a), math.sin(a), math.cos(b), math.sin(b),
                              math.cos(c), math.sin(c))  # fmt: skip
    return np.array(
        [
            [ca * cb * cc - sa * sc, -ca * cb * sc - sa * cc, ca * sb],
            [sa * cb * cc + ca * sc, -sa * cb * sc + ca * cc, sa * sb],
            [-sb * cc, sb * sc, cb],
        ]
    )


def decoupled(K: int, *, dtype: Any = None) -> tuple[jax.Array, jax.Array]:
    """Decoupled embeddings ``(E, Et)``, both the identity ``[K, K]`` (paper A, Fig. 4b
    "decoupled"). Raises ValueError if K is not a positive integer."""
    K = _check_int("K", K, 1)
    eye = jnp.eye(K, dtype=_float_dtype(dtype))
    return eye, eye


def coupled_rotation(K: int, *, dtype: Any = None) -> tuple[jax.Array, jax.Array]:
    """Paper A's coupled embeddings (SignGD counter-example, Theorem 5.3).

    ``Ẽ = I_{K/3} ⊗ R(3.638, 2.949, 5.218)`` and ``E = I_{K/3} ⊗ R(1.715, 0.876, 3.098)``
    with R the ZYZ rotation of :func:`zyz_rotation`. Both are orthonormal ``[K, K]``
    (block-diagonal, 3x3 blocks). Built in float64 numpy, then cast.

    Returns ``(E, Et)``, both ``[K, K]``; raises ValueError if K is not a positive multiple
    of 3.
    """
    K = _check_int("K", K, 3)
    if K % 3:
        raise ValueError(f"K must be divisible by 3 for coupled_rotation, got K={K}")
    blocks = np.eye(K // 3)
    e = np.kron(blocks, zyz_rotation(*COUPLED_KEY_ANGLES))
    et = np.kron(blocks, zyz_rotation(*COUPLED_VALUE_ANGLES))
    dt = _float_dtype(dtype)
    return jnp.asarray(e, dtype=dt), jnp.asarray(et, dtype=dt)


def _orthonormal_columns(key: jax.Array, d: int, K: int, dtype: Any) -> jax.Array:
    """A Haar-random ``[d, K]`` matrix with orthonormal columns (QR with sign fix)."""
    g = jax.random.normal(key, (d, K), dtype=dtype)
    q, r = jnp.linalg.qr(g)
    return q * jnp.sign(jnp.diagonal(r))[None, :]


def random_orthonormal(
    K: int, d: int, key: jax.Array, *, dtype: Any = None
) -> tuple[jax.Array, jax.Array]:
    """Independent Haar-random orthonormal keys and values (Assumption 5.1 when d = K).

    Returns ``(E, Et)``, each ``[d, K]`` with ``EᵀE = ẼᵀẼ = I_K``, from a ``jax.random``
    ``key``; raises ValueError if ``d < K`` or K, d are not positive integers.
    """
    K, d = _check_sizes("random_orthonormal", K, d)
    k1, k2 = jax.random.split(key)
    dt = _float_dtype(dtype)
    return _orthonormal_columns(k1, d, K, dt), _orthonormal_columns(k2, d, K, dt)


def gaussian(K: int, d: int, key: jax.Array, *, dtype: Any = None) -> tuple[jax.Array, jax.Array]:
    """I.i.d. Gaussian keys and values with entries N(0, 1/d) (not orthonormal).

    Columns have squared norm 1 in expectation and mutual inner products of order
    ``1/sqrt(d)``; ``d < K`` is allowed (capacity studies, e.g. Kim et al. 2026). Returns
    independent ``(E, Et)``, each ``[d, K]``; ValueError if K or d is not a positive integer.
    """
    K, d = _check_sizes("gaussian", K, d, d_ge_K=False)
    scale, dt = 1.0 / math.sqrt(d), _float_dtype(dtype)
    E, Et = (scale * jax.random.normal(k, (d, K), dtype=dt) for k in jax.random.split(key))
    return E, Et


def coherent(
    K: int, d: int, coherence: float, key: jax.Array, *, dtype: Any = None
) -> tuple[jax.Array, jax.Array]:
    """Unit-norm keys with equal pairwise inner product ``coherence``; orthonormal values.

    Keys ``E = Q G^{1/2}``, Q a Haar-random ``[d, K]`` orthonormal frame and
    ``G = (1 - c) I + c 11ᵀ = EᵀE``: an equiangular frame of mutual coherence ``|c|``
    (``c = 0``: orthonormal keys). Values Ẽ: an independent Haar-random orthonormal frame.

    Returns ``(E, Et)``, each ``[d, K]``; raises ValueError if ``d < K``, ``K < 2`` or c is
    outside ``(-1/(K-1), 1)`` (where G is positive definite).
    """
    K, d = _check_sizes("coherent", K, d, min_K=2)
    c = float(coherence)
    if not -1.0 / (K - 1) < c < 1.0:
        raise ValueError(f"coherence must lie in (-1/(K-1), 1) = ({-1.0 / (K - 1)}, 1), got {c}")
    # G = (1-c) I + c 11ᵀ has eigenvalues 1-c (on 1⊥) and 1+(K-1)c (on 1), so
    # G^{1/2} = sqrt(1-c) I + (sqrt(1+(K-1)c) - sqrt(1-c))/K 11ᵀ.
    dt = _float_dtype(dtype)
    s0, s1 = math.sqrt(1.0 - c), math.sqrt(1.0 + (K - 1) * c)
    root = s0 * jnp.eye(K, dtype=dt) + (s1 - s0) / K * jnp.ones((K, K), dtype=dt)
    k1, k2 = jax.random.split(key)
    return _orthonormal_columns(k1, d, K, dt) @ root, _orthonormal_columns(k2, d, K, dt)
