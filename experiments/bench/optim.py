"""`amemory bench optim`: amemory's Muon update against optax.contrib.muon, and its NS roofline.

Every optimizer sees the same GPT-shaped tree of hidden matrices (no vectors, so optax
routes every leaf to its Muon branch). Rows (jitted ``update`` calls, timed round-robin
in one process so load on a shared machine hits all alike; medians reported):

- ``optax``: ``optax.contrib.muon(0.02)``;
- ``contrib``: ``amemory.optim.contrib.muon(0.02)``, identical arguments (the drop-in);
- ``amemory``: ``amemory.optim.muon(0.02, preset="optax")``, optax's maths (EMA 0.95 with
  bias correction, NAdam Nesterov, Jordan's coefficients x5, eps 1e-8, fp32), Gram form
  for aspect ratio >= 2 (``ns_method="auto"``; no restart in float32);
- ``restart``: the same with the Gram form's restart after step 2 (``gram_restarts=(2,)``,
  what it costs where low precision needs it);
- ``direct``: the same with ``ns_method="direct"`` (no Gram form);
- ``aol5`` / ``aol4``: AOL pre-conditioning (Turbo-Muon), Jordan x5 / x4;
- ``pe5``: Polar Express coefficients x5 (same FLOPs, lower error);
- ``dion4-aol``: Dion's table x4 with AOL (20% fewer NS FLOPs).

Figures per tree:

- ``ortho_error``: ``orthogonality_error`` of each row's orthogonalised matrices
  (update divided by ``-lr * shape_scale``), mean and max over leaves;
- ``ratio``: ``amemory``'s time / optax's (same maths), ``contrib``'s / optax's, and
  ``best``: the fastest amemory row whose mean and max orthogonality error are both at
  most optax's, over optax's (the issue's goal: <= 0.35);
- NS efficiency (goal >= 0.85) = roofline time / NS time, where NS time is amemory's
  orthogonalisation alone (``newton_schulz`` on the same shape-grouped stacks the update
  builds) and the roofline replays exactly the batched matmuls (``dot_general``) of that
  NS program on the same shapes, with the elementwise work removed (each result is summed
  into a scalar so none is dead code; semi-orthogonal inputs keep the values bounded);
- NS GFLOP: the matmul FLOPs each row's orthogonalisation performs (counted from its
  program's ``dot_general``s; optax: the direct form, ``steps (4 k^2 l + 2 k^3)`` per
  ``k x l`` matrix, ``k <= l``): at equal GFLOP/s the time ratio would equal the FLOP
  ratio; GFLOP/s = those FLOPs over the update time; a large square fp32 matmul gives
  the machine's practical peak beside them.

Usage:
  amemory bench optim [--quick] [--trees cpu,gpt2-small] [--reps N]
                      [--gpt2-layers N] [--matmul-n N] [--json PATH]
  amemory bench optim --devices N ...   (FSDP-sharded Muon: experiments/bench/optim_distributed.py)
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.extend import core as jex_core
from optax.contrib import muon as optax_muon

from amemory import atomic
from amemory.optim import contrib, muon, newton_schulz, orthogonality_error, shape_scale_factor
from amemory.optim._matrices import leaf_layouts
from experiments.bench import host_load

TREES = {
    # name: (d_model, n_layers, d_ff)
    "cpu": (256, 4, 1024),
    "gpt2-small": (768, 12, 3072),
}
LR = 0.02
NS_STEPS = 5

#: Rows: name -> (factory of the transform, options of amemory's muon or None).
ROWS: dict[str, tuple[Callable[[], optax.GradientTransformation], dict | None]] = {}


def _row(name: str, **options: Any) -> None:
    ROWS[name] = (lambda: muon(LR, preset="optax", **options), options)


ROWS["optax"] = (lambda: optax_muon(LR), None)
ROWS["contrib"] = (lambda: contrib.muon(LR), None)
_row("amemory")
_row("restart", gram_restarts=(2,))
_row("direct", ns_method="direct")
_row("aol5", preconditioning="aol")
_row("aol4", preconditioning="aol", ns_steps=4)
_row("pe5", ns_coeffs="polar_express")
_row("dion4-aol", ns_coeffs="dion", ns_steps=4, preconditioning="aol")
#: Rows whose NS program gets a roofline (NS efficiency).
ROOFLINE_ROWS = ("amemory", "dion4-aol")


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
    """FLOPs of amemory's NS on one fp32 matrix (matmuls only, 2 per multiply-add), counted
    from its program: ``"direct"`` is ``steps (4 k^2 l + 2 k^3)`` for ``k x l``, ``k <= l``
    (optax's, too); ``"gram"`` the Gram form (no restart in float32)."""
    x = jax.ShapeDtypeStruct(tuple(shape), jnp.float32)
    return _dot_flops(jax.make_jaxpr(lambda m: newton_schulz(m, steps=steps, method=method))(x))


def _groups(params: dict) -> dict[tuple[int, int], int]:
    """``(k, l) -> count`` of the wide shape groups amemory's update orthogonalises."""
    _, _, layouts = leaf_layouts(params, None)
    groups: dict[tuple[int, int], int] = {}
    for lay in layouts:
        key = tuple(sorted((lay.fan_in, lay.fan_out)))
        groups[key] = groups.get(key, 0) + lay.batch
    return groups


def _semi_orthogonal(b: int, k: int, l: int, seed: int) -> jax.Array:
    """``[b, k, l]`` stack with orthonormal rows (keeps every replayed product bounded)."""
    g = jax.random.normal(jax.random.key(seed), (b, l, k), jnp.float32)
    q, _ = jnp.linalg.qr(g)  # [b, l, k]
    return jnp.swapaxes(q, 1, 2)


# --------------------------------------------------------------------------- roofline

_LAYOUT_OPS = ("transpose", "reshape", "broadcast_in_dim", "squeeze", "iota", "slice")


def _replay(jaxpr: Any, consts: list, args: list, sink: list, order: dict) -> list:
    """Evaluate ``jaxpr`` keeping only its matmuls.

    ``dot_general`` runs (its result also summed into ``sink``, so none is dead code);
    layout ops run; every other op forwards one of its operands that has the output's
    shape and dtype, the one derived from the latest matmul (``order``: id of a value ->
    index of the matmul it derives from), so the matmuls keep their data dependencies
    (no two of them see the same inputs, nothing is merged) while the elementwise work
    is removed; an op with no such operand runs (norms, constants: dead once forwarded).
    """
    env: dict = {}

    def read(v):
        return v.val if isinstance(v, jex_core.Literal) else env[v]

    env.update(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        rank = max([order.get(id(x), -1) for x in ins] + [-1])
        if name in ("jit", "pjit", "closed_call"):
            inner = eqn.params.get("jaxpr") or eqn.params["call_jaxpr"]
            outs = _replay(inner.jaxpr, inner.consts, ins, sink, order)
        elif name == "dot_general" or name in _LAYOUT_OPS:
            outs = [eqn.primitive.bind(*ins, **eqn.params)]
            if name == "dot_general":
                sink.append(jnp.sum(outs[0]))
                rank = len(sink)
            order[id(outs[0])] = rank
        else:
            aval = eqn.outvars[0].aval
            same = [
                x
                for x in ins
                if len(eqn.outvars) == 1 and np.shape(x) == aval.shape and x.dtype == aval.dtype
            ]
            if same:
                outs = [max(same, key=lambda x: order.get(id(x), -1))]
            else:
                outs = eqn.primitive.bind(*ins, **eqn.params)
                outs = outs if eqn.primitive.multiple_results else [outs]
        env.update(zip(eqn.outvars, outs, strict=True))
    return [read(v) for v in jaxpr.outvars]


def roofline_fn(orth_fn: Callable, stacks: list[jax.Array]) -> tuple[Callable, int]:
    """A jittable ``(*stacks) -> scalar`` running exactly the matmuls of ``orth_fn`` on them.

    Returns ``(fn, number of dot_general calls it makes)``.
    """
    closed = [jax.make_jaxpr(orth_fn)(s) for s in stacks]

    def fn(*xs):
        sink: list = []
        for c, x in zip(closed, xs, strict=True):
            out = _replay(c.jaxpr, c.consts, [x], sink, {})
            sink.append(jnp.sum(out[0]))
        return sum(sink)

    n_dots = sum(e.primitive.name == "dot_general" for e in jax.make_jaxpr(fn)(*stacks).eqns)
    return fn, n_dots


def _dot_flops(closed: Any) -> float:
    """FLOPs of every ``dot_general`` in a closed jaxpr (2 per multiply-add), recursively."""
    total = 0.0
    for eqn in closed.jaxpr.eqns:
        inner = eqn.params.get("jaxpr")
        if inner is not None and hasattr(inner, "jaxpr"):
            total += _dot_flops(inner)
        elif eqn.primitive.name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            k = float(np.prod([lhs[i] for i in contract]))
            total += 2.0 * float(np.prod(eqn.outvars[0].aval.shape)) * k
    return total


def _orth_fn(options: dict) -> Callable:
    from amemory.optim._muon_core import options_from
    from amemory.optim.presets import preset_options

    return options_from(options, preset_options("optax")).orth_fn


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
    """Time every row, the NS programs and their rooflines, interleaved; one tree's figures."""
    rng = np.random.default_rng(1)
    grads = jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), x.dtype), params)
    timers: dict[str, tuple[Callable, tuple]] = {}
    compile_s, errs = {}, {}
    for row, (factory, _) in ROWS.items():
        tx = factory()
        state = tx.init(params)
        fn = jax.jit(tx.update)
        t0 = time.perf_counter()
        u, _ = fn(grads, state, params)
        jax.block_until_ready(u)
        compile_s[row] = time.perf_counter() - t0
        errs[row] = _ortho_errors(u, LR)
        timers[row] = (fn, (grads, state, params))
    groups = _groups(params)
    stacks = [_semi_orthogonal(b, k, l, i) for i, ((k, l), b) in enumerate(sorted(groups.items()))]
    shapes = [tuple(x.shape) for x in jax.tree.leaves(params)]
    nominal = sum(ns_flops(s) for s in shapes)
    flops = {"optax": nominal}  # optax: direct NS, one matrix at a time
    for row, (_, opts) in ROWS.items():
        if row != "optax":  # contrib runs amemory's kernels with optax's options
            orth = _orth_fn(opts or {})
            flops[row] = _dot_flops(jax.make_jaxpr(lambda *xs, o=orth: [o(x) for x in xs])(*stacks))
    n_dots = {}
    for row in ROOFLINE_ROWS:
        orth = _orth_fn(ROWS[row][1])
        ns = jax.jit(lambda *xs, orth=orth: [orth(x) for x in xs])
        roof, n_dots[row] = roofline_fn(orth, stacks)
        roof = jax.jit(roof)
        for key, fn in ((f"ns:{row}", ns), (f"roofline:{row}", roof)):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*stacks))
            compile_s[key] = time.perf_counter() - t0
            timers[key] = (fn, tuple(stacks))
    a = jnp.asarray(np.random.default_rng(2).standard_normal((mm_n, mm_n)), jnp.float32)
    matmul = jax.jit(lambda x: x @ x)
    jax.block_until_ready(matmul(a))
    timers["matmul"] = (matmul, (a,))
    times: dict[str, list[float]] = {k: [] for k in timers}
    for _ in range(reps):
        for key, (fn, args) in timers.items():
            times[key].append(_timed(fn, *args))
    med = {k: float(np.median(v)) for k, v in times.items()}
    fastest = {k: float(np.min(v)) for k, v in times.items()}
    ref_mean, ref_max = errs["optax"].mean(), errs["optax"].max()
    eligible = [
        r
        for r, (_, opts) in ROWS.items()
        if opts is not None and errs[r].mean() <= ref_mean and errs[r].max() <= ref_max
    ]
    best = min(eligible, key=lambda r: med[r]) if eligible else None
    return {
        "tree": name,
        "n_matrices": len(shapes),
        "n_params": int(sum(np.prod(s) for s in shapes)),
        "groups": {f"{k}x{l}": b for (k, l), b in sorted(groups.items())},
        "reps": reps,
        "time_ms": {k: 1e3 * v for k, v in med.items()},
        "time_ms_all": {k: [1e3 * t for t in v] for k, v in times.items()},
        "compile_s": compile_s,
        "ratio": med["amemory"] / med["optax"],
        "ratio_contrib": med["contrib"] / med["optax"],
        "best": best,
        "ratio_best": med[best] / med["optax"] if best else None,
        # the same from each row's fastest run (the least disturbed on a shared machine)
        "ratio_of_minima": {r: fastest[r] / fastest["optax"] for r in ROWS},
        "ns_efficiency": {r: med[f"roofline:{r}"] / med[f"ns:{r}"] for r in ROOFLINE_ROWS},
        "roofline_dots": n_dots,
        "ortho_error_mean": {k: float(v.mean()) for k, v in errs.items()},
        "ortho_error_max": {k: float(v.max()) for k, v in errs.items()},
        "nominal_ns_gflop": nominal / 1e9,
        "gflops_effective": {r: nominal / med[r] / 1e9 for r in ROWS},
        "ns_gflop": {r: f / 1e9 for r, f in flops.items()},
        "gflops_actual": {r: flops[r] / med[r] / 1e9 for r in ROWS},
        "matmul_n": mm_n,
        "matmul_gflops": 2.0 * mm_n**3 / med["matmul"] / 1e9,
    }


def _print_row(r: dict[str, Any]) -> None:
    t, e, g, f = r["time_ms"], r["ortho_error_mean"], r["gflops_actual"], r["ns_gflop"]
    print(
        f"\n[{r['tree']}] {r['n_matrices']} matrices, {r['n_params'] / 1e6:.2f}M params, "
        f"groups {r['groups']}, NS {r['nominal_ns_gflop']:.1f} GFLOP nominal, "
        f"median of {r['reps']}"
    )
    print(
        f"  {'':10s} {'time ms':>10s} {'/optax':>7s} {'NS GFLOP':>9s} {'/optax':>7s} "
        f"{'GFLOP/s':>8s} {'ortho err mean/max':>20s}"
    )
    for k in ROWS:
        print(
            f"  {k:10s} {t[k]:10.1f} {t[k] / t['optax']:7.3f} {f[k]:9.2f} "
            f"{f[k] / f['optax']:7.3f} {g[k]:8.1f} {e[k]:9.4f}/{r['ortho_error_max'][k]:.4f}"
        )
    for row in ROOFLINE_ROWS:
        print(
            f"  NS {row}: {t[f'ns:{row}']:.1f} ms, roofline ({r['roofline_dots'][row]} matmuls) "
            f"{t[f'roofline:{row}']:.1f} ms, efficiency {r['ns_efficiency'][row]:.3f}"
        )
    best = r["best"]
    best_txt = f"{best} {r['ratio_best']:.3f}" if best else "none at or below optax's error"
    m = r["ratio_of_minima"]
    print(
        f"  ratio amemory/optax {r['ratio']:.3f}; contrib/optax {r['ratio_contrib']:.3f}; "
        f"best at <= optax's error: {best_txt}; matmul {r['matmul_n']}^3 "
        f"{r['matmul_gflops']:.1f} GFLOP/s"
    )
    best_min = f", {best} {m[best]:.3f}" if best else ""
    print(
        f"  from the fastest runs: amemory {m['amemory']:.3f}, contrib {m['contrib']:.3f}{best_min}"
    )


def main(argv: list[str]) -> int:
    """Run the benchmark; ``argv`` excludes the program name. Returns an exit code."""
    if any(a == "--devices" or a.startswith("--devices=") for a in argv):
        from experiments.bench import optim_distributed

        return optim_distributed.main(argv)
    parser = _Parser(prog="amemory bench optim", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="cpu tree only, 3 reps")
    parser.add_argument(
        "--trees", default=None, help=f"comma list from {sorted(TREES)} (default: all)"
    )
    parser.add_argument(
        "--reps", type=int, default=None, help="timed repetitions (gpt2-small: at most 3)"
    )
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
        tree_reps = reps if name == "cpu" else max(1, min(reps, 3))
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
            "machine": platform.machine(),
            **host_load(),
            "results": results,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_json(args.json, payload)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
