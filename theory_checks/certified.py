"""Closed forms certified by ball arithmetic (python-flint's ``arb``, 128 bits) over ranges.

A certified check proves ``|D(x)| <= tol`` for every x of a stated interval, where D is a
model-side expression minus the closed form. :func:`certify` bisects the interval; on a
box ``X = m ± h`` it encloses D by its Taylor model ``Σ_{k<n} D_k(m) t^k + D_n(X) t^n``,
``t ∈ [-h, h]`` (``D_k`` the Taylor coefficients, from ``arb_series``; the last one over
the whole box is the Lagrange remainder), so an exact identity needs few boxes. Integer
parameters (K) are enumerated exactly. A pass is a proof for the stated range up to the
correctness of Arb (Johansson, "Arb: efficient arbitrary-precision midpoint-radius
interval arithmetic", IEEE Trans. Computers 2017); the float checks these re-express
live in the paper modules.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

from theory_checks.common import CheckResult, Context, fmt, register
from theory_checks.wang2025 import ALPHA, BETA


def certify(
    D: Callable, lo: float, hi: float, tol: float, order: int = 6
) -> tuple[bool, float, int]:
    """Whether ``|D(x)| <= tol`` on ``[lo, hi]``; returns (proved, largest bound, boxes).

    ``D`` maps an ``arb_series`` (order >= 1) or an ``arb`` ball (order 0) to the same.
    Gives up (False) on a box narrower than 1e-12 of the range or after 20000 boxes.
    """
    from flint import arb, ctx

    ctx.prec = 128
    stack, worst, n = [(arb(lo), arb(hi))], 0.0, 0
    while stack:
        a, b = stack.pop()
        n += 1
        m, h = (a + b) / 2, ((b - a) / 2).upper()
        t = arb(0, h)
        try:
            enc = D(m + t) if not order else _taylor(D, m, t, order)
            bound = float(abs(enc).upper())
        except (ValueError, ZeroDivisionError):  # a ball too wide for a division or root
            bound = math.inf
        if bound <= tol:
            worst = max(worst, bound)
        elif h < 1e-12 * (hi - lo) or n > 20000:
            return False, bound, n
        else:
            stack += [(a, m), (m, b)]
    return True, worst, n


def _taylor(D: Callable, m, t, order: int):
    """Σ_{k<n} D_k(m) t^k + D_n(m + t) t^n (Horner: t**0 of a ball around 0 is NaN in Arb)."""
    from flint import arb, arb_series

    at_m = D(arb_series([m, 1], prec=order))
    cm = [at_m[k] for k in range(order)] + [D(arb_series([m + t, 1], prec=order + 1))[order]]
    enc = arb(0)
    for c in reversed(cm):
        enc = enc * t + c
    return enc


def _result(statement, predicted, rng, tol, outcomes, kind="derived", **details) -> CheckResult:
    ok = all(o[0] for o in outcomes)
    worst, boxes = max(o[1] for o in outcomes), sum(o[2] for o in outcomes)
    return CheckResult(statement=statement, predicted=predicted, kind=kind, certified=rng,
                       measured=f"max enclosure {fmt(worst)} over {boxes} boxes", tolerance=tol,
                       passed=ok, details={"worst": worst, "boxes": boxes, **details})  # fmt: skip


def _gd_tail(K: int, r: Callable, rho: Callable, eps: Callable) -> Callable:
    """D(u) = q/closed - 1: q the probability of a class whose prior is r(u) times the top
    class's (softmax of the one-step GD logits, with their -η p/K terms) when the top
    class reaches 1 - ε(u); closed = x^ρ/(x^ρ + K - 1), x = (1/ε - 1)(K - 1)."""
    from flint import arb

    def D(u):
        e = eps(u)
        eta_p = ((1 - e) * (K - 1) / e).log()  # η p_max at the first crossing
        top = (eta_p * r(u) * (1 - arb(1) / K)).exp()
        q = top / (top + (K - 1) * (-eta_p * r(u) / K).exp())
        xr = (((1 / e - 1) * (K - 1)).log() * rho(u)).exp()
        return q / (xr / (xr + K - 1)) - 1

    return D


@register("wang2025.thm53_gd_closed_form.certified")
def gd_closed_form(ctx: Context) -> CheckResult:
    """Certified: one-step GD balance equals x^r/(x^r + K - 1) for every ε ∈ [1e-4, 1e-2].

    Model side: the two-level prior's tail class (p = (1-α)/(K-L)) after the GD step at
    which the head class (p = α/L) reaches 1 - ε; r = β(1-α)/(α(1-β)) from Thm 5.3's
    formula (not from the ratio of the two p). Every K ≡ 0 (mod 5) in the range (L = K/5).
    """
    from flint import arb

    Ks = range(60, 241, 60) if ctx.quick else range(60, 961, 5)
    alpha, beta = arb(str(ALPHA)), arb(str(BETA))  # the decimals, not their binary floats
    u = alpha * (1 - beta) / (beta * (1 - alpha))
    r_thm = 1 / u if u > 1 else u
    out = []
    for K in Ks:
        L = K // 5
        r = (1 - alpha) / (K - L) / (alpha / L)  # tail over head prior
        D = _gd_tail(K, lambda v, r=r: r, lambda v: r_thm, lambda v: v.exp())
        out.append(certify(D, math.log(1e-4), math.log(1e-2), 1e-12))
    rng = f"every K ≡ 0 (mod {Ks.step}) in [60, {Ks[-1]}], ε ∈ [1e-4, 1e-2]"
    return _result("Thm 5.3 (GD): ϱ^ε = x^r/(x^r+K-1) on the whole range", "|ϱ/closed - 1| ≤ 1e-12",
                   rng, "1e-12 rel.", out)  # fmt: skip


@register("wang2025.gd_one_step_rho.certified")
def gd_one_step_rho(ctx: Context) -> CheckResult:
    """Certified: ``one_step.gd_one_step_rho``'s closed form for Zipf priors p_k ∝ k^-a.

    Model side as in :func:`gd_closed_form` with r = p_K/p_1 = K^-a, for every Zipf
    exponent a ∈ [0.5, 2] (the variable) at ε = 0.01, K ∈ {10, 100, 1000}; the library's
    float value at a = 0.5, 1, 2 must lie within 1e-12 relative of the certified value.
    """
    import numpy as np
    from flint import arb

    from amemory.analysis import one_step

    out, lib, Ks = [], 0.0, (100,) if ctx.quick else (10, 100, 1000)
    for K in Ks:
        r = lambda a, K=K: (-a * arb(K).log()).exp()  # noqa: E731  (p_K / p_1)
        rho = lambda a, K=K: (-a * arb(K).log()).exp()  # noqa: E731  (the library's r)
        D = _gd_tail(K, r, rho, lambda a: arb("0.01"))
        out.append(certify(D, 0.5, 2.0, 1e-12))
        for a in (0.5, 1.0, 2.0):
            p = np.arange(1, K + 1, dtype=np.float64) ** -a
            x = (1 / arb("0.01") - 1) * (K - 1)
            rho = (x.log() * arb(K) ** -arb(a)).exp()
            exact = rho / (rho + K - 1)
            lib = max(
                lib, float(abs(one_step.gd_one_step_rho(p / p.sum(), 0.01) / exact - 1).upper())
            )
    out.append((lib <= 1e-12, lib, 0))
    return _result("gd_one_step_rho: ϱ^ε = x^r/(x^r+K-1), r = p_min/p_max, any prior",
                   "|ϱ/closed - 1| ≤ 1e-12; library float within 1e-12",
                   f"Zipf a ∈ [0.5, 2], ε = 0.01, K ∈ {Ks}", "1e-12 rel.", out,
                   library_err=lib)  # fmt: skip


@register("wang2025.propF3_singular_values_of_X.certified")
def prop_f3(ctx: Context) -> CheckResult:
    """Certified: the outlying singular value of X is sqrt((a²(K-L) + b²L)/K) (Prop. F.3).

    XᵀX = diag(p)² - ppᵀ/K (since X = diag(p) - 1pᵀ/K); on span(1_head, 1_tail) it acts
    as the 2x2 matrix M below, whose eigenvalues (quadratic formula) must be σ² and 0.
    Variable: the head mass α ∈ [0.55, 0.95]; every K ≡ 0 (mod 5), L = K/5.
    """
    from flint import arb

    out = []
    for K in range(60, 121 if ctx.quick else 961, 5 if ctx.quick else 15):
        L = K // 5

        def eig(al, K=K, L=L):  # (λ_max/σ²_pred - 1, λ_min/a²)
            a, b = al / L, (1 - al) / (K - L)
            m11, m12 = a * a * (1 - arb(L) / K), -a * b * (K - L) / K
            m21, m22 = -a * b * L / K, b * b * (1 - arb(K - L) / K)
            tr, det = m11 + m22, m11 * m22 - m12 * m21
            lo = 2 * det / (tr + (tr * tr - 4 * det).sqrt())  # the small root, stably
            return (tr - lo) / ((a * a * (K - L) + b * b * L) / K) - 1, lo / (a * a)

        out.append(certify(lambda al, e=eig: e(al)[0], 0.55, 0.95, 1e-12))
        out.append(certify(lambda al, e=eig: e(al)[1], 0.55, 0.95, 1e-12))
    rng = f"α ∈ [0.55, 0.95], K ≡ 0 (mod {5 if ctx.quick else 15}) in [60, {K}], L = K/5"
    return _result("Prop. F.3: the non-trivial singular values of X are σ and 0", "exact", rng,
                   "1e-12", out, kind="paper")  # fmt: skip


@register("li2026.gd_noiseless_per_class.certified")
def li_gd_rate(ctx: Context) -> CheckResult:
    """Certified: L_j s_j → (K-1)/K with |L s - (K-1)/K| ≤ 2 (K-1) log(Ks)/(Ks) (Li et al.).

    Continuous-time GD on one column: margin m with e^m + (K-1) m = Ks + 1 (s = η p_j t),
    loss L = log(1 + (K-1) e^-m). Variable: the margin m, over an interval whose s(m)
    covers s ∈ [250, 1e6] (the float check's range); K = 24.
    """
    from flint import arb

    K = 24

    def D(m):  # the margin is the variable: s and L are explicit in it
        s = (m.exp() + (K - 1) * m - 1) / K
        loss = (1 + (K - 1) * (-m).exp()).log()
        return (loss * s - arb(K - 1) / K) / (2 * (K - 1) * (K * s).log() / (K * s))

    m_lo, m_hi = math.log(K * 250) - 1, math.log(K * 1e6)  # s(m_lo) < 250, s(m_hi) > 1e6
    S = [((arb(m).exp() + (K - 1) * arb(m) - 1) / K) for m in (m_lo, m_hi)]
    out = [certify(D, m_lo, m_hi, 1.0), (S[0] < 250 and S[1] > 1e6, 0.0, 0)]
    return _result("Noiseless GD: L_j p_j η t → (K-1)/K within 2(K-1)log(Ks)/(Ks)", "ratio ≤ 1",
                   "s = η p_j t ∈ [250, 1e6], K = 24", "1 (the bound)", out)  # fmt: skip


@register("wang2025.thm53_signgd_block_reduction.certified")
def block_reduction(ctx: Context) -> CheckResult:
    """Certified: the per-block reduction equals the dense SignGD step for every η ∈ [0, 10].

    Dense: amemory's task-space update of one ``signgd`` step (coupled embeddings, float64,
    as in ``wang2025.thm53_signgd_block_reduction``), q_k(η) = 1/Σ_i e^{-η(D̂_kk - D̂_ik)}
    in ball arithmetic; reduced: :mod:`amemory.analysis.signgd_blocks`' margins. One class
    per distinct label, K = 90, L ≡ 0, 1, 2 (mod 3); η is the variable. Tolerance 1e-10:
    the dense update carries the float64 rounding of its K³ products (1e-13 here).
    """
    import jax
    import numpy as np
    from flint import arb

    from amemory.analysis import one_step, signgd_blocks
    from amemory.data import frequencies
    from amemory.models import memory
    from theory_checks.wang2025_signgd import RESIDUES, _margins

    K, out = 90, []
    E, Et = memory.coupled_rotation(K)
    for res in RESIDUES[:1] if ctx.quick else RESIDUES:
        L = 3 * (round(K / 5) // 3) + res
        p = frequencies.two_level(K, ALPHA, L / K)
        g = jax.grad(memory.population_loss)(jax.numpy.zeros((K, K)), E, Et, p)
        dhat = np.asarray(memory.task_space(one_step.unit_update("signgd", g), E, Et))
        m = _margins(K, L)
        label = signgd_blocks.per_class(m, np.arange(len(m.names))[None].astype(float))[0]
        for i in range(1 if ctx.quick else len(m.names)):
            k = int(np.flatnonzero(label == i)[0])
            col = [arb(float(x)) for x in dhat[k, k] - dhat[:, k]]
            inb, off = ([arb(float(x)) for x in row] for row in (m.inblock[i], m.offblock[i]))

            def D(eta, col=col, inb=inb, off=off, n=m.n_other):
                ex = lambda xs: sum((-eta * x).exp() for x in xs)  # noqa: E731
                red = ex(inb) + n * ex(off)
                return 1 / ex(col) - 1 / red

            out.append(certify(D, 0.0, 10.0, 1e-10))
    rng = f"η ∈ [0, 10], K = 90, L mod 3 ∈ {RESIDUES[:1] if ctx.quick else RESIDUES}, " + (
        "class head0" if ctx.quick else "every distinct class"
    )
    return _result("SignGD's coupled step reduces exactly to 3x3 blocks, for all η",
                   "dense q = reduced q", rng, "1e-10", out)  # fmt: skip


def _sign_pattern(res: int, u):
    """Signs of ``G_cc`` and ``R_k p_c`` for the head and the straddling block at lattice
    ``K = 15/u``, ``L = 3/u + res`` (u a ball; None where a sign is not decided), and the
    margins they give (``amemory.analysis.signgd_blocks``' derivation, in Arb)."""
    from flint import arb

    from amemory.models import memory

    al = arb(str(ALPHA))
    rk, rv = _zyz(*memory.COUPLED_KEY_ANGLES), _zyz(*memory.COUPLED_VALUE_ANGLES)
    rho = (1 - al) * (3 + res * u) / (al * (12 - res * u))  # tail over head prior
    sign = lambda x: 1 if x > 0 else (-1 if x < 0 else None)  # noqa: E731
    ones = [sum(rv[i]) for i in range(3)]
    v = [sum(rv[k][l] * sign(ones[k]) for k in range(3)) for l in range(3)]
    signs, margins = [], []
    for pc in ([arb(1)] * 3, [arb(1)] * res + [rho] * (3 - res)):
        rkp = [sum(rk[i][j] * pc[j] for j in range(3)) for i in range(3)]
        g = [[sum(rv[i][l] * pc[l] * rk[j][l] for l in range(3)) - ones[i] * rkp[j] * u / 15
              for j in range(3)] for i in range(3)]  # fmt: skip
        s = [[sign(x) for x in row] for row in g]
        signs += [x for row in s for x in row] + [sign(x) for x in rkp]
        if None in signs:
            return tuple(signs), None
        tc = [[sum(rv[k][l] * s[k][m] * rk[m][j] for k in range(3) for m in range(3))
               for j in range(3)] for l in range(3)]  # fmt: skip
        w = [sum(rk[k][j] * sign(rkp[k]) for k in range(3)) for j in range(3)]
        margins += [[tc[j][j] - tc[l][j] for l in range(3)]
                    + [tc[j][j] + v[l] * w[j] for l in range(3)] for j in range(3)]  # fmt: skip
    return tuple(signs), margins


@functools.cache
def _zyz(a: float, b: float, c: float):
    """R_z(a) R_y(b) R_z(c) in Arb (``memory.zyz_rotation``'s formula)."""
    from flint import arb

    ca, sa, cb, sb, cc, sc = (f(arb(x)) for x in (a, b, c) for f in (arb.cos, arb.sin))
    rz = lambda c_, s_: [[c_, -s_, arb(0)], [s_, c_, arb(0)], [arb(0), arb(0), arb(1)]]  # noqa: E731
    ry = [[cb, arb(0), sb], [arb(0), arb(1), arb(0)], [-sb, arb(0), cb]]
    mul = lambda x, y: [
        [sum(x[i][k] * y[k][j] for k in range(3)) for j in range(3)] for i in range(3)
    ]  # noqa: E731
    return mul(mul(rz(ca, sa), ry), rz(cc, sc))


@register("wang2025.thm53_signgd_regime_change.certified")
def regime_margins(ctx: Context) -> CheckResult:
    """Certified: the margins behind the coupled-SignGD exponents are the same for every
    lattice K >= K0 (K = 15m, L = 3m + L mod 3), so the exponents hold on that range.

    The sign pattern of the diagonal blocks of ∇L (head and straddling/tail block) is
    decided by Arb on every box of u = 1/m ∈ [0, 15/K0] (bisection until no sign is
    undecided) and must be one pattern; K0 is the smallest lattice K from which that is
    proved (it passes with K0 <= 900; for L ≡ 1 the pattern changes between K = 150 and
    300, later than the float check's "K >= 90"). Its margins (exact from the ZYZ angles) must match
    the float margins that ``wang2025.thm53_signgd_regime_change`` uses to 1e-12; for
    L ≡ 1 the straddling class 2's off-block margins must all be negative (s = 0).
    """
    del ctx  # cheap: a few hundred 3x3 products
    from flint import arb, ctx

    ctx.prec = 128
    from theory_checks.wang2025_signgd import RESIDUES, _asym, _lattice, _margins

    out, exps, k0 = [], [], []
    for res in RESIDUES:
        stack, boxes = [(0.0, 1 / 6)], []
        while stack:  # boxes of u with their sign pattern (None: undecided, width < 1e-4)
            a, b = stack.pop()
            sig, margins = _sign_pattern(res, arb((a + b) / 2, (b - a) / 2))
            if margins is None and b - a > 1e-4:
                stack += [(a, (a + b) / 2), ((a + b) / 2, b)]
            else:
                boxes.append((a, b, sig if margins is not None else None))
        boxes.sort()
        top = next((a for a, _, sig in boxes if sig != boxes[0][2]), 1 / 6)  # u* (pattern ends)
        k0.append(15 * math.ceil(1 / top - 1e-9))
        _, margins = _sign_pattern(res, arb(0))
        fm = _margins(*_lattice(15 * 10**60, res))
        ref = [list(i) + list(o) for i, o in zip(fm.inblock, fm.offblock, strict=True)]
        ref = ref[:6]  # head block, then the straddling (or a tail) block
        err = max(float(abs(x - y).upper()) for r1, r2 in zip(margins, ref, strict=True)
                  for x, y in zip(r1, r2, strict=True))  # fmt: skip
        neg = res != 1 or all(x < 0 for x in margins[5][3:])
        out.append((err <= 1e-12 and neg and k0[-1] <= 900, err, len(boxes)))
        exps.append(_asym(res).regime_exponent)
    rng = "every lattice K ≥ K0, K0 = " + ", ".join(f"{k} (L≡{r})" for r, k in enumerate(k0))
    return _result("Coupled SignGD: one sign pattern, hence one set of margins and exponents, "
                   "for every lattice K ≥ K0", "one pattern; margins = the float ones", rng,
                   "margins 1e-12", out, exponents=exps, k0=k0)  # fmt: skip
