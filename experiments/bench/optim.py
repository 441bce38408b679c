"""`amemory bench optim`: amemory's Muon update against optax.contrib.muon.

Both optimizers see the same GPT-shaped tree of hidden matrices (no vectors, so
optax routes every leaf to its Muon branch) at matched settings: preset
``"optax"`` (EMA momentum 0.95 with bias correction, NAdam Nesterov, Keller
Jordan's coefficients x5, eps 1e-8, fp32, shape scale sqrt(max(1, fan_out/fan_in))),
which reproduces optax's update (tests/test_optim_muon.py). Timings of the two
jitted ``update`` calls and of a large square matmul (the machine's practical
peak) are interleaved in one process, so load on a shared machine hits all three
alike; medians are reported.

Figures:
- ``ratio``: median time of amemory's update / optax's (lower is better).
- ``amemory-pe``: amemory with Polar Express coefficients (same FLOPs, lower
  orthogonality error), shown beside the matched pair.
- ``ortho_error``: ``orthogonality_error`` of each one's orthogonalised matrices
  (update divided by ``-lr * shape_scale``), mean and max over leaves.
- ``GFLOP/s``: nominal Newton-Schulz FLOPs (direct quintic on the smaller Gram
  side: ``steps * (4 k^2 l + 2 k^3)`` per ``k x l`` matrix, ``k <= l``) divided by
  the update time, for both; amemory also reports its *actual* FLOPs (its Gram
  form does fewer), so ``actual GFLOP/s`` is the comparable one to the matmul rate.

Usage:
  amemory bench optim [--quick] [--trees cpu,gpt2-small] [--reps N]
                      [--gpt2-layers N] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax.contrib import muon as optax_muon

from amemory import atomic
from amemory.optim import muon, orthogonality_error, shape_scale_factor

TREES = {
    # name: (d_model, n_layers, d_ff)
    "cpu": (256, 4, 1024),
    "gpt2-small": (768, 12, 3072),
}
LR = 0.02
NS_STEPS = 5


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one-line error, exit 2
        sys.stderr.write(f"amemory bench optim: error: {message}\n")
        raise SystemExit(2)


def gpt_tree(d: int, n_layers: int, d_ff: int, seed: int = 0) -> dict[str, Any]:
    """Hidden matrices of a GPT block stack, Flax layout ``[fan_in, fan_out]``, fp32."""
    rng = np.random.default_rng(seed)
    tree: dict[str, Any] = {}
    for i in range(n_layers):
        shapes = {"q": (d, d), "k": (d, d), "v": (d, d), "o": (d, d)}
        shapes |= {"w_in": (d, d_ff), "w_out": (d_ff, d)}
        tree[f"layer{i}"] = {
            n: jnp.asarray(rng.standard_normal(s) / np.sqrt(s[0]), jnp.float32)
            for n, s in shapes.items()
        }
    return tree


def ns_flops(shape: tuple[int, int], steps: int = NS_STEPS, method: str = "direct") -> float:
    """FLOPs of one NS orthogonalisation of a matrix (matmuls only, 2 per multiply-add)."""
    k, l = sorted(shape)
    if method == "direct":
        return steps * (4.0 * k * k * l + 2.0 * k**3)
    # gram: X X^T and Q X once; per step A^2 and P Q (not at step 0), P (P A) and A^2 A
    # (not at the last step)
    per = 2.0 * k**3
    return 4.0 * k * k * l + steps * per + (steps - 1) * per + (steps - 1) * 2 * per


def _our_method(shape: tuple[int, int]) -> str:
    k, l = sorted(shape)
    return "gram" if l >= 2 * k else "direct"


def _timed(fn, *args) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0


def _ortho_errors(updates: dict, lr: float) -> np.ndarray:
    errs = []
    for leaf in jax.tree.leaves(updates):
        fi, fo = leaf.shape
        o = -leaf / (lr * shape_scale_factor("jordan", fi, fo))
        errs.append(float(orthogonality_error(o)))
    return np.asarray(errs)


def bench_tree(name: str, params: dict, reps: int, mm_n: int) -> dict[str, Any]:
    """Time both updates and the matmul, interleaved; return the figures for one tree."""
    rng = np.random.default_rng(1)
    grads = jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), x.dtype), params)
    candidates = {
        "amemory": muon(LR, preset="optax"),
        "optax": optax_muon(LR),
        # same cost, Polar Express coefficients: the lower-error option at 5 steps
        "amemory-pe": muon(LR, preset="optax", ns_coeffs="polar_express"),
    }
    fns, states, compile_s, errs = {}, {}, {}, {}
    for key, tx in candidates.items():
        states[key] = tx.init(params)
        fns[key] = jax.jit(tx.update)
        t0 = time.perf_counter()
        u, _ = fns[key](grads, states[key], params)
        jax.block_until_ready(u)
        compile_s[key] = time.perf_counter() - t0
        errs[key] = _ortho_errors(u, LR)
    a = jnp.asarray(np.random.default_rng(2).standard_normal((mm_n, mm_n)), jnp.float32)
    matmul = jax.jit(lambda x: x @ x)
    jax.block_until_ready(matmul(a))
    times: dict[str, list[float]] = {k: [] for k in candidates} | {"matmul": []}
    for _ in range(reps):
        for key in candidates:
            times[key].append(_timed(fns[key], grads, states[key], params))
        times["matmul"].append(_timed(matmul, a))
    med = {k: float(np.median(v)) for k, v in times.items()}
    shapes = [tuple(x.shape) for x in jax.tree.leaves(params)]
    nominal = sum(ns_flops(s) for s in shapes)
    actual = sum(ns_flops(s, method=_our_method(s)) for s in shapes)
    matmul_gflops = 2.0 * mm_n**3 / med["matmul"] / 1e9
    return {
        "tree": name,
        "n_matrices": len(shapes),
        "n_params": int(sum(np.prod(s) for s in shapes)),
        "reps": reps,
        "time_ms": {k: 1e3 * v for k, v in med.items()},
        "time_ms_all": {k: [1e3 * t for t in v] for k, v in times.items()},
        "compile_s": compile_s,
        "ratio": med["amemory"] / med["optax"],
        "ortho_error_mean": {k: float(v.mean()) for k, v in errs.items()},
        "ortho_error_max": {k: float(v.max()) for k, v in errs.items()},
        "nominal_ns_gflop": nominal / 1e9,
        "amemory_actual_ns_gflop": actual / 1e9,
        "gflops_effective": {k: nominal / med[k] / 1e9 for k in candidates},
        "amemory_gflops_actual": actual / med["amemory"] / 1e9,
        "matmul_n": mm_n,
        "matmul_gflops": matmul_gflops,
    }


def _print_row(r: dict[str, Any]) -> None:
    t, e, g = r["time_ms"], r["ortho_error_mean"], r["gflops_effective"]
    print(
        f"\n[{r['tree']}] {r['n_matrices']} matrices, {r['n_params'] / 1e6:.2f}M params, "
        f"NS {r['nominal_ns_gflop']:.1f} GFLOP nominal ({r['amemory_actual_ns_gflop']:.1f} "
        f"actual in amemory), median of {r['reps']}"
    )
    print(f"  {'':10s} {'time ms':>10s} {'GFLOP/s eff':>12s} {'ortho err mean/max':>20s}")
    for k in ("amemory", "optax", "amemory-pe"):
        print(f"  {k:10s} {t[k]:10.1f} {g[k]:12.1f} {e[k]:9.4f}/{r['ortho_error_max'][k]:.4f}")
    print(
        f"  ratio amemory/optax = {r['ratio']:.3f}; amemory actual "
        f"{r['amemory_gflops_actual']:.1f} GFLOP/s; large matmul ({r['matmul_n']}^3) "
        f"{r['matmul_gflops']:.1f} GFLOP/s"
    )


def main(argv: list[str]) -> int:
    """Run the benchmark; ``argv`` excludes the program name. Returns an exit code."""
    parser = _Parser(prog="amemory bench optim", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="cpu tree only, 3 reps (~20 s)")
    parser.add_argument(
        "--trees", default=None, help=f"comma list from {sorted(TREES)} (default: all)"
    )
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions per tree")
    parser.add_argument(
        "--gpt2-layers", type=int, default=12, help="layers of the gpt2-small tree (default 12)"
    )
    parser.add_argument("--matmul-n", type=int, default=None, help="size of the peak matmul")
    parser.add_argument("--json", type=pathlib.Path, default=None, help="write figures here")
    args = parser.parse_args(argv)
    trees = args.trees.split(",") if args.trees else (["cpu"] if args.quick else list(TREES))
    bad = [t for t in trees if t not in TREES]
    if bad:
        parser.error(f"unknown tree(s) {bad}; choose from {sorted(TREES)}")
    reps = args.reps if args.reps is not None else (3 if args.quick else 5)
    if reps < 1 or args.gpt2_layers < 1:
        parser.error("--reps and --gpt2-layers must be >= 1")
    mm_n = args.matmul_n or (1024 if args.quick else 2048)
    dev = jax.devices()[0]
    print(
        f"amemory bench optim: jax {jax.__version__}, optax {optax.__version__}, "
        f"{dev.platform} ({dev.device_kind}), {os.cpu_count()} host cores"
    )
    results = []
    for name in trees:
        d, n_layers, d_ff = TREES[name]
        if name == "gpt2-small":
            n_layers = args.gpt2_layers
        tree_reps = reps if name == "cpu" else max(1, min(reps, 2))
        r = bench_tree(name, gpt_tree(d, n_layers, d_ff), tree_reps, mm_n)
        r["shape"] = {"d_model": d, "n_layers": n_layers, "d_ff": d_ff}
        _print_row(r)
        results.append(r)
    if args.json:
        payload = {
            "command": "amemory bench optim " + " ".join(argv),
            "jax": jax.__version__,
            "optax": optax.__version__,
            "platform": dev.platform,
            "device_kind": dev.device_kind,
            "host_cores": os.cpu_count(),
            "machine": platform.machine(),
            "results": results,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_json(args.json, payload)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
