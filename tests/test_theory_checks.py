"""theory_checks: the quick suite passes (in a subprocess, so its float64 flag stays there),
and the harness (selection, tables, README update, CLI errors) behaves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from theory_checks import cli, common

# Checks that fail on purpose: a statement (docs/science.md) that does not hold in
# simulation, with the evidence in the check's docstring. Empty since the coupled-SignGD
# statement was corrected; a check that fails must be added here with its reason.
KNOWN_FINDINGS: set[str] = set()

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("checks")
    cmd = [sys.executable, "-m", "theory_checks", "--quick", "--json", str(out / "r.json")]
    cmd += ["--out", str(out / "fig")]
    proc = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=dict(os.environ)
    )
    return proc, json.loads((out / "r.json").read_text()), out


def test_quick_suite_passes(quick_run):
    proc, doc, _ = quick_run
    results = doc["results"]
    failed = {r["name"] for r in results if not r["passed"]}
    errors = [r["measured"] for r in results if r["measured"].startswith("error")]
    assert not errors, errors
    assert failed == KNOWN_FINDINGS, (failed, proc.stderr[-2000:])
    assert proc.returncode == (1 if failed else 0)
    cli._load()
    assert {r["name"] for r in results} == set(common.REGISTRY)
    assert all(r["kind"] in common.KINDS for r in results)
    assert doc["meta"]["mode"] == "quick" and doc["meta"]["total"] == len(results)
    # the table is printed with one row per check and a verdict column
    rows = sum(proc.stdout.count(f"| {paper}.") for paper in ("wang2025", "li2026", "kim2026"))
    assert rows == len(results)


def test_quick_suite_writes_figure(quick_run):
    _, doc, out = quick_run
    figs = [r["figure"] for r in doc["results"] if r["figure"]]
    assert figs and all(Path(f).is_file() and Path(f).parent == out / "fig" for f in figs)


def test_select_and_registry():
    cli._load()
    assert common.select(None) == list(common.REGISTRY)
    paper_a = common.select("wang2025")
    assert paper_a and all(n.startswith("wang2025.") for n in paper_a)
    both = common.select("propF3, li2026.gd_stability")
    assert both == ["wang2025.propF3_singular_values_of_X",
                    "wang2025.propF3_singular_values_of_X.certified",
                    "li2026.gd_stability_threshold"]  # fmt: skip
    certified = [n for n in common.REGISTRY if n.endswith(".certified")]
    assert len(certified) >= 6 and all(n.removesuffix(".certified") in common.REGISTRY
                                       or "gd_one_step_rho" in n for n in certified)  # fmt: skip
    with pytest.raises(ValueError, match="matches no check"):
        common.select("nope")


def test_check_result_and_table():
    with pytest.raises(ValueError, match="kind"):
        common.CheckResult("s", "p", "m", "t", True, "maybe")
    r = common.CheckResult("stmt |x|", "1", "2", "±1", True, "paper", name="a.b", seconds=1.25)
    table = common.markdown_table([r])
    lines = table.splitlines()
    assert lines[0].startswith("| check | kind | statement | predicted | measured")
    assert lines[2] == "| a.b | paper | stmt \\|x\\| | 1 | 2 | ±1 | PASS | - | 1.2 |"
    r.certified = "K ∈ [1, 2]"
    assert "| PASS | K ∈ [1, 2] | 1.2 |" in common.markdown_table([r])
    assert common.fmt(0.0625) == "0.0625" and common.fmt(1.2e-5) == "1.20e-05"


def test_update_readme(tmp_path):
    f = tmp_path / "README.md"
    f.write_text("# t\n<!-- BEGIN checks -->\nold\nrows\n<!-- END checks -->\ntail\n")
    common.update_readme(f, "| new |")
    assert f.read_text() == "# t\n<!-- BEGIN checks -->\n| new |\n<!-- END checks -->\ntail\n"
    g = tmp_path / "bad.md"
    g.write_text("no markers\n")
    with pytest.raises(ValueError, match="BEGIN checks"):
        common.update_readme(g, "x")


def test_cli_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--bogus"])
    assert e.value.code == 2
    assert cli.main(["--only", "no_such_check"]) == 2
    assert "matches no check" in capsys.readouterr().err
    assert cli.main(["--update-readme", str(tmp_path / "missing.md")]) == 2
    (tmp_path / "nomark.md").write_text("# no markers\n")
    assert cli.main(["--update-readme", str(tmp_path / "nomark.md")]) == 2
    assert "BEGIN checks" in capsys.readouterr().err
    assert cli.main(["--list", "--only", "li2026"]) == 0
    assert "li2026.tra_signgd_equals_muon_2eta" in capsys.readouterr().out


def test_trajectory_per_step_rates_match_separate_runs():
    """An [S, steps] array of per-step rates (one vmapped program) equals S separate runs
    with optax schedules, for every optimizer of the kernel."""
    import jax.numpy as jnp
    import optax

    K, steps = 5, 6
    target = jnp.asarray(np.random.default_rng(0).standard_normal((K, K)))
    loss = lambda w: jnp.sum((w - target) ** 2 * jnp.arange(1.0, K + 1.0))
    rec = lambda w: w
    sched = optax.piecewise_constant_schedule(0.2, {3: 0.25})
    rates = np.stack([np.full(steps, 0.1), np.asarray(sched(np.arange(steps)))])
    for name in ("gd", "signgd", "muon"):
        both = common.trajectory(name, rates, loss, jnp.zeros((K, K)), steps, rec)
        one = common.trajectory(name, 0.1, loss, jnp.zeros((K, K)), steps, rec)
        two = common.trajectory(name, sched, loss, jnp.zeros((K, K)), steps, rec)
        np.testing.assert_allclose(both[0], one, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(both[1], two, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="steps"):
        common.trajectory("gd", rates[:, :3], loss, jnp.zeros((K, K)), steps, rec)


def test_gd_slope_check_fails_with_a_wrong_exponent():
    """The finite-K bias is bounded from the closed form at K ≈ 1e6, not from the prediction:
    exact ϱ values (the closed form, equal to the simulation to 1e-8) pass with r - 1 and
    fail with an exponent 0.02 off (the old tolerance |closed - pred| grew with the error)."""
    from theory_checks import wang2025 as W

    Ks = [60, 120, 240, 480, 960]
    ys = [W._gd_closed_form(K, W.EPS) for K in Ks]
    grid, limit = W._closed_slope(Ks, [W.EPS]), W._closed_slope(W._LARGE_K, [W.EPS])
    assert abs(limit - (W._r() - 1)) < 1e-3  # the closed form reaches the theorem's exponent

    def check(pred):
        return W._slope_check("s", Ks, ys, pred, grid, limit, "K").passed

    assert check(W._r() - 1)
    assert not check(W._r() - 1 + 0.02) and not check(W._r() - 1 - 0.02)


def test_certify_proves_identities_and_refuses_false_bounds():
    """Ball-arithmetic bisection: an identity holds to 1e-20 on a range; a bound that a
    point of the range violates (exp(x) vs its quadratic Taylor polynomial, max 0.218 at
    x = 1) is refused at tol 0.2 and proved at 0.22; a closed form with an exponent 0.1%
    off (GD balance) is refused."""
    from flint import arb

    from theory_checks import certified as C

    ok, worst, n = C.certify(lambda x: x.sin() ** 2 + x.cos() ** 2 - 1, 0.0, 10.0, 1e-20)
    assert ok and worst <= 1e-20 and n >= 1
    taylor = lambda x: x.exp() - (1 + x + x * x / 2)  # noqa: E731
    assert not C.certify(taylor, 0.0, 1.0, 0.2)[0]
    assert C.certify(taylor, 0.0, 1.0, 0.22)[0]
    assert not C.certify(taylor, 0.0, 1.0, 0.2, order=0)[0]
    r = (1 - arb("0.8")) / 48 / (arb("0.8") / 12)
    good = C._gd_tail(60, lambda u: r, lambda u: r, lambda u: u.exp())
    bad = C._gd_tail(60, lambda u: r, lambda u: r * arb("1.001"), lambda u: u.exp())
    assert C.certify(good, -9.2, -4.6, 1e-12)[0]
    assert not C.certify(bad, -9.2, -4.6, 1e-12)[0]
