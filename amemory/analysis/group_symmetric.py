"""Paper B's memory reduced to its group-symmetric subspace: GD, task-space SignGD, Muon.

Li et al. 2026 ("Muon in Associative Memory Learning: Training Dynamics and Scaling
Laws", arXiv 2602.05725) study ``p̂(i|j) = softmax_i(Ŵ[i, j])`` in task space with M groups
of C classes, ``p_j = p̃_g / C`` for j in group g, label noise α (target
``p(i|j) = (1-α) 1[i=j] + α/K``, K = MC) and ``Ŵ_0 = 0``. The problem is invariant under
permuting the classes of a group (answers and queries together), and so are GD,
coordinate-wise SignGD in task space (paper B's TRA-SignGD) and Muon. From ``Ŵ_0 = 0``
they therefore keep Ŵ in the subspace

    Ŵ = diag(d) ⊗ I_C + B ⊗ 1_C 1_Cᵀ,   d ∈ R^M, B ∈ R^{M×M} (B[g, h]: answers of g, queries of h),

paper B's "group block-symmetric structure" (``docs/science.md#paper-b``). Here the three
optimizers run in that subspace with O(M³) work per step, so K can be 10^6 and more.

Gradient (exact). For a query of group h, the logits are ``d_h + B_hh`` (its own answer),
``B_hh`` (the C - 1 other answers of h) and ``B_gh`` (the C answers of every g ≠ h). With
``q_s, q_gh`` the softmax probabilities of its own answer and of one answer of group g,
the task-space gradient is ``G = diag(δ) ⊗ I_C + Γ ⊗ 1 1ᵀ`` with

    δ_h = (p̃_h/C)(q_s - q_hh - (1 - α)),   Γ_gh = (p̃_h/C)(q_gh - α/K).

Muon. ``G`` acts as ``δ_h`` on the zero-mean vectors of group h and as
``A = diag(δ) + C Γ`` on the group means (orthonormal basis ``1_g/√C``), so
``msgn(G) = diag(sign δ) ⊗ (I - 11ᵀ/C) + msgn(A) ⊗ 11ᵀ/C``: d moves by ``-η sign(δ)`` and
B by ``-η (msgn(A) - diag(sign δ))/C``. Singular values below ``K·eps·σ_max(G)`` count as
zero, the rule of :func:`amemory.optim.polar`.

TRA-SignGD: ``sign(G)`` has ``sign(δ_h + Γ_hh)`` on the diagonal, ``sign(Γ_gh)``
elsewhere, so B moves by ``-η sign(Γ)`` and d by ``-η (sign(δ + diag Γ) - sign(diag Γ))``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from amemory.analysis.one_step import OPTIMIZERS


class GroupState(NamedTuple):
    """A task-space memory of the group-symmetric form.

    Attributes:
      d: ``[M]`` extra logit of each query's own answer, per group.
      B: ``[M, M]`` logit of any answer of group g (row) for a query of group h (column).
    """

    d: jax.Array
    B: jax.Array


def _args(name: str, group_prior: object, C: int, noise: float, lr: float) -> tuple:
    """Validated ``(name, group_prior, C, noise, lr)`` for the jitted runs, in the prior's dtype."""
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")
    if isinstance(C, bool) or not isinstance(C, (int, np.integer)) or C < 1:
        raise ValueError(f"C must be an integer >= 1, got {C!r}")
    if np.ndim(group_prior) != 1 or np.size(group_prior) < 1:
        raise ValueError(f"group_prior must be [M], got shape {np.shape(group_prior)}")
    p = jnp.asarray(group_prior)
    return name, p, int(C), jnp.asarray(noise, p.dtype), jnp.asarray(lr, p.dtype)


def expand(state: GroupState, C: int) -> jax.Array:
    """The full task-space matrix ``Ŵ = diag(d) ⊗ I_C + B ⊗ 1 1ᵀ``, ``[MC, MC]``."""
    full = jnp.kron(state.B, jnp.ones((C, C), state.B.dtype))
    return full + jnp.diag(jnp.repeat(state.d, C))


def project(W: jax.Array, M: int, C: int) -> tuple[GroupState, jax.Array]:
    """Least-squares projection of a ``[MC, MC]`` task-space matrix onto the subspace.

    ``B_gh`` is the mean of block (g, h) off its diagonal (for C = 1: 0), ``d_h`` the
    mean diagonal of block (h, h) minus ``B_hh``.

    Returns:
      ``(state, residual)``: the projection and ``max |W - expand(state)|``.

    Raises:
      ValueError: if W is not ``[MC, MC]``.
    """
    K = M * C
    if W.shape != (K, K):
        raise ValueError(f"W must be [M*C, M*C] = [{K}, {K}], got {W.shape}")
    blocks = W.reshape(M, C, M, C).transpose(0, 2, 1, 3)  # [g, h, C, C]
    diag = jnp.trace(blocks, axis1=-2, axis2=-1) / C  # [g, h]
    if C > 1:
        B = (blocks.sum(axis=(-2, -1)) - C * diag) / (C * (C - 1))
    else:
        B = jnp.zeros((M, M), W.dtype)
    state = GroupState(d=jnp.diagonal(diag) - jnp.diagonal(B), B=B)
    return state, jnp.max(jnp.abs(W - expand(state, C)))


def _log_probs(state: GroupState, C: int):
    """(log q_s [M], log q [M, M], mult [M, M]): own answer, one answer of group g, and the
    number of such answers (C, or C - 1 in the query's own group), per query group h."""
    d, B = state
    own = d + jnp.diagonal(B)  # [h]
    mult = jnp.where(jnp.eye(d.shape[0], dtype=bool), C - 1.0, float(C))
    log_mult = jnp.log(mult)  # -inf when C = 1 (no other answer in the group)
    log_z = jnp.logaddexp(own, jax.scipy.special.logsumexp(B + log_mult, axis=0))  # [h]
    return own - log_z, B - log_z[None, :], mult


def loss(state: GroupState, group_prior: jax.Array, C: int, noise: float = 0.0) -> jax.Array:
    """Population loss (nats) of the group-symmetric memory; equals
    ``amemory.models.memory.population_loss(expand(state, C), I, I, prior, noise)``."""
    K = state.d.shape[0] * C
    ls, lq, mult = _log_probs(state, C)
    others = jnp.sum(jnp.where(mult > 0, mult * lq, 0.0), axis=0)  # Σ over wrong answers
    per_query = -(1 - noise + noise / K) * ls - (noise / K) * others
    return jnp.dot(group_prior, per_query)


def gradient(
    state: GroupState, group_prior: jax.Array, C: int, noise: float = 0.0
) -> tuple[jax.Array, jax.Array]:
    """``(δ [M], Γ [M, M])`` with task-space gradient ``G = diag(δ) ⊗ I + Γ ⊗ 1 1ᵀ``."""
    K = state.d.shape[0] * C
    ls, lq, _ = _log_probs(state, C)
    w = group_prior / C  # per-query prior p_j, [h]
    delta = w * (jnp.exp(ls) - jnp.exp(jnp.diagonal(lq)) - (1 - noise))
    gamma = w[None, :] * (jnp.exp(lq) - noise / K)
    return delta, gamma


def _update(name: str, delta: jax.Array, gamma: jax.Array, C: int) -> GroupState:
    """Update (Δd, ΔB) of one step with learning rate 1 (``W ← W + η U``)."""
    if name == "gd":
        return GroupState(-delta, -gamma)
    if name == "signgd":
        dg = jnp.diagonal(gamma)
        return GroupState(-(jnp.sign(delta + dg) - jnp.sign(dg)), -jnp.sign(gamma))
    M = delta.shape[0]
    A = jnp.diag(delta) + C * gamma
    u, s, vh = jnp.linalg.svd(A)
    s_max = jnp.maximum(s[0], jnp.max(jnp.abs(delta)) if C > 1 else 0.0)
    cut = M * C * float(jnp.finfo(delta.dtype).eps) * s_max
    sd = jnp.where(jnp.abs(delta) > cut, jnp.sign(delta), 0.0)
    ua = (u * (s > cut)[None, :].astype(A.dtype)) @ vh  # msgn(A), same zero rule as G's
    return GroupState(-sd, -(ua - jnp.diag(sd)) / C)


def _step(name: str, group_prior: jax.Array, C: int, noise, lr):
    """One step ``state -> state + lr * U`` of ``name``, and the zero state ``Ŵ_0``."""
    M, dt = group_prior.shape[0], group_prior.dtype

    def step(state: GroupState) -> GroupState:
        u = _update(name, *gradient(state, group_prior, C, noise), C)
        return GroupState(state.d + lr * u.d, state.B + lr * u.B)

    return step, GroupState(jnp.zeros(M, dt), jnp.zeros((M, M), dt))


@functools.partial(jax.jit, static_argnums=(0, 2, 5))
def _run(name, group_prior, C, noise, lr, steps):
    step, zero = _step(name, group_prior, C, noise, lr)

    def body(state, _):
        new = step(state)
        return new, loss(new, group_prior, C, noise)

    last, losses = jax.lax.scan(body, zero, None, length=steps)
    return jnp.concatenate([loss(zero, group_prior, C, noise)[None], losses]), last


def run(
    name: str, group_prior: object, C: int, noise: float, lr: float, steps: int
) -> tuple[np.ndarray, GroupState]:
    """``steps`` steps of ``name`` from ``Ŵ_0 = 0`` with constant learning rate ``lr``.

    Args:
      name: ``gd``, ``signgd`` (TRA-SignGD) or ``muon`` (exact msgn, no momentum).
      group_prior: ``[M]`` group masses p̃_g (summing to 1); class prior ``p̃_g / C``.
      C: classes per group (static: one compilation per C); steps: number of steps (static).
      noise: label noise α in [0, 1); lr: η per step.

    Returns:
      ``(losses [steps + 1] numpy, final state)``; losses in nats, index t = after t steps.

    Raises:
      ValueError: for an unknown name, C < 1 or a group prior that is not 1-D.
    """
    losses, last = _run(*_args(name, group_prior, C, noise, lr), int(steps))
    return np.asarray(losses), last


@functools.partial(jax.jit, static_argnums=(0, 2))
def _final(name, group_prior, C, noise, lr, T):
    step, zero = _step(name, group_prior, C, noise, lr)
    return loss(jax.lax.fori_loop(0, T, lambda _, state: step(state), zero), group_prior, C, noise)


def final_loss(name: str, group_prior: object, C: int, noise: float, lr: float, T: int) -> float:
    """Loss (nats) after T steps of ``name`` (one compilation for every T); as :func:`run`.

    Raises:
      ValueError: for an unknown name, C < 1, a group prior that is not 1-D, or T < 0.
    """
    if T < 0:
        raise ValueError(f"T must be >= 0, got {T}")
    return float(_final(*_args(name, group_prior, C, noise, lr), T))
