"""Experiments and `amemory reproduce`: smoke runs of shrunken configs, and the computed
quantities checked against independent numpy references (closed-form gradients, numpy
softmax/SVD, the paper's Table 1 arithmetic)."""

from __future__ import annotations

import json
import math

import chex
import numpy as np
import pytest

from experiments import ablation, common, one_layer, report, reproduce, tail_lm, tail_qa, train_runs

# ----------------------------------------------------------------------------- references


def _np_softmax_cols(W):
    """Decoupled embeddings: column k of W holds the logits of query k."""
    z = W - W.max(axis=0, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=0, keepdims=True)


def _np_stats(W, prior):
    s = _np_softmax_cols(W)
    f = np.diag(s)
    return -np.sum(prior * np.log(f)), f.max() - f.min()


def _np_grad(W, prior):
    """Closed form (paper A, arXiv 2509.26030), decoupled: dL/dW[i, k] = p_k (s_ik - 1[i = k])."""
    s = _np_softmax_cols(W)
    return (s - np.eye(W.shape[0])) * prior[None, :]


def _np_msgn(G):
    u, s, vt = np.linalg.svd(G)
    keep = s > s.max() * G.shape[0] * 1e-6
    return (u[:, keep]) @ vt[keep]


def _tiny_one_layer_cfg():
    cfg = common.experiments()["one_layer"].config("quick")
    cfg.K = 12
    cfg.priors = ("two_level",)
    cfg.steps = 15
    cfg.one_step_points = 9
    return cfg


# ----------------------------------------------------------------------------- one_layer


def test_one_layer_smoke_and_gap_matches_numpy(tmp_path):
    cfg = _tiny_one_layer_cfg()
    res = one_layer.EXPERIMENT(cfg, tmp_path / "ol")
    assert (tmp_path / "ol" / "result.json").is_file()
    assert (tmp_path / "ol" / "figures" / "one_layer_gap_vs_loss.png").stat().st_size > 1000
    saved = json.loads((tmp_path / "ol" / "result.json").read_text())
    prior = np.array([0.8 / 2] * 2 + [0.2 / 10] * 10)  # two_level(12, 0.8, 0.2): L = 2
    # One step, decoupled: W_eta = eta * X with X = diag(p) - (1/K) 1 p^T (closed form
    # -grad at 0) for GD, and eta * msgn(X) for Muon.
    X = np.diag(prior) - np.ones((12, 1)) @ prior[None, :] / 12
    for opt, D in (("gd", X), ("muon", _np_msgn(X)), ("signgd", np.sign(X))):
        run = saved["metrics"]["runs"][f"two_level/decoupled/{opt}"]["one_step"]
        for eta, loss, gap in zip(run["eta"], run["loss"], run["gap"], strict=True):
            ref_loss, ref_gap = _np_stats(eta * D, prior)
            np.testing.assert_allclose(loss, ref_loss, rtol=2e-4, atol=2e-5)
            np.testing.assert_allclose(gap, ref_gap, rtol=2e-4, atol=2e-5)
    # Many steps of GD and Muon, decoupled, against a numpy loop with the closed-form gradient.
    for opt in ("gd", "muon"):
        r = saved["metrics"]["runs"][f"two_level/decoupled/{opt}"]
        W = np.zeros((12, 12))
        for t in range(cfg.steps + 1):
            ref_loss, ref_gap = _np_stats(W, prior)
            np.testing.assert_allclose(r["many_steps"]["loss"][t], ref_loss, rtol=1e-3, atol=1e-5)
            np.testing.assert_allclose(r["many_steps"]["gap"][t], ref_gap, rtol=1e-3, atol=1e-4)
            G = _np_grad(W, prior)
            W = W - r["lr"] * (G if opt == "gd" else _np_msgn(G))
    assert {c["key"] for c in res["claims"]} >= {
        "one_layer/gd_imbalanced",
        "one_layer/muon_balanced",
    }


def test_one_step_rho_matches_closed_form():
    import jax.numpy as jnp

    from amemory.data import frequencies
    from amemory.models import memory

    K, alpha, beta, eps = 60, 0.8, 0.2, 0.1
    prior = jnp.asarray(frequencies.two_level(K, alpha, beta), jnp.float32)
    E, Et = memory.decoupled(K)
    got = one_layer.one_step_rho("gd", E, Et, prior, eps)["rho"]
    r = min(alpha * (1 - beta) / (beta * (1 - alpha)), beta * (1 - alpha) / (alpha * (1 - beta)))
    x = (1 / eps - 1) * (K - 1)
    np.testing.assert_allclose(got, x**r / (x**r + K - 1), rtol=2e-3)


def test_word_counts_and_validation(tmp_path):
    words, counts = one_layer.word_counts(["The cat and the dog", "the end, and THE cat's"], 3)
    assert words == ["the", "and", "cat"] or words[:2] == ["the", "and"]
    chex.assert_trees_all_close(counts[:2], np.array([4.0, 2.0]))
    with pytest.raises(ValueError, match="distinct words"):
        one_layer.word_counts(["a b"], 5)
    cfg = _tiny_one_layer_cfg()
    cfg.K = 10
    cfg.embeddings = ("coupled",)
    with pytest.raises(ValueError, match="divisible by 3"):
        one_layer.EXPERIMENT(cfg, tmp_path / "bad")


# ----------------------------------------------------------------------------- helpers


def test_gain_share_reproduces_paper_arithmetic():
    # Paper A (arXiv 2509.26030) Table 1 (non-gated): VO+FFN and QK shares of Muon's gain.
    np.testing.assert_allclose(ablation.gain_share(3.9242, 3.5858, 3.5654), 0.94314, rtol=1e-4)
    np.testing.assert_allclose(ablation.paper_shares("gelu")["qk"], 0.0317 / 0.3588, rtol=1e-3)
    assert math.isnan(ablation.gain_share(3.0, 2.9, 3.1))  # Muon-on-all did not help


def test_steps_to_reach_and_overrides():
    steps = np.array([0, 10, 20, 30.0])
    vals = np.array([5.0, 4.0, 3.0, 2.0])
    assert train_runs.steps_to_reach(steps, vals, 3.5) == pytest.approx(15.0)
    assert math.isnan(train_runs.steps_to_reach(steps, vals, 1.0))
    cfg = common.experiments()["tail_lm"].config("quick")
    common.apply_override(cfg, *common.parse_set("base.steps=7"))
    assert cfg.base.steps == 7
    with pytest.raises(ValueError, match="unknown config field"):
        common.apply_override(cfg, *common.parse_set("base.nope=1"))
    with pytest.raises(ValueError, match="base.steps"):  # ConfigDict's TypeError, named
        common.apply_override(cfg, *common.parse_set("base.steps=many"))
    with pytest.raises(ValueError, match="scale"):
        common.experiments()["tail_lm"].config("huge")


# ----------------------------------------------------------------------------- training


def _shrink(base, steps=4):
    base.model.d_model = 16
    base.model.n_heads = 2
    base.model.d_ff = 32
    base.model.n_layers = 1
    base.steps = steps
    base.eval_every = 2
    base.spectrum_every = 2
    base.schedule.warmup_steps = 1
    base.data.batch_size = 4
    base.data.eval_batches = 1
    return base


def _tiny_tail_lm():
    cfg = common.experiments()["tail_lm"].config("quick")
    _shrink(cfg.base)
    cfg.base.data.seq_len = 16
    cfg.optimizers = ("adam", "muon")
    cfg.lr_grid.adam = (3e-3,)
    cfg.lr_grid.muon = (0.02,)
    cfg.seeds = (1, 2, 3)
    return cfg


def _paired_t(d):
    """Paired 95% t interval by hand (t_{0.975, 2} in closed form, 3 seeds)."""
    d = np.asarray(d, float)
    t = 0.95 / math.sqrt(2 * 0.975 * 0.025)
    half = t * d.std(ddof=1) / math.sqrt(d.size)
    return d.mean() - half, d.mean() + half


@pytest.fixture(scope="module")
def tiny_tail_lm(tmp_path_factory):
    """tail_lm on a tiny model, 3 seeds; its cache is shared by the experiments built on it."""
    tmp = tmp_path_factory.mktemp("tiny_tail_lm")
    cfg = _tiny_tail_lm()
    cache = tmp / "train_runs"
    res = tail_lm.EXPERIMENT(cfg, tmp / "tl", cache_dir=cache)
    return cfg, cache, res, tmp


def test_tail_lm_seed_intervals(tiny_tail_lm):
    cfg, _, res, tmp = tiny_tail_lm
    m = res["metrics"]
    assert set(m["runs"]) == {"adam", "muon"}
    assert m["chosen_lr"] == {"adam": 3e-3, "muon": 0.02}
    assert len(m["bucket_labels"]) >= 2
    mu, ad = (np.asarray(m["runs"][o]["final_bucket_loss"]) for o in ("muon", "adam"))
    assert mu.shape == (len(m["bucket_labels"]), 3) and np.isfinite(mu).all()
    # Seeds differ in initialisation: the three final losses are not copies of each other.
    assert np.ptp(np.asarray(m["runs"]["adam"]["final_val_loss"])) > 0
    # The tail claim's interval is the paired t interval of Adam − Muon, and its verdict
    # follows the three-way rule.
    claim = next(c for c in res["claims"] if c["key"] == "tail_lm/tail_bucket_loss")
    lo, hi = _paired_t(ad[-1] - mu[-1])
    assert (claim["interval"]["lo"], claim["interval"]["hi"]) == pytest.approx((lo, hi))
    assert claim["held"] is (True if lo > 0 else False if hi < 0 else None)
    gain = next(c for c in res["claims"] if c["key"] == "tail_lm/gain_in_tail")
    lo, hi = _paired_t((ad[-1] - mu[-1]) - (ad[0] - mu[0]))
    assert (gain["interval"]["lo"], gain["interval"]["hi"]) == pytest.approx((lo, hi))
    assert (tmp / "tl" / "figures" / "tail_lm_bucket_loss.png").is_file()


def test_ablation_and_isotropy_reuse_tail_lm_seeded_runs(tiny_tail_lm, tmp_path):
    cfg, cache, res, _ = tiny_tail_lm
    m = res["metrics"]
    n_runs = len(list(cache.iterdir()))
    # The ablation's "none"/"all" rows are tail_lm's seeded runs: nothing new is trained.
    acfg = common.experiments()["ablation"].config("quick")
    acfg.base = cfg.base
    acfg.lr_grid = cfg.lr_grid
    acfg.seeds = cfg.seeds
    acfg.subsets = ("none", "all")
    acfg.ffn_kinds = ("gelu",)
    ares = ablation.EXPERIMENT(acfg, tmp_path / "ab", cache_dir=cache)
    losses = ares["metrics"]["val_loss"]["gelu"]
    np.testing.assert_allclose(losses["none"], m["runs"]["adam"]["final_val_loss"])
    np.testing.assert_allclose(losses["all"], m["runs"]["muon"]["final_val_loss"])
    share = np.asarray(ares["metrics"]["share"]["gelu"]["all"])
    helped = np.asarray(losses["all"]) < np.asarray(losses["none"])
    np.testing.assert_allclose(share[helped], 1.0)
    assert np.isnan(share[~helped]).all()
    # Isotropy with tail_lm's seeds and learning rates reads the same runs' spectra.
    from experiments import isotropy

    icfg = common.experiments()["isotropy"].config("quick")
    icfg.base = cfg.base
    icfg.seeds = cfg.seeds
    icfg.lr.adam, icfg.lr.muon = m["chosen_lr"]["adam"], m["chosen_lr"]["muon"]
    ires = isotropy.EXPERIMENT(icfg, tmp_path / "iso", cache_dir=cache)
    assert len(list(cache.iterdir())) == n_runs
    series = ires["metrics"]["series"]
    verdicts = []
    for key in [k for k in series if k.endswith("/entropy")]:
        mu, ad = (
            np.asarray(series[key]["muon"]["values"]),
            np.asarray(series[key]["adam"]["values"]),
        )
        assert mu.shape == ad.shape == (2, 3)  # spectrum at steps 2 and 4, 3 seeds
        for t in range(2):
            lo, hi = _paired_t(mu[t] - ad[t])
            verdicts.append(True if lo > 0 else False if hi < 0 else None)
    assert len(verdicts) >= 6  # v, o, vo, w_in, w_out at two steps
    # The claim is the conjunction: held if all held, not held if any is not held.
    want = False if False in verdicts else (True if all(verdicts) else None)
    claim = next(c for c in ires["claims"] if c["key"] == "isotropy/muon_more_isotropic")
    assert claim["held"] is want


def test_steps_ratio_and_plain_optax_reference(tiny_tail_lm, tmp_path):
    """The engine's Adam equals a plain optax loop on the same model, seeds and batches."""
    from experiments import steps_ratio

    cfg, cache, res, _ = tiny_tail_lm
    scfg = common.experiments()["steps_ratio"].config("quick")
    assert set(steps_ratio.sizes(scfg)) == {"d64", "d128"}  # quick: d=64 and tail_lm's size
    scfg.base = cfg.base
    scfg.seeds = cfg.seeds
    scfg.lr_grid = cfg.lr_grid
    scfg.widths, scfg.depths, scfg.vocabs = (16,), (1,), (512,)  # tail_lm's runs only
    scfg.fixed_lr_sizes, scfg.small_grid_sizes = (), ()
    scfg.test_size, scfg.reference_sizes = "d16", ("d16",)
    scfg.budget_fractions = (0.5,)
    n_runs = len(list(cache.iterdir()))
    out = steps_ratio.EXPERIMENT(scfg, tmp_path / "sr", cache_dir=cache)
    assert len(list(cache.iterdir())) == n_runs + 3  # two plain-optax references, one budget
    sizes = out["metrics"]["sizes"]
    assert set(sizes) == {"d16"}
    d16 = sizes["d16"]  # tail_lm's own size and runs
    np.testing.assert_allclose(
        d16["final"]["adam"], res["metrics"]["runs"]["adam"]["final_val_loss"]
    )
    ref = d16["reference"]
    np.testing.assert_allclose(ref["engine_adam_final"], ref["plain_adam_final"], rtol=2e-5)
    np.testing.assert_allclose(
        np.asarray(ref["plain_val_loss"]["adam"]), np.asarray(d16["val_loss"]["adam"]), rtol=2e-5
    )
    # Ratio per seed: first crossing of Adam's final loss on Muon's curve, by hand.
    steps = np.asarray(d16["eval_steps"])
    mu, ad = np.asarray(d16["val_loss"]["muon"]), np.asarray(d16["val_loss"]["adam"])
    for s in range(3):
        want = train_runs.steps_to_reach(steps, mu[:, s], ad[-1, s]) / cfg.base.steps
        got = d16["ratio"][s]
        assert (math.isnan(want) and math.isnan(got)) or got == pytest.approx(want)
    b = out["metrics"]["budget"]  # Muon on a 2-step schedule, then the full run
    np.testing.assert_allclose(b["fractions"], [0.5, 1.0])
    np.testing.assert_allclose(np.asarray(b["muon_final"])[1], d16["final"]["muon"])
    for s in range(3):
        want = train_runs.steps_to_reach(
            b["fractions"], np.asarray(b["muon_final"])[:, s], ad[-1, s]
        )
        got = b["fraction_needed"][s]
        assert (math.isnan(want) and math.isnan(got)) or got == pytest.approx(want)
    keys = {c["key"] for c in out["claims"]}
    assert keys == {"steps_ratio/about_half", "steps_ratio/adam_matches_optax_d16"}
    assert (tmp_path / "sr" / "figures" / "steps_ratio.png").is_file()
    with pytest.raises(ValueError, match="test_size"):
        scfg.test_size = "d999"
        steps_ratio.EXPERIMENT(scfg, tmp_path / "bad", cache_dir=cache)


def test_neuron_norm_cv_and_normuon_first_step(tiny_tail_lm, tmp_path):
    import jax.numpy as jnp

    from experiments import reference_lm

    rng = np.random.default_rng(3)
    u = rng.normal(size=(7, 11)) * np.arange(1, 12)  # column j scaled by j + 1
    norms = np.linalg.norm(u, axis=0)
    got = float(reference_lm.neuron_norm_cv(jnp.asarray(u, jnp.float32)))
    assert got == pytest.approx(norms.std() / norms.mean(), rel=1e-5)
    cfg, cache, _, _ = tiny_tail_lm
    rc = train_runs.run_config(cfg.base, "normuon", 0.02, 3e-3)
    rc.steps, rc.eval_every, rc.schedule.warmup_steps = 1, 1, 0  # first step at the peak LR
    plain = reference_lm.run(rc, "normuon", (1, 2), log_every=1)
    muon = reference_lm.run(
        train_runs.run_config(rc, "muon", 0.02, 3e-3), "muon", (1, 2), log_every=1
    )
    # NorMuon's first update: v = (1 - beta2) mean_rows(O^2), so every neuron of O / sqrt(v)
    # has the same norm: CV 0. Muon's orthogonalised w_in, kernel [16, 32], has orthonormal
    # rows: its 32 column norms are the square roots of a rank-16 projection's diagonal,
    # unequal.
    for role in ("w_in", "w_out", "q"):
        np.testing.assert_allclose(plain["neuron_cv"][role][0], 0.0, atol=1e-4)
    assert np.all(muon["neuron_cv"]["w_in"][0] > 0.1)


def test_tail_qa_smoke_with_seeds(tmp_path):
    cfg = common.experiments()["tail_qa"].config("quick")
    _shrink(cfg.base, steps=3)
    cfg.base.data.biographies.m = 2
    cfg.base.data.biographies.eval_per_group = 4
    cfg.variants = ("muon_qk", "muon_vo+ffn")
    cfg.seeds = (4, 5)
    cfg.sweep = False
    res = tail_qa.EXPERIMENT(cfg, tmp_path / "qa")
    fta = np.asarray(res["metrics"]["runs"]["muon_qk"]["final_fta"])
    assert fta.shape == (3, 2)  # groups 0..m, seeds
    assert np.all((fta >= 0) & (fta <= 1))
    assert res["metrics"]["tail_groups"] == [0, 2]  # m - 4 < 0 is dropped
    assert np.isfinite(res["metrics"]["runs"]["muon_qk"]["final_train_loss"]).all()
    claim = next(c for c in res["claims"] if c["key"] == "tail_qa/vo_ffn_vs_qk")
    d = np.asarray(res["metrics"]["runs"]["muon_vo+ffn"]["final_fta"])[2] - fta[2]
    assert claim["interval"]["estimate"] == pytest.approx(d.mean())
    with pytest.raises(ValueError, match="variant"):
        tail_qa.variant_config(cfg.base, "adagrad", {"adam": 1.0})


# ----------------------------------------------------------------------------- reproduce


def _fake_stage(name, scale, stage_dir, progress, *, overrides=None, cache_dir=None):
    stage_dir.mkdir(parents=True, exist_ok=True)
    (stage_dir / "figures").mkdir(exist_ok=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1, 1))
    fig.savefig(stage_dir / "figures" / f"{name}.png")
    plt.close(fig)
    if name == "tail_qa":
        raise RuntimeError("boom")
    claim = common.ClaimSpec(f"{name}/x", "A", "a | claim", "1", "t").claim(
        ours="2", held=name != "ablation"
    )
    curve = {"curve": list(range(100)), "per_seed": [1.0, 2.0, 3.0]}
    return common.result_dict(
        name, scale, metrics={"chosen_lr": {"adam": 1e-3, "muon": 0.02}, "ov": overrides, **curve},
        figures=[f"figures/{name}.png"], claims=[claim], wall_s=1.0,
    )  # fmt: skip


def test_reproduce_report_results_and_readme(tmp_path):
    out, res_dir = tmp_path / "rep", tmp_path / "results"
    results, path = reproduce.reproduce(
        ("one_layer", "tail_lm", "ablation", "tail_qa"), "quick", out, progress=False,
        stage_runner=_fake_stage, results_dir=res_dir,
    )  # fmt: skip
    text = path.read_text()
    assert "| claim | source | paper | ours | verdict |" in text
    assert "a / claim" in text  # pipes in cells are escaped
    assert "not held" in text and "undecided" in text  # failed stage -> undecided claim
    assert (out / "tail_qa" / "error.txt").is_file()
    assert results[1]["metrics"]["ov"] == {"optimizers": ("adam", "muon")}  # reduced tail_lm
    summary = json.loads((out / "summary.json").read_text())
    assert [r["name"] for r in summary["results"]] == [
        "one_layer",
        "tail_lm",
        "ablation",
        "tail_qa",
    ]
    # one compact JSON per stage that ran (not the failed one), curves dropped, provenance kept
    assert sorted(p.name for p in (res_dir / "quick").iterdir()) == [
        "ablation.json", "one_layer.json", "tail_lm.json",
    ]  # fmt: skip
    saved = json.loads((res_dir / "quick" / "tail_lm.json").read_text())
    assert saved["metrics"]["curve"] is None and saved["omitted"] == ["metrics.curve"]
    assert saved["metrics"]["per_seed"] == [1.0, 2.0, 3.0]
    prov = saved["provenance"]
    assert prov["code_version"] == common.experiments()["tail_lm"].code_version()
    assert prov["config_hash"] and prov["versions"]["jax"] and prov["machine"]["cores"]
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.README_BEGIN}\nold\n{report.README_END}\nrest\n")
    loaded = report.load_results("quick", res_dir)
    report.update_readme(readme, loaded, "quick")
    new = readme.read_text()
    assert new.startswith("intro\n") and new.endswith("rest\n") and "old" not in new
    assert report.readme_table(readme) == report.readme_block(loaded, "quick")
    assert report.claims_table(loaded, report.headline()) in new and "| 2 | held |" not in new
    assert report.main(["--results", str(res_dir), "--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "report.md").read_text().count("| held |") == 2
    readme.write_text("no markers")
    with pytest.raises(ValueError, match="markers"):
        report.update_readme(readme, loaded, "quick")


def test_results_state_claims_that_moved(tmp_path):
    def result(estimate, held):
        iv = {"estimate": estimate, "lo": estimate - 0.1, "hi": estimate + 0.1, "n": 3}
        claim = common.Claim("toy/x", "A", "s", "1", f"{estimate}", held, "t", iv)
        return common.result_dict("toy", "quick", metrics={}, figures=[], claims=[claim], wall_s=1)

    assert report.save_result(result(0.5, True), tmp_path, code_version="c")[1] == []
    assert report.save_result(result(0.55, True), tmp_path, code_version="c")[1] == []
    moved = report.save_result(result(0.9, True), tmp_path, code_version="c")[1]
    assert len(moved) == 1 and "do not overlap" in moved[0]  # same verdict, interval moved
    moved = report.save_result(result(0.85, None), tmp_path, code_version="c")[1]
    assert len(moved) == 1 and "now undecided" in moved[0]


def test_reproduce_passes_tail_lm_lrs_to_reduced_tail_qa(tmp_path):
    seen = {}

    def runner(name, scale, stage_dir, progress, *, overrides=None, cache_dir=None, sets=()):
        seen[name] = overrides
        seen["sets"] = sets
        return _fake_stage("x", scale, stage_dir, progress) if name != "tail_lm" else (
            common.result_dict(name, scale, metrics={"chosen_lr": {"adam": 0.01, "muon": 0.05}},
                               figures=[], claims=[], wall_s=0.0)
        )  # fmt: skip

    stages = ("tail_lm", "isotropy", "tail_qa", "arch", "steps_ratio")
    reproduce.reproduce(stages, "quick", tmp_path, progress=False,
                        stage_runner=runner, sets=["base.steps=3"])  # fmt: skip
    assert seen["sets"] == ("base.steps=3",)
    assert seen["tail_qa"]["sweep"] is False
    for name in ("isotropy", "tail_qa", "arch"):
        assert seen[name]["lr.adam"] == 0.01 and seen[name]["lr.muon"] == 0.05
        assert "tail_lm" in seen[name]["lr_source"]
    assert "lr.adam" not in seen["steps_ratio"]  # its own grid at every size


def test_reproduce_cli_rejects_bad_flags(capsys):
    with pytest.raises(SystemExit) as e:
        reproduce.main(["--only", "nope"])
    assert e.value.code == 2
    # a --set value of the wrong type, or a field no stage has, stops before any work
    assert reproduce.main(["--only", "tail_lm", "--set", "base.steps=many"]) == 2
    assert "config field 'base.steps'" in capsys.readouterr().err
    assert reproduce.main(["--only", "tail_lm", "--set", "base.nope=1"]) == 2
    assert "no stage of this run has that field" in capsys.readouterr().err


def _np_noisy_loss_grad(W, prior, noise):
    """Task space, E = Ẽ = I: L = -Σ_j p_j Σ_i q(i|j) log softmax(W[:, j])_i (closed form)."""
    K = W.shape[0]
    s = _np_softmax_cols(W)
    q = (1 - noise) * np.eye(K) + noise / K
    loss = -np.sum(prior[None, :] * q * np.log(s))
    return loss, (s - q) * prior[None, :]


def test_scaling_synthetic_matches_numpy_and_runs(tmp_path):
    import jax.numpy as jnp

    from amemory.data import frequencies
    from experiments import scaling

    p = frequencies.hierarchical(4, 2, 1.5)
    prior, noise = jnp.asarray(p, jnp.float32), 0.1
    curve = np.asarray(scaling.gd_curve(5, prior, jnp.float32(noise), jnp.float32(2.0)))
    W = np.zeros((8, 8))
    for t in range(6):
        loss, g = _np_noisy_loss_grad(W, p, noise)
        np.testing.assert_allclose(curve[t], loss, rtol=1e-5)
        W = W - 2.0 * g
    W = np.zeros((8, 8))
    for _ in range(4):
        W = W - 0.3 * _np_msgn(_np_noisy_loss_grad(W, p, noise)[1])
    got = float(scaling.muon_final_loss(jnp.int32(4), prior, jnp.float32(noise), jnp.float32(0.3)))
    np.testing.assert_allclose(got, _np_noisy_loss_grad(W, p, noise)[0], rtol=1e-4)
    cfg = common.experiments()["scaling"].config("quick")
    cfg.parts = ("synthetic",)
    cfg.M, cfg.C, cfg.T_grid, cfg.betas = 6, 2, (4, 8, 16, 32), (2.0,)
    res = scaling.EXPERIMENT(cfg, tmp_path / "sc")
    r = res["metrics"]["synthetic"]["by_beta"]["2.0"]
    assert len(r["gd"]) == 4 and np.all(np.asarray(r["gd"]) > 0)
    assert {c["key"] for c in res["claims"]} >= {"scaling/gd_rate", "scaling/muon_rate"}
