"""Exact per-block reduction of one SignGD step with block-diagonal (coupled) embeddings.

Paper A (Wang et al. 2025, "Muon Outperforms Adam in Tail-End Associative Memory
Learning", arXiv 2509.26030, Theorem 5.3) shows SignGD is imbalanced for some orthonormal
embeddings with the construction ``Ẽ = I_{K/b} ⊗ R_v``, ``E = I_{K/b} ⊗ R_k`` (b = 3, ZYZ
rotations). This module computes the correct-class probabilities after one SignGD step
from ``W_0 = 0`` under the two-level prior (Assumption 5.2) in O(1) work per step size,
for any K (the dense computation is O(K^3); ``docs/science.md#coupled-signgd``).

Derivation (exact, no approximation). At ``W_0 = 0`` the negative gradient is
``G = Ẽ X Eᵀ`` with ``X = diag(p) - (1/K) 1 pᵀ`` (paper A, Section 5 / Appendix F).
Write ``u = R_v 1`` and ``p_c`` for the b priors of block c. Then

* block (c, c) of G is ``R_v diag(p_c) R_kᵀ - (1/K) u (R_k p_c)ᵀ``;
* block (b, c), b ≠ c, is ``-(1/K) u (R_k p_c)ᵀ``, so its sign is the rank-one pattern
  ``-sign(u) sign(R_k p_c)ᵀ``.

The SignGD direction ``D = sign(G)`` in task space, ``D̂ = Ẽᵀ D E``, is therefore
``T_c = R_vᵀ sign(G_cc) R_k`` on the diagonal blocks and ``-v w_cᵀ`` off them, with
``v = R_vᵀ sign(u)`` and ``w_c = R_kᵀ sign(R_k p_c)``. Query j of block c, after a step
of size η, has logit ``η T_c[l, j]`` for answer l of its own block and ``-η v_l w_c[j]``
for answer l of every one of the ``K/b - 1`` other blocks. Its correct-class probability
is thus

    q = 1 / (Σ_l exp(-η m^in_l) + (K/b - 1) Σ_l exp(-η m^off_l)),

with per-unit-η margins ``m^in_l = T_c[j, j] - T_c[l, j]`` (``m^in_j = 0``) and
``m^off_l = T_c[j, j] + v_l w_c[j]``. Blocks with the same prior vector p_c have the same
margins, so only three block types exist: all-head, all-tail, and (when ``L mod b ≠ 0``)
the one block that straddles the head/tail boundary. Everything is float64 numpy; K may be
any Python int (only ``log(K/b - 1)`` enters the probabilities).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from amemory.analysis import balance


class BlockMargins(NamedTuple):
    """Per-unit-η logit margins of every distinct class of the coupled SignGD step.

    Attributes:
      names: ``n`` labels ``"<type><j>"``, type in head/tail/mixed, j the position in
        its block (0-based), e.g. ``"head1"``.
      counts: ``n`` Python ints (K may exceed int64), the number of classes per label.
      inblock: ``[n, b]`` margins against the answers of the class's own block (entry j,
        the class itself, is 0; a negative entry beats the correct answer for every η > 0).
      offblock: ``[n, b]`` margins against answer position l of any *other* block.
      n_other: number of other blocks, ``K/b - 1`` (Python int).
      K: number of classes; L: number of head classes.
    """

    names: tuple[str, ...]
    counts: tuple[int, ...]
    inblock: np.ndarray
    offblock: np.ndarray
    n_other: int
    K: int
    L: int


def _check_rotation(name: str, r: object) -> np.ndarray:
    a = np.asarray(r, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] < 2:
        raise ValueError(f"{name} must be a square [b, b] matrix with b >= 2, got shape {a.shape}")
    if not np.allclose(a.T @ a, np.eye(a.shape[0]), atol=1e-12):
        raise ValueError(f"{name} must be orthogonal (RᵀR = I to 1e-12)")
    return a


def block_margins(
    K: int, L: int, alpha: float, key_rotation: object, value_rotation: object
) -> BlockMargins:
    """Margins of one SignGD step from ``W_0 = 0`` with ``E = I ⊗ R_k``, ``Ẽ = I ⊗ R_v``.

    The prior is paper A's two-level prior with L head classes (indices ``0..L-1``,
    ``p = α/L``) and ``K - L`` tail classes (``p = (1-α)/(K-L)``); L is given directly
    (not through β) so that any ``L mod b`` can be chosen.

    Args:
      K: number of classes, a multiple of the block size b, ``K >= 2b``.
      L: number of head classes, ``1 <= L <= K - 1``.
      alpha: head mass α in (0, 1).
      key_rotation, value_rotation: R_k, R_v ``[b, b]`` orthogonal (blocks of E and Ẽ).

    Returns:
      :class:`BlockMargins` (float64).

    Raises:
      ValueError: if K is not a multiple of b or < 2b, L or alpha is out of range, or a
        rotation is not square orthogonal of the same size.
    """
    rk = _check_rotation("key_rotation", key_rotation)
    rv = _check_rotation("value_rotation", value_rotation)
    b = rk.shape[0]
    if rv.shape != rk.shape:
        raise ValueError(f"rotations must have the same shape, got {rk.shape} and {rv.shape}")
    if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or K < 2 * b or K % b:
        raise ValueError(
            f"K must be an integer multiple of the block size {b}, >= {2 * b}, got {K}"
        )
    if isinstance(L, bool) or not isinstance(L, (int, np.integer)) or not 1 <= L <= K - 1:
        raise ValueError(f"L must be an integer in [1, K-1] = [1, {K - 1}], got {L}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    K, L = int(K), int(L)
    a, t = alpha / L, (1.0 - alpha) / (K - L)
    n_blocks, n_head, rem = K // b, L // b, L % b
    types: list[tuple[str, np.ndarray, int]] = []
    if n_head:
        types.append(("head", np.full(b, a), n_head))
    if rem:
        types.append(("mixed", np.r_[np.full(rem, a), np.full(b - rem, t)], 1))
    n_tail = n_blocks - n_head - (1 if rem else 0)
    if n_tail:
        types.append(("tail", np.full(b, t), n_tail))
    u = rv @ np.ones(b)
    v = rv.T @ np.sign(u)  # [b]: off-block answers' side
    names, counts, inb, off = [], [], [], []
    for label, pc, n in types:
        g_cc = rv @ np.diag(pc) @ rk.T - np.outer(u, rk @ pc) / K  # diagonal block of G
        tc = rv.T @ np.sign(g_cc) @ rk  # [b, b]: task-space block, [answer l, query j]
        w = rk.T @ np.sign(rk @ pc)  # [b]: query side of the off-block pattern
        for j in range(b):
            names.append(f"{label}{j}")
            counts.append(n)
            inb.append(tc[j, j] - tc[:, j])
            off.append(tc[j, j] + v * w[j])
    return BlockMargins(
        names=tuple(names),
        counts=tuple(counts),
        inblock=np.asarray(inb),
        offblock=np.asarray(off),
        n_other=n_blocks - 1,
        K=K,
        L=L,
    )


def _exp_terms(m: BlockMargins, etas: np.ndarray) -> tuple[np.ndarray, ...]:
    """Softmax numerators over the own block [n_eta, n, b], the other blocks [n_eta, n, b]
    (each position weighted by n_other) and the correct answer [n_eta, n], max-shifted."""
    e = np.asarray(etas, dtype=np.float64)[:, None, None]
    if np.any(e < 0) or not np.all(np.isfinite(e)):
        raise ValueError("etas must be finite and >= 0")
    inb = -e * m.inblock[None]  # [n_eta, n, b]
    off = -e * m.offblock[None] + math.log(m.n_other)
    top = np.maximum(inb.max(-1), off.max(-1))[..., None]
    return np.exp(inb - top), np.exp(off - top), np.exp(-top[..., 0])


def _wrong_inblock(m: BlockMargins) -> np.ndarray:
    """``m.inblock`` [n, b] with each class's own entry set to +inf."""
    own = np.eye(m.inblock.shape[1], dtype=bool)[[int(n[-1]) for n in m.names]]
    return np.where(own, np.inf, m.inblock)


def correct_probabilities(m: BlockMargins, etas: object) -> np.ndarray:
    """Correct-class probability of every distinct class after a SignGD step of size η.

    Args:
      m: margins from :func:`block_margins`.
      etas: ``[n_eta]`` step sizes >= 0 (every entry of W moves by η).

    Returns:
      ``[n_eta, n]`` float64; column i is shared by the ``m.counts[i]`` classes labelled
      ``m.names[i]`` (a ``correct_fn`` for :func:`amemory.analysis.balance.one_step_rho`).

    Raises:
      ValueError: if an η is negative or not finite.
    """
    ein, eoff, correct = _exp_terms(m, np.atleast_1d(etas))
    return correct / (ein.sum(-1) + eoff.sum(-1))


def mass_split(m: BlockMargins, eta: float) -> tuple[np.ndarray, np.ndarray]:
    """Probability each class loses to its own block's answers and to all other blocks'.

    Args:
      m: margins from :func:`block_margins`; eta: one step size >= 0.

    Returns:
      ``(in_block [n], off_block [n])``: wrong answers' probabilities in the same block and
      in the other ``K/b - 1`` blocks (with the correct class's, they sum to 1).

    Raises:
      ValueError: if eta is negative or not finite.
    """
    ein, eoff, correct = _exp_terms(m, np.array([eta]))
    den = ein.sum(-1) + eoff.sum(-1)
    return ((ein.sum(-1) - correct) / den)[0], (eoff.sum(-1) / den)[0]  # minus the class itself


def per_class(m: BlockMargins, values: object) -> np.ndarray:
    """Expands per-label values ``[..., n]`` to all K classes ``[..., K]`` (class order).

    Class k sits at position ``k mod b`` of block ``k // b`` (for comparisons with a dense
    computation, K up to a few thousand).

    Raises:
      ValueError: if the last axis of ``values`` is not ``len(m.names)``.
    """
    v = np.asarray(values)
    if v.shape[-1:] != (len(m.names),):
        raise ValueError(f"values must be [..., {len(m.names)}], got shape {v.shape}")
    b = m.inblock.shape[1]
    start, j = divmod(np.arange(m.K), b)
    start *= b  # first class of each class's block
    kind = np.where(start + b <= m.L, "head", np.where(start < m.L, "mixed", "tail"))
    return v[..., [m.names.index(f"{t}{i}") for t, i in zip(kind, j, strict=True)]]


def first_crossing(m: BlockMargins, eps: float, *, n_grid: int = 65) -> balance.RhoResult:
    """Paper A's one-step ``ϱ^ε`` of the coupled SignGD step, searched on the reduction.

    ``result.rho_boundary`` is ``min_k q_k`` at the first η where ``max_k q_k`` reaches
    ``1 - ε``, ``result.eta_boundary`` that η. A class whose margins are all >= μ > 0
    reaches ``1 - ε`` by ``η = log((b - 1 + b (K/b - 1))(1-ε)/ε) / μ``; the search runs to
    twice that.

    Args:
      m: margins from :func:`block_margins`; eps: ε in (0, 1); n_grid: search grid size.

    Returns:
      :class:`amemory.analysis.balance.RhoResult`.

    Raises:
      ValueError: if no class has all margins positive, or eps is outside (0, 1).
    """
    if not 0.0 < eps < 1.0:
        raise ValueError(f"eps must lie in (0, 1), got {eps}")
    inb = _wrong_inblock(m)
    mu = float(np.minimum(inb.min(axis=1), m.offblock.min(axis=1)).max())
    if not mu > 0:
        raise ValueError(f"no class has all margins > 0 (best smallest margin {mu})")
    b = m.inblock.shape[1]
    log_wrong = math.log(b - 1 + b * m.n_other)
    eta_max = 2.0 * (log_wrong + math.log((1 - eps) / eps) + 1.0) / mu
    return balance.one_step_rho(
        lambda etas: correct_probabilities(m, etas), eps, eta_max=eta_max, n_grid=n_grid
    )


class Asymptotics(NamedTuple):
    """Large-K law of the first-crossing ``ϱ^ε`` read off the margins (K → ∞, ε fixed).

    With ``n = K/b - 1`` other blocks, the best class (largest smallest off-block margin
    ``m_b`` among classes that beat every answer of their own block) reaches ``1 - ε`` at
    ``η ≈ log(n (1-ε)/ε) / m_b``. There a wrong-answer term of margin μ weighs
    ``(n/ε)^{-μ/m_b}`` (own block) or ``n (n/ε)^{-μ/m_b}`` (other blocks), so the worst
    class's probability is a power law ``ϱ ∝ K^k_exponent ε^eps_exponent`` set by its
    dominant term.

    Attributes:
      best, worst: labels of the best class and of the worst class as K → ∞.
      m_best: the best class's smallest off-block margin ``m_b``.
      dominant: ``"off"`` (the worst class loses to the other blocks' answers) or ``"in"``
        (to an answer of its own block); margin: that dominant margin μ.
      k_exponent: ``-(1 - μ/m_b)`` (off) or ``μ/m_b`` (in); eps_exponent: ``-μ/m_b``.
      sub_leading, best_sub_leading: ``[b - 1]`` other off-block margins minus the smallest,
        of the worst and the best class (the neglected terms fade as ``K^{-(gap)/m_b}``).
      regime_exponent: s in ``K*(ε) ∝ ε^{-s}``, the K beyond which the worst class loses
        more to other blocks than to its own: ``s = x / (1 - x)``, ``x = (μ - μ_in)/m_b``
        with μ_in the most negative own-block margin; 0 when μ <= 0 or no own-block margin
        is negative.
    """

    best: str
    m_best: float
    worst: str
    dominant: str
    margin: float
    k_exponent: float
    eps_exponent: float
    sub_leading: np.ndarray
    best_sub_leading: np.ndarray
    regime_exponent: float


def asymptotics(m: BlockMargins, best: str | None = None) -> Asymptotics:
    """The K → ∞ power law of the coupled SignGD ``ϱ^ε`` predicted from the margins.

    Derivation in :class:`Asymptotics` and ``docs/science.md#coupled-signgd``.

    Args:
      m: margins from :func:`block_margins`.
      best: label of the class that reaches ``1 - ε`` first, if known (e.g. measured at
        the K of interest); default: the K → ∞ best class, which may win only at
        astronomically large K.

    Raises:
      ValueError: if no class beats every answer of its own block with a positive
        smallest off-block margin (then no class reaches ``1 - ε`` as K grows), or ``best``
        is not a label of ``m``.
    """
    inb = _wrong_inblock(m)  # [n, b]
    off_min = m.offblock.min(axis=1)
    in_min = inb.min(axis=1)
    ok = (in_min > 0) & (off_min > 0)
    if not ok.any():
        raise ValueError("no class beats its own block with positive off-block margins")
    ib = int(np.argmax(np.where(ok, off_min, -np.inf)))
    if best is not None:
        if best not in m.names:
            raise ValueError(f"best must be one of {m.names}, got {best!r}")
        ib = m.names.index(best)
    mb = float(off_min[ib])
    e_off = 1.0 - off_min / mb  # growth exponent (in n) of the off-block mass
    e_in = -in_min / mb  # growth exponent of the largest own-block term
    iw = int(np.argmax(np.maximum(e_off, e_in)))
    off_dominates = e_off[iw] >= e_in[iw]
    mu = float(off_min[iw] if off_dominates else in_min[iw])
    k_exp = -(1.0 - mu / mb) if off_dominates else mu / mb
    offs = np.sort(m.offblock[iw])
    mu_in = float(in_min.min())  # the most negative own-block margin, if negative
    x = (mu - mu_in) / mb
    regime = x / (1.0 - x) if (mu_in < 0 and off_dominates and mu > 0 and x < 1) else 0.0
    return Asymptotics(
        best=m.names[ib],
        m_best=mb,
        worst=m.names[iw],
        dominant="off" if off_dominates else "in",
        margin=mu,
        k_exponent=float(k_exp),
        eps_exponent=float(-mu / mb),
        sub_leading=offs[1:] - offs[0],
        best_sub_leading=np.sort(m.offblock[ib])[1:] - mb,
        regime_exponent=float(regime),
    )
