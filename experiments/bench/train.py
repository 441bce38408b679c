"""`amemory bench train`: train-step time of Muon, SignGD and Adam; the engine's overhead.

``--part optimizers``: the jitted training step of ``amemory.train`` (forward, backward,
update, per-role update RMS; donated buffers) of the ``--preset`` model (default ``small``)
on random tokens, batch 32 x 128 (``--quick``: 8 x 128): Adam on everything, or Muon or
SignGD on the hidden matrices and Adam on the rest, run round-robin, medians reported.
Predicted Muon/Adam: ``1 + NS FLOPs / step FLOPs`` (``planner.ns_flops``,
``planner.model_flops_per_token``), and ``1 + (t_update(X) - t_update(Adam)) / t_step(Adam)``
from the updates timed alone; SignGD: 1.00 by FLOPs.

``engine``: ``amemory.train``'s loop against a bare loop of the same jitted step on batches
already on the device (goal >= 0.97). ``scan``: compile and step time of ``gpt2-small`` with
``scan_layers`` on and off, and with one layer (goal: compile >= 4x faster scanned, step
within 5%). ``dtype``: the ``--preset`` model with bfloat16 compute against float32.
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import sys
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from amemory import atomic
from amemory.cli import Parser
from amemory.models import transformer
from amemory.train import engine, loop, optimizers, parallel, planner
from amemory.train.config import load_config
from amemory.train.state import TrainState
from experiments.bench import host_load, random_like

OPTIMIZERS = ("adam", "muon", "signgd")
PARTS = ("optimizers", "engine", "scan", "dtype")
REPO = pathlib.Path(__file__).resolve().parents[2]


def _lm_loss(graphdef):
    """``(params, tokens [B, T + 1], rng) -> (mean next-token cross-entropy, {})``."""

    def loss(p, b, rng):
        logits = transformer.apply(graphdef, p, b[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, b[:, 1:]).mean(), {}

    return loss


def bench_optimizers(args, batch: int, reps: int) -> dict:
    """Step and update times of Adam, Muon and SignGD, interleaved (see the module doc)."""
    base = transformer.PRESETS[args.preset]
    mc = transformer.preset(args.preset, max_len=max(args.seq, base.max_len), dtype=args.dtype)
    setups = {n: _step_setup(mc, batch, args.seq, n) for n in OPTIMIZERS}
    params = setups["adam"][1].params
    grads = random_like(params, seed=1)
    updates = {}
    for name, (_, state, _, opt) in setups.items():
        update, upd_state = jax.jit(opt.tx.update), opt.tx.init(state.params)
        jax.block_until_ready(update(grads, upd_state, state.params))
        updates[name] = (update, (grads, upd_state, state.params))
    res = _compare_steps(setups, reps, updates)

    roles = transformer.param_roles(params)
    hidden = [p.shape for p, r in zip(jax.tree.leaves(params), jax.tree.leaves(roles), strict=True)
              if r in ("q", "k", "v", "o", "w_in", "w_gate", "w_out")]  # fmt: skip
    f_step = planner.model_flops_per_token(mc, params, roles, args.seq) * batch * args.seq
    f_ns = sum(planner.ns_flops(s) for s in hidden)
    tokens_per_step = batch * args.seq
    med = {n: res[n]["step_ms_median"] / 1e3 for n in OPTIMIZERS}
    upd = {n: res[n]["update_ms_median"] / 1e3 for n in OPTIMIZERS}
    info = _device()
    peak = next((c["peak"] for k, c in planner.CHIPS.items() if k.upper() in info["device"]), None)
    others = ("muon", "signgd")
    out = {
        "preset": args.preset, "dtype": args.dtype, "batch": batch, "seq": args.seq, "reps": reps,
        "device": info["device"], "n_devices": jax.device_count(), "jax": info["jax"],
        "machine": info["machine"],
        "n_params": int(sum(np.prod(p.shape) for p in jax.tree.leaves(params))),
        "step_gflop": f_step / 1e9, "ns_gflop": f_ns / 1e9, "ns_share_of_step": f_ns / f_step,
        "predicted_ratio": {"muon/adam": 1.0 + f_ns / f_step, "signgd/adam": 1.0},
        # 1 + (update time of X - update time of Adam) / Adam's step time, updates timed alone
        "predicted_ratio_from_update_times": {
            f"{n}/adam": 1.0 + (upd[n] - upd["adam"]) / med["adam"] for n in others},
        "measured_ratio": {f"{n}/adam": med[n] / med["adam"] for n in others},
        "optimizers": {n: {
            **res[n], "tokens_per_s": tokens_per_step / med[n],
            "model_gflop_per_s": f_step / med[n] / 1e9,
            "mfu": (f_step / med[n] / peak) if (peak and args.dtype == "bfloat16") else None,
        } for n in OPTIMIZERS},
    }  # fmt: skip
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
    ap = Parser(prog="amemory bench train", description=__doc__.split("\n\n")[0])
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
    out: dict[str, Any] = {**_device(), **host_load()}
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


def _device() -> dict[str, str]:
    """The device (``platform:kind`` of the first), jax version and host machine."""
    d = jax.devices()[0]
    return {"device": f"{d.platform}:{d.device_kind}", "jax": jax.__version__,
            "machine": platform.machine()}  # fmt: skip


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

    The bare loop runs the step ``run`` builds (``amemory.train.engine.build``) on 8 batches
    of the task's input already on the device. The run is timed by its own records (the
    intervals between log points) and from outside (its wall time less the compiling
    step, so start-up, log-point work and the final evaluation count). Runs alternate.
    """
    steps, log_every, rounds = (31, 10, 2) if quick else (61, 20, 3)
    cfg = load_config(
        str(REPO / "experiments" / "configs" / "lm.py"),
        [f"steps={steps}", f"log_every={log_every}", f"eval_every={steps}", "spectrum_every=0",
         "checkpoint_every=0", "progress=false"],
    )  # fmt: skip
    b = engine.build(cfg, parallel.placement(cfg.parallel))
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
    return {"config": "experiments/configs/lm.py (quick): d=128, 2 layers, batch 16x128, muon",
            "steps": steps, "log_every": log_every, "rounds": rows,
            "ratio_median": float(np.median(ratios)),
            "outside_ratio_median": float(np.median(outside)), "goal": ">= 0.97"}  # fmt: skip


def _step_setup(mc, batch: int, seq: int, optimizer: str = "adam"):
    """A jitted train step of model ``mc`` (``optimizer`` on the hidden matrices, Adam on the
    rest), its state, random tokens ``[batch, seq + 1]`` and the optimizer."""
    cfg = load_config(
        str(REPO / "experiments" / "configs" / "lm.py") + ":full",
        [f"optimizer.name={optimizer}", "optimizer.diagnostics=false"],
    )
    params = transformer.init_params(mc, jax.random.PRNGKey(0))
    roles = transformer.param_roles(params)
    opt = optimizers.build(cfg, params, roles, matrix_axes=transformer.matrix_axes)
    graphdef = transformer._graphdef(mc)
    step = jax.jit(engine.make_train_step(_lm_loss(graphdef), opt, roles), donate_argnums=0)
    state = TrainState(jnp.zeros((), jnp.int32), params, opt.tx.init(params), jax.random.PRNGKey(1))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, mc.vocab_size, (batch, seq + 1)), jnp.int32)
    return step, state, tokens, opt


def _compare_steps(variants: dict, reps: int, updates: dict | None = None) -> dict:
    """Compile each variant's step (lower + compile, timed), then time steps round-robin;
    ``updates`` (name -> ``(fn, args)``) are timed each after its variant's step."""
    runs = {}
    for name, (step, state, tokens, _) in variants.items():
        t0 = time.perf_counter()
        compiled = step.lower(state, tokens).compile()
        compile_s = time.perf_counter() - t0
        state, m = compiled(state, tokens)  # warm
        jax.block_until_ready(m["loss"])
        runs[name] = {"fn": compiled, "state": state, "tokens": tokens, "compile_s": compile_s,
                      "times": []}  # fmt: skip
        print(f"  {name}: compiled in {compile_s:.1f} s")
    update_times: dict[str, list[float]] = {n: [] for n in updates or {}}
    for _ in range(reps):
        for name, r in runs.items():
            t0 = time.perf_counter()
            r["state"], m = r["fn"](r["state"], r["tokens"])
            jax.block_until_ready(m["loss"])
            r["times"].append(time.perf_counter() - t0)
            if updates:
                fn, args = updates[name]
                t0 = time.perf_counter()
                jax.block_until_ready(fn(*args))
                update_times[name].append(time.perf_counter() - t0)
    out = {n: {"compile_s": r["compile_s"], "step_ms_median": 1e3 * float(np.median(r["times"])),
               "step_ms_min": 1e3 * float(np.min(r["times"]))}
           for n, r in runs.items()}  # fmt: skip
    for n, t in update_times.items():
        out[n]["update_ms_median"] = 1e3 * float(np.median(t))
    return out


def bench_scan(quick: bool) -> dict:
    """gpt2-small (quick: ``small``) with scan_layers off / on: compile and step time.

    A third row, the same model with one layer, separates the part of the compile time
    that does not grow with the depth (what scanning cannot remove).
    """
    preset, batch, seq, reps = ("small", 4, 128, 3) if quick else ("gpt2-small", 2, 128, 5)
    mc = transformer.preset(preset)
    print(f"scan: {preset}, batch {batch}x{seq}, Adam, {reps} interleaved steps")
    variants = {"per_layer": mc, "scanned": mc.replace(scan_layers=True),
                "one_layer": mc.replace(n_layers=1)}  # fmt: skip
    res = _compare_steps({k: _step_setup(m, batch, seq) for k, m in variants.items()}, reps)
    compile_x = res["per_layer"]["compile_s"] / res["scanned"]["compile_s"]
    step_ratio = res["scanned"]["step_ms_median"] / res["per_layer"]["step_ms_median"]
    print(
        f"scan: compile {compile_x:.2f}x faster scanned (goal >= 4); step time "
        f"scanned/per-layer {step_ratio:.3f} (goal within 5%)"
    )
    return {"preset": preset, "n_layers": mc.n_layers, "batch": batch, "seq": seq, "reps": reps,
            "optimizer": "adam", **res, "compile_speedup": compile_x,
            "step_ratio_scanned_over_per_layer": step_ratio}  # fmt: skip


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
    return {"preset": args.preset, "batch": batch, "seq": args.seq, "reps": reps,
            "optimizer": "adam", **res, "step_ratio_bf16_over_fp32": ratio}  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
