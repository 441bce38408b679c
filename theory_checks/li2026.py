"""Checks of paper B: Li et al. 2026, "Muon in Associative Memory Learning: Training
Dynamics and Scaling Laws" (arXiv 2602.05725): the training dynamics (noiseless and noisy
rates, step counts, GD's stability threshold) and the helpers shared with
:mod:`theory_checks.li2026_scaling` (scaling laws) and :mod:`theory_checks.li2026_structure`
(implicit preconditioner, block symmetry, TRA-SignGD).

Statements from the paper's abstract and Sections 3-5; constants it leaves to "Θ(·)" are
worked out in the docstrings and marked ``derived``; sources and readings are listed in
``docs/science.md#paper-b``. Simulation in task space Ŵ = ẼᵀWE (``E = Ẽ = I``: with
orthonormal embeddings the dynamics do not depend on them, paper B Section 2; two checks
verify that), exact population gradients with label noise α, priors
``amemory.data.frequencies.hierarchical`` (M groups of C classes, p̃_g ∝ g^-β), float64;
large K uses the exact group-symmetric reduction :mod:`amemory.analysis.group_symmetric`.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from amemory.analysis.one_step import optimizer
from amemory.analysis.scaling import fit_line
from amemory.data.frequencies import hierarchical as prior  # (M, C, β) -> p [M C]
from theory_checks.common import CheckResult, Context, fit, fmt, half, register, trajectory


def lstar(K: int, noise: float) -> float:
    """Bayes loss: entropy of p(·|j) = (1-α) 1[i=j] + α/K, in nats."""
    a, b = 1 - noise + noise / K, noise / K
    return -a * math.log(a) - ((K - 1) * b * math.log(b) if b > 0 else 0.0)


def mstar(K: int, noise: float) -> float:
    """Optimal logit gap log(1 + K(1-α)/α) ([derived]: the margin of log p(·|j))."""
    return math.log(1 + K * (1 - noise) / noise)


def margin_loss(m, K: int, noise: float):
    """Per-class loss (nats) of a column whose correct logit leads every wrong one by ``m``
    ([derived]): ``a log(1 + (K-1)e^{-m}) + (1-a)(m + log(1 + (K-1)e^{-m}))``, a = 1-α+α/K."""
    import jax.numpy as jnp

    a = 1 - noise + noise / K
    lz = jnp.log1p((K - 1) * jnp.exp(-m))  # -log q_correct; a wrong answer: m + lz
    return a * lz + (1 - a) * (m + lz)


def switch_time(losses: np.ndarray, default: int) -> int:
    """The first step after which the loss rises (``default`` if it never does)."""
    rises = np.nonzero(np.diff(losses) > 0)[0]
    return int(rises[0]) if rises.size else default


@functools.cache
def runner(M: int, C: int, beta: float, noise: float, opt: str, steps: int, what: str):
    """Jitted ``run(lr, n_active) -> records [steps + 1, ...]`` in task space.

    Steps with index >= n_active leave Ŵ unchanged, so one compiled function serves every
    horizon T <= steps. ``what``: "loss" returns the total loss [steps + 1]; otherwise
    ``(loss, extra)`` with extra "per_class" (per-class losses [steps + 1, K]), "probs"
    (p̂ [steps + 1, K, K], row j = query j) or "precond" (‖msgn(P - P̂) - I‖_max for the
    joint and the conditional reading, [steps + 1, 2]).
    """
    import jax
    import jax.numpy as jnp

    from amemory.analysis import one_step
    from amemory.data import frequencies
    from amemory.models import memory

    K = M * C
    p = jnp.asarray(frequencies.hierarchical(M, C, beta))
    eye = jnp.eye(K)
    loss = lambda w: memory.population_loss(w, eye, eye, p, noise)
    target = (1 - noise) * eye + noise / K  # p(i|j), [i, j]

    def record(w):
        out = {"loss": loss(w)}
        if what == "per_class":
            out["per_class"] = memory.per_class_loss(w, eye, eye, noise)
        elif what == "probs":
            out["probs"] = memory.probabilities(w, eye, eye)
        elif what == "precond":
            cond = target - memory.probabilities(w, eye, eye).T  # P - P̂ (conditional), [i, j]
            msgn = lambda x: -one_step.unit_update("muon", x)  # Muon's direction of x
            dev = lambda x: jnp.max(jnp.abs(msgn(x) - eye))
            out["precond"] = jnp.stack([dev(cond * p[None, :]), dev(cond)])
        return out

    @jax.jit
    def run(lr, n_active):
        tx = optimizer(opt, lr)
        w0 = jnp.zeros((K, K))

        def body(carry, t):
            w, s = carry
            u, s = tx.update(jax.grad(loss)(w), s, w)
            w = jnp.where(t < n_active, w + u, w)
            return (w, s), record(w)

        _, recs = jax.lax.scan(body, (w0, tx.init(w0)), jnp.arange(steps))
        return jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), record(w0), recs)

    def call(lr, n_active=steps):
        out = {k: np.asarray(v) for k, v in run(lr, n_active).items()}
        return out["loss"] if what == "loss" else (out["loss"], out[what])

    return call


def gd_scalar(M: int, C: int, beta: float, noise: float, steps: int, eta: float | None = None):
    """GD reduced to one logit margin per group ([derived]: in task space GD decouples by column).

    From Ŵ_0 = 0, column j keeps all wrong logits equal, so its state is the margin m_j,
    and ``m ← m + η p_j [(1-α) - (1 - e^{-m})/(1 + (K-1)e^{-m})]``. Returns the total
    excess loss ``L(t) - L*`` for t = 0..steps (float64 [steps + 1]) and the per-group
    margins at the end. ``eta`` defaults to 1/p_1.
    """
    import jax
    import jax.numpy as jnp

    K = M * C
    pg = jnp.asarray(prior(M, 1, beta))  # group masses p̃_g
    p = pg / C
    eta = float(1.0 / p[0]) if eta is None else eta
    ls = lstar(K, noise)

    @jax.jit
    def run(m0):
        def body(m, _):
            e = jnp.exp(-m)
            m = m + eta * p * ((1 - noise) - (1 - e) / (1 + (K - 1) * e))
            return m, jnp.dot(pg, margin_loss(m, K, noise)) - ls

        m, ex = jax.lax.scan(body, m0, length=steps)
        return m, jnp.concatenate([(jnp.dot(pg, margin_loss(m0, K, noise)) - ls)[None], ex])

    m, ex = run(jnp.zeros(M))
    return np.asarray(ex), np.asarray(m)


def full_space_run(K: int, class_prior, noise: float, opt: str, lr: float, steps: int, seed: int):
    """Per-class losses [steps + 1, K] with Haar-random orthonormal E, Ẽ (d = K)."""
    import jax
    import jax.numpy as jnp

    from amemory.models import memory

    E, Et = memory.random_orthonormal(K, K, jax.random.key(seed))
    p = jnp.asarray(class_prior)
    loss = lambda w: memory.population_loss(w, E, Et, p, noise)
    rec = lambda w: memory.per_class_loss(w, E, Et, noise)
    return trajectory(opt, lr, loss, jnp.zeros((K, K)), steps, rec)


@register("li2026.gd_noiseless_per_class")
def gd_noiseless(ctx: Context) -> CheckResult:
    """Noiseless GD: L_j(t) ≍ 1/(p_j η t), i.e. L_j·p_j·η·t tends to one constant.

    Random orthonormal embeddings, η = 1/p_1, s_j = η p_j T >= 250 for every class.
    [derived] constant: column j's margin obeys e^m + (K-1)m ≈ K s + 1 (continuous time),
    so L_j s_j → (K-1)/K with relative correction ≈ (K-1) log(K s)/(K s); tolerance twice
    that at the smallest s_j (the discrete steps) plus 1e-3.
    """
    M, C, beta = 4, 6, 1.5
    K = M * C
    T = 2000 if ctx.quick else 4000
    pr = prior(M, C, beta)
    eta = 1.0 / pr[0]
    losses = full_space_run(K, pr, 0.0, "gd", eta, T, seed=1)
    s = eta * pr * T
    c = losses[-1] * s
    pred = (K - 1) / K
    tol = 2 * (K - 1) * math.log(K * s.min()) / (K * s.min()) + 1e-3
    err = float(np.max(np.abs(c - pred)))
    return CheckResult(
        statement="Noiseless GD: L_j(t) ≍ 1/(p_j η t) (total ≍ K/(ηt))",
        predicted=f"L_j p_j η t → {fmt(pred, 4)} for every j [constant derived]",
        measured=f"L_j p_j η T ∈ [{fmt(c.min(), 4)}, {fmt(c.max(), 4)}] (T={T}, "
        f"s_j ≥ {fmt(s.min())}); total·ηT/K = {fmt(float(pr @ losses[-1]) * eta * T / K, 4)}",
        tolerance=f"±{fmt(tol)}",
        passed=err <= tol,
        details={"c": c.tolist(), "s": s.tolist()},
    )


@register("li2026.muon_noiseless_exponential")
def muon_noiseless(ctx: Context) -> CheckResult:
    """Noiseless Muon: L_j(t) ≍ K exp(-(1+o(1)) η t) uniformly in j.

    K = 24, 40 steps. Measured: (i) the decay rate r of the total loss (log L = a - r·t
    fitted over the second half) against η, tolerance 5% + CI (the o(1): Muon's diagonal
    step is η(1 - O(1/K)), O(1/K) ≈ 4%); (ii) uniformity: max_j |log(L_j(T)/(K e^{-ηT}))|
    /(ηT) ≤ 0.1 (the o(1); Muon's step differs across groups by O(M/C)); (iii) embedding
    invariance: random orthonormal E, Ẽ give the task-space losses to 1e-9 relative.
    """
    M, C, beta, eta, T = 4, 6, 1.5, 0.5, 40
    K = M * C
    _, task = runner(M, C, beta, 0.0, "muon", T, "per_class")(eta)
    full = full_space_run(K, prior(M, C, beta), 0.0, "muon", eta, T, seed=2)
    inv = float(np.max(np.abs(full - task) / task))
    total = task @ prior(M, C, beta)
    t = np.arange(T + 1)
    sel = t >= T // 2
    f = fit(np.exp(t[sel]), total[sel])
    rate = -f.slope
    expo = float(np.max(np.abs(np.log(task[-1] / (K * math.exp(-eta * T))))) / (eta * T))
    ok = abs(rate / eta - 1) <= 0.05 + half(f) / eta and expo <= 0.1 and inv < 1e-9
    return CheckResult(
        statement="Noiseless Muon: L_j(t) ≍ K e^{-(1+o(1))ηt}, uniformly in j",
        predicted=f"rate η = {eta}; max_j |log(L_j/(K e^-ηT))|/(ηT) = o(1); embedding-free",
        measured=f"rate {fmt(rate, 4)} (CI ±{fmt(half(f))}); L(T)/(K e^-ηT) = "
        f"{fmt(total[-1] / (K * math.exp(-eta * T)), 3)}; per-class exponent dev. "
        f"{fmt(expo, 3)}; full vs task rel. diff {fmt(inv)}",
        tolerance="rate ±5%+CI; exponent dev. ≤ 0.1; 1e-9",
        passed=ok,
    )


@register("li2026.muon_noisy_switch")
def muon_noisy(ctx: Context) -> CheckResult:
    """Noisy Muon: descent (≈ K e^{-ηt} + αηt) then oscillation (≈ η² + L*), switch at
    Θ(log K / η).

    Label noise α = 0.1, K up to 128, several η, run to twice the predicted switch time
    t_s (the first step where the loss rises). [derived] Muon moves every margin by ≈ η
    per step, so the loss bottoms out at the optimal gap m* (:func:`mstar`): t_s ≈ m*/η;
    tolerance t_s η/m* ∈ [0.8, 1.25] (a step of rounding, η/m* ≤ 0.09, plus the O(M/C)
    deviation of Muon's diagonal step). Oscillation: the excess after t_s + 2 over η²
    stays below 1 (the per-margin bound is ℓ''·η²/2 ≤ η²/8) and the loss is monotone
    before t_s. Descent: with every margin at m = ηt the per-class loss is
    :func:`margin_loss` ≈ K e^{-ηt} + α η t (the paper's shape); the measured excess must
    follow it within 5% (relative; the deviation is O(1/K)) over the first 3/4 of the
    descent (near t_s the excess itself goes to 0).
    """
    M, beta, noise = 4, 1.5, 0.1
    Cs = [8, 16] if ctx.quick else [8, 32]
    etas = [0.2, 0.4] if ctx.quick else [0.2, 0.4, 0.8]
    rows, ok = [], True
    for C in Cs:
        K = M * C
        ms = mstar(K, noise)
        steps = int(2 * ms / min(etas)) + 4
        for eta in etas:
            n = int(2 * ms / eta) + 4
            L = runner(M, C, beta, noise, "muon", steps, "loss")(eta, n)[: n + 1]
            ts = switch_time(L, n)
            exc = (L[ts + 2 :] - lstar(K, noise)) / eta**2
            osc = float(exc.max()) if exc.size else float("nan")
            ratio = ts * eta / ms
            # descent: excess vs ℓ(ηt) - L*, every margin m = ηt, wrong logits equal
            m = eta * np.arange(int(0.75 * ts))
            curve = np.asarray(margin_loss(m, K, noise)) - lstar(K, noise)
            desc = float(np.max(np.abs(L[: m.size] - lstar(K, noise) - curve) / curve))
            rows.append((K, eta, ts, ratio, osc, desc))
            ok &= 0.8 <= ratio <= 1.25 and osc < 1 and bool(np.all(np.diff(L[: ts + 1]) <= 0))
            ok &= desc <= 0.05
    return CheckResult(
        statement="Noisy Muon: descent ≈ K e^{-ηt} + αηt, then oscillation ≈ η² + L*; "
        "switch time Θ(log K/η)",
        predicted="t_s·η/m* ≈ 1 (m* = log(1+K(1-α)/α)); descent excess = ℓ(ηt) - L*; "
        "max excess/η² after t_s bounded",
        measured="; ".join(
            f"K={K} η={eta}: t_s={ts}, t_sη/m*={fmt(r, 3)}, exc/η²≤{fmt(o, 2)}, "
            f"descent dev {fmt(d, 2)}"
            for K, eta, ts, r, o, d in rows
        ),
        tolerance="t_sη/m* ∈ [0.8, 1.25]; exc/η² < 1; descent dev ≤ 5%",
        passed=ok,
        details={"rows": rows},
    )


@register("li2026.gd_stability_threshold")
def gd_stability(ctx: Context) -> CheckResult:
    """Linear stability of GD at the minimiser requires η p_1 ≲ 1.

    GD starts at the minimiser Ŵ* (columns log p(·|j)) plus a 1e-7 perturbation, at
    η = f·η_c. [derived] The task-space Hessian is block-diagonal, column j's block
    p_j(diag q - q qᵀ) with q = p(·|j), so GD is linearly stable iff
    η p_1 < 2/λ_max(diag q - q qᵀ) (numpy's eigvalsh). Measured: growth of the perturbation
    (column means removed: softmax ignores them); it must decay for f < 1 and grow for
    f > 1, for two priors whose p_1 differ: the threshold is a condition on η p_1 alone.
    """
    import jax
    import jax.numpy as jnp

    from amemory.models import memory

    M, C, noise, steps = 4, 5, 0.1, 300
    K = M * C
    q = (1 - noise) * np.eye(K)[0] + noise / K
    lam = float(np.linalg.eigvalsh(np.diag(q) - np.outer(q, q)).max())
    thr = 2.0 / lam  # critical η p_1
    fs = [0.9, 0.98, 1.02, 1.1]
    eye = jnp.eye(K)
    wstar = jnp.log((1 - noise) * eye + noise / K)  # [i, j]: column j = log p(·|j)
    pert = 1e-7 * jax.random.normal(jax.random.key(3), (K, K))
    proj = lambda w: w - w.mean(axis=0, keepdims=True)
    rows, ok = [], True
    record = lambda w: jnp.linalg.norm(proj(w - wstar)) / jnp.linalg.norm(proj(pert))
    for beta in (1.5, 3.0):
        p = jnp.asarray(prior(M, C, beta))
        loss = lambda w, p=p: memory.population_loss(w, eye, eye, p, noise)
        rates = np.repeat(np.array(fs)[:, None] * thr / float(p[0]), steps, axis=1)  # [f, t]
        growth = trajectory("gd", rates, loss, wstar + pert, steps, record)[:, -1]
        for f, g in zip(fs, growth.tolist(), strict=True):
            rows.append((beta, f, g))
            ok &= (g < 1) if f < 1 else (g > 1)
    return CheckResult(
        statement="GD at the minimiser is linearly stable only if η p_1 ≲ 1",
        predicted=f"threshold η p_1 = 2/λ_max(diag q - qqᵀ) = {fmt(thr, 4)} (α = {noise}) "
        "[derived constant], same for every prior",
        measured=", ".join(f"β={b} f={f}: ×{fmt(g, 2)}" for b, f, g in rows),
        tolerance="decay for f < 1, growth for f > 1 (±2% bracket)",
        passed=ok,
        details={"rows": rows, "threshold": thr},
    )


def _steps_to(losses: np.ndarray, targets) -> list[int]:
    """First step t with losses[t] <= ε, for each ε of ``targets`` (must be reached)."""
    out = []
    for e in targets:
        hit = np.nonzero(losses <= e)[0]
        if not hit.size:
            raise RuntimeError(f"loss {losses[-1]:.3g} never reached ε = {e}")
        out.append(int(hit[0]))
    return out


@register("li2026.noiseless_step_counts")
def step_counts(ctx: Context) -> CheckResult:
    """Noiseless step counts to reach loss ε: Muon O(log 1/ε), GD O(1/ε), fitted slopes.

    Reading: the steps n(ε) to bring the total loss below ε grow like log(1/ε) for Muon
    and like 1/ε for GD (paper B's exponential speed-up). Noiseless, K = 24, exact
    group-symmetric reduction (validated by ``li2026.block_symmetry``). Muon: fit
    n = a + b·ln(1/ε), predicted b = 1/η ([derived] from L ≈ K e^{-ηt}), tolerance 5% + CI
    (the O(1/K) shift of ``li2026.muon_noiseless_exponential``). GD at η = 1/p_1, where
    every s_j = η p_j t exceeds 250: fit log n = c + s·log(1/ε), predicted s = 1
    ([derived] from L_j ≈ (K-1)/(K s_j) up to the factor (1 + (K-1) log(K s_j)/(K s_j))),
    tolerance CI + twice that correction at the smallest s_j (as in
    ``li2026.gd_noiseless_per_class``) + 1e-3. Muon's log-log slope is reported.
    """
    from amemory.analysis import group_symmetric as gs

    M, C, beta = 4, 6, 1.5
    K = M * C
    pg = prior(M, 1, beta)
    eps_m = np.geomspace(1e-2, 1e-12, 11)
    lm, _ = gs.run("muon", pg, C, 0.0, 0.5, 80)
    nm = _steps_to(lm, eps_m)
    fm = fit_line(np.log(1 / eps_m), nm)
    eps_g = np.geomspace(1e-3, 1e-4 if ctx.quick else 1e-5, 6)
    eta_g = C / pg[0]  # 1/p_1 with p_1 = p̃_1 / C
    lg, _ = gs.run("gd", pg, C, 0.0, eta_g, 30000 if ctx.quick else 300000)
    ng = _steps_to(lg, eps_g)
    fg = fit(1 / eps_g, ng)
    s_min = eta_g * (pg[-1] / C) * ng[0]  # smallest η p_j t at the first target
    corr = 2 * (K - 1) * math.log(K * s_min) / (K * s_min) + 1e-3
    ok_m = abs(fm.slope * 0.5 - 1) <= 0.05 + half(fm) * 0.5
    ok_g = abs(fg.slope - 1) <= half(fg) + corr
    muon_loglog = fit(1 / eps_m, nm).slope
    return CheckResult(
        statement="Noiseless: steps to reach loss ε are O(log 1/ε) for Muon, O(1/ε) for GD",
        predicted="Muon n = a + (1/η) ln(1/ε), 1/η = 2; GD n ∝ ε^-1",
        measured=f"Muon {fm.describe()} (n = {nm[0]}..{nm[-1]} for ε = 1e-2..1e-12; log-log "
        f"slope {fmt(muon_loglog, 3)}); GD log-log {fg.describe()} (n = {ng[0]}..{ng[-1]})",
        tolerance=f"Muon ±5%+CI; GD ±{fmt(half(fg) + corr)}",
        passed=ok_m and ok_g,
        details={"muon": {"eps": eps_m.tolist(), "n": nm}, "gd": {"eps": eps_g.tolist(), "n": ng}},
    )
