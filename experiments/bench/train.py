"""`amemory bench train`: train-step time of Muon, SignGD and Adam; the engine's overhead.

What is measured: the real jitted training step of ``amemory.train`` (forward,
backward, optimizer update, per-role update RMS; donated buffers) of the
``small`` transformer preset (d=256, 4 layers, d_ff=1024, V=8192; 7.3M
parameters) on random tokens, batch 32 x 128 (``--quick``: the same model,
batch 8 x 128). Three optimizers share the routing of the training configs:

  adam     Adam on every parameter;
  muon     Muon (Keller Jordan's settings, 5 Newton-Schulz steps) on the hidden
           matrices (q, k, v, o, w_in, w_out), Adam on embed / head / norm;
  signgd   SignGD on the hidden matrices, Adam on the rest.

Steps of the three are interleaved in one process (round-robin, one step each),
so load on a shared machine hits them alike; medians are reported.

Predicted ratio. If the step runs at one FLOP rate, Muon's extra time is the
Newton-Schulz FLOPs at that rate, so

    predicted Muon/Adam = 1 + NS FLOPs / step FLOPs,

with step FLOPs = 6 N_matmul tokens + 12 L T d tokens (matmul parameters incl.
the LM head, plus attention scores and values; ``amemory.train.planner``) and the NS
FLOPs those amemory performs (direct quintic ``5 (4k^2 l + 2k^3)`` per ``k x l``
matrix, ``k <= l``, or its Gram form for ``l >= 2k``; see experiments/bench/optim.py).
SignGD adds only elementwise work: predicted 1.00 by FLOPs. A second prediction
uses the optimizer updates timed alone on the same parameters (random gradients):
``1 + (t_update(X) - t_update(Adam)) / t_step(Adam)``; it accounts for the step
and Newton-Schulz running at different FLOP rates.

Three more parts measure the training engine (``--part``, repeatable; default all):

  engine   ``amemory.train``'s loop (Grain input, prefetch, metrics reduced on the
           device, TensorBoard) against a bare loop calling the same jitted step on
           batches already on the device, on the quick LM config (Shakespeare, d=128, 2
           layers, batch 16 x 128, Muon), by the run's records and timed from outside
           (whole run less compile); runs alternate (goal >= 0.97);
  scan     compile time and step time of ``gpt2-small`` (124M parameters, Adam, batch
           2 x 128) with ``scan_layers`` on and off, steps interleaved (goal: compile
           >= 4x faster scanned, step within 5%), and of its one-layer version (the part
           of the compile time that does not grow with depth);
  dtype    step time of the ``--preset`` model with bfloat16 compute against float32
           (float32 master weights), steps interleaved.

Usage:
  amemory bench train [--part optimizers|engine|scan|dtype ...] [--quick] [--reps N]
                      [--preset small] [--batch B] [--seq T] [--dtype float32|bfloat16]
                      [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from amemory import atomic
from amemory.models import transformer
from amemory.train import optimizers, planner
from amemory.train.config import load_config
from amemory.train.engine import make_train_step
from amemory.train.planner import CHIPS
from amemory.train.state import TrainState
from experiments.bench import host_load

OPTIMIZERS = ("adam", "muon", "signgd")
PARTS = ("optimizers", "engine", "scan", "dtype")
REPO = pathlib.Path(__file__).resolve().parents[2]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one-line error, exit 2
        sys.stderr.write(f"amemory bench train: error: {message}\n")
        raise SystemExit(2)


def ns_flops(shape: tuple[int, ...], steps: int = 5) -> float:
    """Newton-Schulz FLOPs amemory performs on one ``k x l`` matrix (Gram form if l >= 2k)."""
    k, l = sorted(shape)
    if l < 2 * k:
        return steps * (4.0 * k * k * l + 2.0 * k**3)
    per = 2.0 * k**3
    return 4.0 * k * k * l + steps * per + (steps - 1) * per + (steps - 1) * 2 * per


def _random_like(tree: Any, seed: int) -> Any:
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), p.dtype), tree)


def _setup(name: str, mc, batch: int, seq: int, lr_overrides: list[str]):
    cfg = load_config(
        str(REPO / "experiments" / "configs" / "lm.py") + ":full",
        [f"optimizer.name={name}", "optimizer.muon_roles=hidden", "optimizer.diagnostics=false"]
        + lr_overrides,
    )
    params = transformer.init_params(mc, jax.random.PRNGKey(0))
    roles = transformer.param_roles(params)
    opt = optimizers.build(cfg, params, roles)
    graphdef = transformer._graphdef(mc)

    step = jax.jit(make_train_step(_lm_loss(graphdef), opt, roles), donate_argnums=0)
    state = TrainState(jnp.zeros((), jnp.int32), params, opt.tx.init(params), jax.random.PRNGKey(1))
    return step, state, params, opt


def _lm_loss(graphdef):
    """``(params, tokens [B, T + 1], rng) -> (mean next-token cross-entropy, {})``."""
    import optax

    def loss(p, b, rng):
        logits = transformer.apply(graphdef, p, b[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, b[:, 1:]).mean(), {}

    return loss


def bench_optimizers(args, batch: int, reps: int) -> dict:
    """Step and update times of Adam, Muon and SignGD, interleaved (see the module doc)."""
    base = transformer.PRESETS[args.preset]
    mc = transformer.preset(args.preset, max_len=max(args.seq, base.max_len), dtype=args.dtype)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, mc.vocab_size, (batch, args.seq + 1)), jnp.int32)

    runs = {}
    grads = None
    for name in OPTIMIZERS:
        step, state, params, opt = _setup(name, mc, batch, args.seq, [])
        if grads is None:
            grads = _random_like(params, seed=1)
        update = jax.jit(opt.tx.update)
        upd_state = opt.tx.init(params)
        jax.block_until_ready(update(grads, upd_state, params))
        t0 = time.perf_counter()
        state, m = step(state, tokens)
        jax.block_until_ready(m["loss"])
        runs[name] = {"step": step, "state": state, "compile_s": time.perf_counter() - t0}
        state, m = step(runs[name]["state"], tokens)  # one warm step
        jax.block_until_ready(m["loss"])
        runs[name]["state"], runs[name]["times"] = state, []
        runs[name]["update"] = (update, upd_state, params)
        runs[name]["update_times"] = []
    for _ in range(reps):
        for name in OPTIMIZERS:
            r = runs[name]
            t0 = time.perf_counter()
            r["state"], m = r["step"](r["state"], tokens)
            jax.block_until_ready(m["loss"])
            r["times"].append(time.perf_counter() - t0)
            update, upd_state, p0 = r["update"]
            t0 = time.perf_counter()
            jax.block_until_ready(update(grads, upd_state, p0))
            r["update_times"].append(time.perf_counter() - t0)

    hidden = [
        p.shape
        for p, r in zip(
            jax.tree.leaves(params), jax.tree.leaves(transformer.param_roles(params)), strict=True
        )
        if r in ("q", "k", "v", "o", "w_in", "w_gate", "w_out")
    ]
    roles = transformer.param_roles(params)
    f_step = planner.model_flops_per_token(mc, params, roles, args.seq) * batch * args.seq
    f_ns = sum(ns_flops(s) for s in hidden)
    tokens_per_step = batch * args.seq
    med = {n: float(np.median(runs[n]["times"])) for n in OPTIMIZERS}
    upd = {n: float(np.median(runs[n]["update_times"])) for n in OPTIMIZERS}
    device = jax.devices()[0]
    peak = next((c["peak"] for k, c in CHIPS.items() if k.upper() in device.device_kind), None)
    out = {
        "preset": args.preset,
        "dtype": args.dtype,
        "batch": batch,
        "seq": args.seq,
        "reps": reps,
        "device": f"{device.platform}:{device.device_kind}",
        "n_devices": jax.device_count(),
        "jax": jax.__version__,
        "machine": platform.machine(),
        "n_params": int(sum(np.prod(p.shape) for p in jax.tree.leaves(params))),
        "step_gflop": f_step / 1e9,
        "ns_gflop": f_ns / 1e9,
        "ns_share_of_step": f_ns / f_step,
        "predicted_ratio": {"muon/adam": 1.0 + f_ns / f_step, "signgd/adam": 1.0},
        # 1 + (update time of X - update time of Adam) / Adam's step time, updates timed alone
        "predicted_ratio_from_update_times": {
            f"{n}/adam": 1.0 + (upd[n] - upd["adam"]) / med["adam"] for n in ("muon", "signgd")
        },
        "measured_ratio": {
            "muon/adam": med["muon"] / med["adam"],
            "signgd/adam": med["signgd"] / med["adam"],
        },
        "optimizers": {
            n: {
                "step_ms_median": 1e3 * med[n],
                "step_ms_min": 1e3 * float(np.min(runs[n]["times"])),
                "tokens_per_s": tokens_per_step / med[n],
                "model_gflop_per_s": f_step / med[n] / 1e9,
                "mfu": (f_step / med[n] / peak) if (peak and args.dtype == "bfloat16") else None,
                "compile_s": runs[n]["compile_s"],
                "update_ms_median": 1e3 * upd[n],
            }
            for n in OPTIMIZERS
        },
    }
    print(
        f"amemory bench train: preset={args.preset} ({out['n_params']:,} params) "
        f"batch={batch}x{args.seq} dtype={args.dtype} device={out['device']} reps={reps}"
    )
    print(
        f"{'optimizer':10s} {'step ms':>9s} {'tokens/s':>10s} {'GFLOP/s':>9s} "
        f"{'update ms':>9s} {'compile s':>9s}"
    )
    for n in OPTIMIZERS:
        o = out["optimizers"][n]
        mfu = f"  MFU {100 * o['mfu']:.1f}%" if o["mfu"] is not None else ""
        print(
            f"{n:10s} {o['step_ms_median']:9.1f} {o['tokens_per_s']:10.0f} "
            f"{o['model_gflop_per_s']:9.1f} {o['update_ms_median']:9.1f} "
            f"{o['compile_s']:9.1f}{mfu}"
        )
    print(
        f"step {f_step / 1e9:.2f} GFLOP, Newton-Schulz {f_ns / 1e9:.2f} GFLOP "
        f"({100 * f_ns / f_step:.1f}% of the step)"
    )
    for k in ("muon/adam", "signgd/adam"):
        print(
            f"ratio {k}: measured {out['measured_ratio'][k]:.3f}, "
            f"predicted from FLOPs {out['predicted_ratio'][k]:.3f}, "
            f"from update times {out['predicted_ratio_from_update_times'][k]:.3f}"
        )
    return out


def main(argv: list[str]) -> int:
    """Run the benchmark; print a table; optionally write ``--json``. Returns the exit status."""
    ap = _Parser(prog="amemory bench train", description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", action="append", choices=PARTS, help="what to measure (repeatable)")
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer reps (minutes)")
    ap.add_argument("--reps", type=int, default=None, help="timed steps per optimizer")
    ap.add_argument("--preset", default="small", choices=tuple(transformer.PRESETS))
    ap.add_argument("--batch", type=int, default=None, help="sequences per step")
    ap.add_argument("--seq", type=int, default=128, help="tokens per sequence")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--json", default=None, help="write the figures to this JSON file")
    args = ap.parse_args(argv)
    batch = args.batch or (8 if args.quick else 32)
    reps = args.reps or (5 if args.quick else 10)
    if reps < 1 or batch < 1 or args.seq < 2:
        ap.error("--reps, --batch must be >= 1 and --seq >= 2")
    parts = tuple(p for p in PARTS if p in (args.part or PARTS))
    device = jax.devices()[0]
    out: dict[str, Any] = {
        "device": f"{device.platform}:{device.device_kind}",
        "jax": jax.__version__,
        "machine": platform.machine(),
        **host_load(),
    }
    if "optimizers" in parts:
        out["optimizers"] = bench_optimizers(args, batch, reps)
    if "engine" in parts:
        out["engine"] = bench_engine(args.quick)
    if "scan" in parts:
        out["scan"] = bench_scan(args.quick)
    if "dtype" in parts:
        out["dtype"] = bench_dtype(args, batch, reps)
    out["load_average_end"] = list(os.getloadavg())
    if args.json:
        atomic.write_json(args.json, out)
    return 0


# ----------------------------------------------------------------------------- engine


def _interval_tokens_per_s(workdir: pathlib.Path) -> float:
    """Tokens/s of a run from its train records (intervals after compilation only)."""
    recs = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    train, prev, tokens, seconds = [r for r in recs if r["kind"] == "train"], 1, 0.0, 0.0
    for r in train:
        if "tokens_per_s" in r:
            n = r["step"] - prev
            seconds += r["step_time_s"] * n
            tokens += r["tokens_per_s"] * r["step_time_s"] * n
        prev = r["step"]
    return tokens / seconds


def bench_engine(quick: bool) -> dict:
    """Engine overhead: ``amemory.train.run`` vs a bare loop of the same jitted step.

    The bare loop runs the step ``run`` builds (``amemory.train.engine.build``) on 8
    batches of the task's Grain input put on the device first, timing
    ``state, acc = engine.step(state, acc, batch)`` alone. The run is timed two ways: by
    its own records (the intervals between log points), and from outside, its whole wall
    time less its first (compiling) step, so that start-up, log-point work (jsonl and
    TensorBoard writes, the finiteness check) and the final evaluation count. Runs alternate.
    """
    import tempfile

    from amemory.train import engine as engine_lib
    from amemory.train import loop, parallel

    steps, log_every, rounds = (31, 10, 2) if quick else (61, 20, 3)
    cfg = load_config(
        str(REPO / "experiments" / "configs" / "lm.py"),
        [
            f"steps={steps}",
            f"log_every={log_every}",
            f"eval_every={steps}",
            "spectrum_every=0",
            "checkpoint_every=0",
            "progress=false",
        ],
    )
    b = engine_lib.build(cfg, parallel.placement(cfg.parallel))
    it, eng = b.task.train_input(), b.engine
    batches = [eng.put_batch(next(it)) for _ in range(8)]
    state, acc = eng.init_state(), eng.new_accumulator(batches[0])
    state, acc = eng.step(state, acc, batches[0])  # compile
    jax.block_until_ready(acc)
    rows = []
    for r in range(rounds):
        with tempfile.TemporaryDirectory() as wd:
            t0 = time.perf_counter()
            summary = loop.run(cfg, wd)[0]
            outside_s = time.perf_counter() - t0 - summary["compile_s"]
            engine_tps = _interval_tokens_per_s(pathlib.Path(wd))
        t0 = time.perf_counter()
        for i in range(steps - 1):  # the same steps (2..steps)
            state, acc = eng.step(state, acc, batches[i % len(batches)])
        jax.block_until_ready((state, acc))
        bare_s = time.perf_counter() - t0
        bare_tps = b.task.tokens_per_step * (steps - 1) / bare_s
        row = {"engine_tokens_per_s": engine_tps, "bare_tokens_per_s": bare_tps,
               "ratio": engine_tps / bare_tps, "run_outside_s": outside_s, "bare_s": bare_s,
               "outside_ratio": bare_s / outside_s, "load_average": os.getloadavg()[0]}  # fmt: skip
        rows.append(row)
        print(
            f"engine round {r}: records {engine_tps:.0f} tok/s, bare {bare_tps:.0f} tok/s "
            f"(ratio {row['ratio']:.3f}); whole run from outside {outside_s:.2f} s vs bare "
            f"{bare_s:.2f} s (ratio {row['outside_ratio']:.3f})"
        )
    ratios = [x["ratio"] for x in rows]
    outside = [x["outside_ratio"] for x in rows]
    print(f"engine/bare tokens/s: median {np.median(ratios):.3f} by the records, "
          f"{np.median(outside):.3f} timed from outside (goal >= 0.97)")  # fmt: skip
    return {
        "config": "experiments/configs/lm.py (quick): d=128, 2 layers, batch 16x128, muon",
        "steps": steps,
        "log_every": log_every,
        "rounds": rows,
        "ratio_median": float(np.median(ratios)),
        "outside_ratio_median": float(np.median(outside)),
        "goal": ">= 0.97",
    }


# ----------------------------------------------------------------------------- scan, dtype


def _step_setup(mc, batch: int, seq: int, optimizer: str = "adam"):
    """A jitted train step of model ``mc`` (Adam on everything), its state and tokens."""
    cfg = load_config(
        str(REPO / "experiments" / "configs" / "lm.py") + ":full",
        [f"optimizer.name={optimizer}", "optimizer.diagnostics=false"],
    )
    params = transformer.init_params(mc, jax.random.PRNGKey(0))
    roles = transformer.param_roles(params)
    opt = optimizers.build(cfg, params, roles, matrix_axes=transformer.matrix_axes)
    graphdef = transformer._graphdef(mc)
    step = jax.jit(make_train_step(_lm_loss(graphdef), opt, roles), donate_argnums=0)
    state = TrainState(jnp.zeros((), jnp.int32), params, opt.tx.init(params), jax.random.PRNGKey(1))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, mc.vocab_size, (batch, seq + 1)), jnp.int32)
    return step, state, tokens


def _compare_steps(variants: dict, reps: int) -> dict:
    """Compile each variant's step (lower + compile, timed), then time steps round-robin."""
    runs = {}
    for name, (step, state, tokens) in variants.items():
        t0 = time.perf_counter()
        compiled = step.lower(state, tokens).compile()
        compile_s = time.perf_counter() - t0
        state, m = compiled(state, tokens)  # warm
        jax.block_until_ready(m["loss"])
        runs[name] = {
            "fn": compiled,
            "state": state,
            "tokens": tokens,
            "compile_s": compile_s,
            "times": [],
        }
        print(f"  {name}: compiled in {compile_s:.1f} s")
    for _ in range(reps):
        for r in runs.values():
            t0 = time.perf_counter()
            r["state"], m = r["fn"](r["state"], r["tokens"])
            jax.block_until_ready(m["loss"])
            r["times"].append(time.perf_counter() - t0)
    return {
        n: {
            "compile_s": r["compile_s"],
            "step_ms_median": 1e3 * float(np.median(r["times"])),
            "step_ms_min": 1e3 * float(np.min(r["times"])),
        }
        for n, r in runs.items()
    }


def bench_scan(quick: bool) -> dict:
    """gpt2-small (quick: ``small``) with scan_layers off / on: compile and step time.

    A third row, the same model with one layer, separates the part of the compile time
    that does not grow with the depth (what scanning cannot remove).
    """
    preset, batch, seq, reps = ("small", 4, 128, 3) if quick else ("gpt2-small", 2, 128, 5)
    mc = transformer.preset(preset)
    print(f"scan: {preset}, batch {batch}x{seq}, Adam, {reps} interleaved steps")
    res = _compare_steps(
        {
            "per_layer": _step_setup(mc, batch, seq),
            "scanned": _step_setup(mc.replace(scan_layers=True), batch, seq),
            "one_layer": _step_setup(mc.replace(n_layers=1), batch, seq),
        },
        reps,
    )
    compile_x = res["per_layer"]["compile_s"] / res["scanned"]["compile_s"]
    step_ratio = res["scanned"]["step_ms_median"] / res["per_layer"]["step_ms_median"]
    print(
        f"scan: compile {compile_x:.2f}x faster scanned (goal >= 4); step time "
        f"scanned/per-layer {step_ratio:.3f} (goal within 5%)"
    )
    return {
        "preset": preset,
        "n_layers": mc.n_layers,
        "batch": batch,
        "seq": seq,
        "reps": reps,
        "optimizer": "adam",
        **res,
        "compile_speedup": compile_x,
        "step_ratio_scanned_over_per_layer": step_ratio,
    }


def bench_dtype(args, batch: int, reps: int) -> dict:
    """``--preset`` model with bfloat16 compute vs float32 (float32 weights): step time."""
    base = transformer.PRESETS[args.preset]
    mc = transformer.preset(args.preset, max_len=max(args.seq, base.max_len))
    print(f"dtype: {args.preset}, batch {batch}x{args.seq}, Adam, {reps} interleaved steps")
    res = _compare_steps(
        {d: _step_setup(mc.replace(dtype=d), batch, args.seq) for d in ("float32", "bfloat16")},
        reps,
    )
    ratio = res["bfloat16"]["step_ms_median"] / res["float32"]["step_ms_median"]
    print(f"dtype: step time bfloat16/float32 {ratio:.3f}")
    return {
        "preset": args.preset,
        "batch": batch,
        "seq": args.seq,
        "reps": reps,
        "optimizer": "adam",
        **res,
        "step_ratio_bf16_over_fp32": ratio,
    }


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
