"""`amemory coordcheck` (issue 31 item 1) and the lr_transfer stage's logic (item 3).

The coordinate check runs once (module fixture: the CLI, 2 widths, 2 steps, a 1-layer
model on the real corpus) and is tested in both directions: Muon with spectral scaling
has width-independent hidden-matrix updates (slope ~0), standard-parametrization Adam's
grow with width (Adam's first step is lr * sign(g), a low-rank matrix whose RMS->RMS norm
grows like fan_in). The operator norm is checked against numpy's SVD. The lr_transfer
stage runs end to end with its trainer replaced by a known loss surface (quadratic in
log2 rate, optimum chosen per width), so its optimum, grid extension and verdicts have
closed-form answers; real training at its scale costs CPU hours (docs/lr-transfer.md).
"""

from __future__ import annotations

import json
import math

import jax.numpy as jnp
import numpy as np
import pytest
from ml_collections import ConfigDict

from amemory.train import coordcheck as cc
from amemory.train import guard

# the quick LM shrunk: 1 layer, heads of 8 dimensions (so widths 16 and 64), 4 x 32 tokens
SMALL = ["--config.model.n_layers=1", "--config.model.n_heads=16",
         "--config.data.batch_size=4", "--config.data.seq_len=32"]  # fmt: skip
MUON = "muon:shape_scale=spectral"
HIDDEN = [f"layers/0/{m}/kernel" for m in ("attn/q", "attn/k", "attn/v", "attn/o",
                                           "mlp/w_in", "mlp/w_out")]  # fmt: skip


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    out = tmp_path_factory.mktemp("coordcheck")
    argv = ["--widths", "16,64", "--steps", "2", "--variant", "adam", "--variant", MUON]
    assert cc.main([*argv, "--out", str(out), *SMALL]) == 0
    assert (out / "coordcheck.png").stat().st_size > 1000
    return json.loads((out / "coordcheck.json").read_text())


def test_muon_spectral_updates_keep_their_size_across_width(checked):
    update = checked["slopes"][MUON]["update"]
    assert max(abs(update[k]) for k in HIDDEN) < 0.15, update
    # Muon's update has every singular value near 1 (Newton-Schulz): its RMS->RMS norm is
    # about the rate 0.02 (quick config's Muon default) at every width and step
    sizes = np.array([checked["values"][MUON]["update"][k] for k in HIDDEN])  # [6, W, 3]
    assert np.all((sizes[..., 1:] > 0.6 * 0.02) & (sizes[..., 1:] < 1.3 * 0.02)), sizes
    assert np.all(sizes[..., 0] == 0)  # step 0: the initialisation, nothing moved yet


def test_standard_adam_updates_and_logit_changes_grow_with_width(checked):
    slopes = checked["slopes"]["adam"]
    assert min(slopes["update"][k] for k in HIDDEN) > 0.4, slopes["update"]
    assert slopes["update"]["head/kernel"] > 0.7
    assert slopes["change"]["logits"] > 0.5
    # the same head, trained by Adam in the Muon variant too (routing "hidden"), grows there
    assert checked["slopes"][MUON]["update"]["head/kernel"] > 0.7


def test_op_norm_is_the_rms_to_rms_norm_of_numpys_svd():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 5, 7)).astype(np.float32)  # [batch, fan_in, fan_out]
    want = max(np.linalg.norm(m, 2) for m in x) * math.sqrt(5 / 7)
    assert float(cc.op_norm(jnp.asarray(x))) == pytest.approx(want, rel=1e-4)
    q = np.linalg.qr(rng.standard_normal((11, 11)))[0][:, :7]  # all singular values 1
    assert float(cc.op_norm(jnp.asarray(q, jnp.float32))) == pytest.approx(math.sqrt(11 / 7))


def test_slope_is_the_log_log_least_squares_slope():
    assert cc.slope([16, 32, 64], [3.0, 6.0, 12.0]) == pytest.approx(1.0)
    assert cc.slope([16, 64], [2.0, 1.0]) == pytest.approx(-0.5)
    assert math.isnan(cc.slope([16, 64], [0.0, 1.0]))


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--widths", "20,64"], "multiples of 8"),
        (["--widths", "16,x"], "--widths"),
        (["--widths", "64"], ">= 2 widths"),
        (["--variant", "nosuch"], "config.optimizer.name='nosuch'"),
        (["--variant", "muon:shape_scale=bogus"], "shape_scale"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_compiling(argv, field, capsys):
    assert cc.main([*argv, *SMALL, "--out", "/nonexistent/never"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("amemory coordcheck: error:") and field in err
    assert err.count("\n") == 1


# ---- lr_transfer, with a known loss surface in place of training -------------------


def _optimum(name: str, width: int, moving: str) -> float:
    """The surface's optimal rate: ``moving``'s falls 8x from d=32 to d=256, others fixed."""
    base = {"adam": 3e-3, "muon": 0.02}[name]
    return base * 32 / width if name == moving else base


def _fake_trainer(moving: str):
    def train_cached(cfg, cache_dir, label):
        name, lr, d = cfg.optimizer.name, float(cfg.optimizer.lr), int(cfg.model.d_model)
        best = _optimum(name, d, moving)
        if lr > 64 * best:
            raise guard.DivergenceError("diverged")
        seeds = list(cfg.seeds) or [int(cfg.seed)]
        final = [3.0 + 0.1 * math.log2(lr / best) ** 2 + 0.01 * s for s in seeds]
        records = [{"kind": "eval", "step": s, "loss": [f + 0.5 * (s < cfg.steps) for f in final]}
                   for s in (cfg.steps // 2, cfg.steps)]  # fmt: skip
        return {"records": records, "summary": {}}

    return train_cached


def _tiny_stage_config() -> ConfigDict:
    from experiments import lr_transfer

    cfg = lr_transfer.EXPERIMENT.config("quick")
    cfg.widths, cfg.base_width, cfg.test_width = (32, 64, 256), 32, 256
    cfg.optimizers = ConfigDict({"adam": "adam", "muon": MUON})
    cfg.lr_grid = ConfigDict({"adam": (1.5e-3, 3e-3, 6e-3), "muon": (0.01, 0.02, 0.04)})
    return cfg


@pytest.mark.parametrize("moving", ["adam", "muon"])
def test_lr_transfer_recovers_the_optimum_and_decides_both_ways(moving, tmp_path, monkeypatch):
    from experiments import lr_transfer, train_runs

    monkeypatch.setattr(train_runs, "train_cached", _fake_trainer(moving))
    result = lr_transfer.EXPERIMENT(_tiny_stage_config(), tmp_path)
    sweeps = result["metrics"]["sweeps"]
    for name, by_width in sweeps.items():
        for width, v in by_width.items():  # the parabola's vertex is exact on this surface
            np.testing.assert_allclose(v["log2_opt"], math.log2(_optimum(name, width, moving)))
            assert not v["at_edge"] and v["grid"][0] < v["chosen_lr"] < v["grid"][-1]
    # the moving optimum left the 3-point grid: it was extended (3 points below it at d=256)
    assert len(sweeps[moving][256]["grid"]) == 6
    held = {c["key"].split("/")[1]: c["held"] for c in result["claims"]}
    stable = moving == "adam"  # Muon's optimum fixed, Adam's falls 8x: the paper's picture
    assert held == {"muon_rate_stable": stable, "adam_rate_shifts": stable,
                    "muon_transferred_loss": stable, "steps_ratio": stable}  # fmt: skip
    figures = {p.name for p in (tmp_path / "figures").iterdir()}
    assert figures == {"loss_vs_rate_adam.png", "loss_vs_rate_muon.png", "optimal_rate.png"}
    assert json.loads((tmp_path / "result.json").read_text())["name"] == "lr_transfer"


def test_lr_transfer_rejects_a_bad_variant_before_training(tmp_path, monkeypatch):
    from experiments import lr_transfer, train_runs

    monkeypatch.setattr(train_runs, "train_cached", lambda *a: pytest.fail("trained"))
    cfg = _tiny_stage_config()
    cfg.optimizers.muon = "muon:shape_scale=bogus"
    with pytest.raises(ValueError, match="shape_scale"):
        lr_transfer.EXPERIMENT(cfg, tmp_path)
