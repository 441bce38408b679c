"""`amemory plan` on the real TPU compiler (libtpu), from this CPU host.

A few small compiles for a v5e:2x2 topology, shared by the module: the step of
`amemory train` compiled ahead of time. FLOPs are held against the closed form 6 N D +
12 L T d per token (PaLM, arXiv 2204.02311, app. B), independent of the HLO counter; the
owner layout's collectives against the design's prediction (as the CPU HLO test does).
Measured here: the unscanned step's matmul FLOPs equal the closed form exactly.
"""

import json
import os
import sys

import jax
import numpy as np
import pytest
from train_helpers import LM_CONFIG, lm_config, lm_overrides, write_corpus

if os.environ.get("AMEMORY_REQUIRE_TPU_COMPILER"):  # CI: a missing libtpu fails the run
    import libtpu  # noqa: F401
else:
    pytest.importorskip("libtpu", reason="the TPU compiler: pip install 'jax[tpu]' (linux x86_64)")

from amemory.train import planner  # noqa: E402

TOPOLOGY = "v5e:2x2"


@pytest.fixture(scope="module")
def plans(corpus, tmp_path_factory):
    """name -> plan report: Adam per-layer with and without remat (32 heads of width 4, so
    that attention scores, not gradients, fill the temporaries), tiny Muon scanned in bf16
    sharded over the 4 chips, and a model too big for one chip."""
    wide = {"optimizer.name": "adam", "model.n_layers": 8, "data.seq_len": 64,
            "model.d_model": 128, "model.n_heads": 32, "model.d_ff": 256}  # fmt: skip
    configs = {
        "adam": wide,
        "remat": {**wide, "model.remat": True},
        "muon": {"optimizer.name": "muon", "model.scan_layers": True, "model.n_layers": 4,
                 "model.dtype": "bfloat16", "parallel.mode": "sharded", "parallel.fsdp": 4},
        "big": {"optimizer.name": "adam", "model.d_model": 4096, "model.n_layers": 8,
                "model.d_ff": 16384, "model.n_heads": 32},
    }  # fmt: skip
    out = {}
    for name, kw in configs.items():
        save = tmp_path_factory.mktemp("exe") / "step.exe" if name == "muon" else None
        out[name] = planner.plan(lm_config(corpus, **kw), TOPOLOGY, save=save)
    return out


def _matmul_tokens(report):
    """Matmul FLOPs of the model part (all chips) / the closed form's FLOPs per step."""
    model = (report["flops_per_chip"] - report["optimizer_flops_per_chip"]) * report["chips"]
    return model / (report["model_flops_per_token"] * report["tokens_per_step"])


def test_flops_match_6nd_plus_attention_scanned_and_not(plans):
    """cost_analysis counts a scanned body once (here: 1 of 4 layers); the plan multiplies
    loop bodies by their trip counts, so both layouts give the closed form."""
    assert _matmul_tokens(plans["adam"]) == pytest.approx(1.0, rel=0.02)
    assert _matmul_tokens(plans["muon"]) == pytest.approx(1.0, rel=0.02)
    assert plans["muon"]["optimizer_flops_per_chip"] > 0  # Newton-Schulz's dots
    assert plans["adam"]["optimizer_flops_per_chip"] == 0


def test_newton_schulz_runs_in_bf16_on_tpu(plans):
    """ns_dtype="auto" follows the mesh's devices (TPU), not the compiling host (CPU)."""
    assert plans["muon"]["ns_dtype"] == "bf16"
    assert plans["adam"]["ns_dtype"] is None


def test_memory_fits_and_remat_lowers_temporaries(plans):
    for name in ("adam", "remat", "muon"):
        r = plans[name]
        assert r["fits"] and 0 < r["memory"]["total_bytes"] < r["hbm_bytes"], name
        assert r["margin_bytes"] == r["hbm_bytes"] - r["memory"]["total_bytes"]
    assert plans["remat"]["memory"]["temp_bytes"] < plans["adam"]["memory"]["temp_bytes"]
    assert plans["remat"]["flops_per_chip"] > plans["adam"]["flops_per_chip"]  # recomputed


def test_a_plan_that_does_not_fit_is_reported(plans):
    r = plans["big"]
    assert r["fits"] is False and "HBM" in r["error"]
    assert "batch_size" in r["advice"] or "fsdp" in r["advice"]
    assert "NO" in planner.format_table([r]) or "no:" in planner.format_table([r])


def test_estimate_is_a_roofline_and_json_serialisable(plans):
    r = plans["muon"]
    e, chip = r["estimate"], planner.CHIPS["v5e"]
    assert e["step_s"] >= r["flops_per_chip"] / chip["peak"]
    assert e["step_s"] >= sum(r["collectives"].values()) / chip["ici_bw"]
    assert 0 < e["mfu"] < 1 and 0 < e["optimizer_share"] < 1
    assert r["collectives"]["all-to-all"] > 0  # the owner layout's exchange
    json.dumps(list(plans.values()))
    assert "v5e:2x2" in planner.format_table(list(plans.values()))
    assert r["saved"] and open(r["saved"], "rb").read(1)


def test_owner_layout_collectives_on_tpu_are_the_predicted_ones():
    """The optimizer alone on a (data=2, fsdp=4) mesh of v5e:2x4 chips: the TPU HLO holds
    exactly the collectives the design predicts (tests/test_optim_distributed.py), none of
    them an all-reduce, and Newton-Schulz's dots in bf16."""
    from jax.experimental import topologies

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from distributed_worker import fsdp_spec, matrix_axes, trees
    from test_optim_distributed import PREDICTED

    from amemory.optim import muon, owner_state_shardings

    devices = topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu").devices
    auto = (jax.sharding.AxisType.Auto,) * 2
    mesh = jax.make_mesh((2, 4), ("data", "fsdp"), axis_types=auto, devices=devices)
    params, grads = trees(steps=1)

    def shard(x):
        return jax.sharding.NamedSharding(mesh, fsdp_spec(np.shape(x), 4))

    def abstract(tree, shardings):
        sds = jax.ShapeDtypeStruct
        return jax.tree.map(lambda x, s: sds(np.shape(x), x.dtype, sharding=s), tree, shardings)

    tx = muon(0.1, matrix_axes=matrix_axes, ns_mesh=(mesh, "fsdp"), ns_dtype="auto")
    with planner.uncached(), jax.sharding.set_mesh(mesh):
        state = jax.eval_shape(tx.init, params)
        state_sh = owner_state_shardings(state, mesh, jax.tree.map(shard, state))
        args = (abstract(grads[0], jax.tree.map(shard, grads[0])), abstract(state, state_sh))
        args += (abstract(params, jax.tree.map(shard, params)),)
        text = jax.jit(tx.update).lower(*args).compile().as_text()
    stats = planner.hlo_stats(text, "jit(update_fn)")
    zero = dict.fromkeys(planner.COLLECTIVES, 0)
    assert stats["collective_ops"] == {**zero, **PREDICTED["muon"]}
    assert stats["scope_dot_dtypes"] == ["bf16"]


def test_gpu_target_compiles_without_a_gpu(corpus):
    """h100:8 through jax-cuda12-plugin with no GPU or driver: the same step, scanned Muon
    in bf16 FSDP over 8 GPUs, compiles; its FLOPs hold against the closed form."""
    pytest.importorskip("jax_cuda12_plugin", reason="pip install 'jax[cuda12-local]'")
    kw = {"optimizer.name": "muon", "model.scan_layers": True, "model.dtype": "bfloat16",
          "parallel.mode": "sharded", "parallel.fsdp": 8}  # fmt: skip
    r = planner.plan(lm_config(corpus, **kw), "h100:8")
    assert r["fits"] and r["chips"] == 8 and "bf16" in r["ns_dtype"]
    assert _matmul_tokens(r) == pytest.approx(1.0, rel=0.02)
    assert r["optimizer_collectives"]["all-to-all"] > 0
    assert sum(r["collectives"].values()) <= 1.25 * 3 * 4 * r["params"] * 7 / 8  # FSDP


def test_cpu_runs_do_not_start_the_tpu_runtime():
    """With libtpu installed, a JAX process on a CPU host that goes through `amemory`'s
    entry point prints no TPU-initialisation warnings (JAX_PLATFORMS is pinned to cpu);
    `amemory plan` with an unknown chip fails in one line before loading any compiler."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    code = (
        "from amemory import cli; cli._cpu_unless_accelerator(); import jax; print(jax.devices())"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "CpuDevice" in out.stdout
    assert "TPU" not in out.stderr, out.stderr
    bad = [sys.executable, "-m", "amemory", "plan", "--config", "experiments/configs/memory.py",
           "--topology", "v9:2x2"]  # fmt: skip
    out = subprocess.run(bad, env=env, capture_output=True, text=True)
    assert out.returncode == 2 and "TPU" not in out.stderr
    assert out.stderr.startswith("amemory plan: error: topology='v9:2x2'"), out.stderr


@pytest.fixture(scope="module")
def long_corpus(tmp_path_factory):
    """A corpus whose validation split fills 32 x 65-token batches."""
    d = tmp_path_factory.mktemp("long")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AMEMORY_DATA", str(d / "cache"))
        yield write_corpus(d, n_words=40000)


def test_scanned_fsdp_sends_the_parameters_not_the_activations(long_corpus, tmp_path):
    """FSDP over 4 chips, 32 x 64 tokens of width 128 (activations outweigh the weights):
    collective bytes per chip, scanned <= 1.25x per-layer and both <= 1.25x the analytic
    3 P (n-1)/n (P: parameter bytes in fp32; gathered forward and backward, gradients
    scattered). Before the activations were split over the batch in every block the
    partitioner all-gathered them instead: 10.6 MB scanned and 12.8 MB per-layer against
    3.7 MB. The per-layer plan goes through `amemory plan --json FILE`."""
    kw = {"optimizer.name": "adam", "model.dtype": "bfloat16", "parallel.mode": "sharded",
          "parallel.fsdp": 4, "model.d_model": 128, "model.n_heads": 4, "model.d_ff": 512,
          "model.n_layers": 2, "data.seq_len": 64, "data.batch_size": 32}  # fmt: skip
    scanned = planner.plan(lm_config(long_corpus, **kw, **{"model.scan_layers": True}), TOPOLOGY)
    overrides = [f"--config.{o}" for o in lm_overrides(long_corpus, **kw)]
    out = tmp_path / "plan.json"
    argv = ["--config", LM_CONFIG + ":full", "--topology", TOPOLOGY, "--json", str(out)]
    assert planner.main(argv + overrides) == 0
    (layer,) = json.loads(out.read_text())
    assert layer["vocab_size"] == scanned["vocab_size"] == 48
    assert layer["params"] == scanned["params"] > 0
    analytic = 3 * 4 * scanned["params"] * 3 / 4
    sent = {k: sum(r["collectives"].values()) for k, r in (("scan", scanned), ("layer", layer))}
    assert sent["scan"] <= 1.25 * sent["layer"], sent
    assert max(sent.values()) <= 1.25 * analytic, (sent, analytic)
