"""`amemory bench optim`: amemory's Muon update against optax.contrib.muon, and its NS roofline.

Every row of :data:`ROWS` updates the same GPT-shaped tree of hidden matrices (all routed to
Muon): ``optax`` is ``optax.contrib.muon(0.02)``, ``contrib`` the drop-in
``amemory.optim.contrib.muon``, the others ``amemory.optim.muon(0.02, preset="optax")``
with the options beside their names. Jitted updates run round-robin; medians are reported.

Per tree: ``ortho_error``, the ``orthogonality_error`` of each row's update over
``-lr * shape_scale`` (mean and max over leaves); ``ratio``, a row's time over optax's, and
``best``, the fastest amemory row whose errors are at most optax's (goal <= 0.35); NS
efficiency (goal >= 0.85), the time of a roofline (:func:`roofline_fn`: exactly the NS
program's batched matmuls on the update's shape-grouped stacks) over the NS time; NS GFLOP
counted from each program's ``dot_general``s (optax: ``planner.ns_flops``, direct form) and
GFLOP/s beside a large fp32 matmul's. ``--devices N``: ``experiments/bench/optim_distributed.py``.
"""

from __future__ import annotations

import collections
import os
import pathlib
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

from amemory.cli import Parser
from amemory.optim import contrib, muon, orthogonality_error, shape_scale_factor
from amemory.optim._matrices import leaf_layouts
from amemory.train.planner import ns_flops
from experiments.bench import host_load, random_like, write_json

TREES = {"cpu": (256, 4, 1024), "gpt2-small": (768, 12, 3072)}  # (d_model, n_layers, d_ff)
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


def tree_parser(prog: str, description: str, trees: dict, gpt2_layers: int) -> Parser:
    """A parser with the arguments of both optimizer benchmarks (trees, repetitions, JSON)."""
    p = Parser(prog=prog, description=description)
    p.add_argument("--quick", action="store_true", help="cpu tree only, 3 reps")
    p.add_argument("--trees", default=None, help=f"comma list from {sorted(trees)} (default: all)")
    p.add_argument("--reps", type=int, default=None, help="timed repetitions (gpt2-small: <= 3)")
    p.add_argument("--gpt2-layers", type=int, default=gpt2_layers, help="gpt2-small's layers")
    p.add_argument("--json", type=pathlib.Path, default=None, help="write figures here")
    return p


def parse_trees(parser: Parser, argv: list[str], trees: dict) -> tuple[Any, list[str], int]:
    """``(args, tree names, repetitions)``; a bad tree or count is a one-line error."""
    args = parser.parse_args(argv)
    names = args.trees.split(",") if args.trees else (["cpu"] if args.quick else list(trees))
    bad = [t for t in names if t not in trees]
    if bad:
        parser.error(f"unknown tree(s) {bad}; choose from {sorted(trees)}")
    reps = args.reps if args.reps is not None else (3 if args.quick else 5)
    if reps < 1 or args.gpt2_layers < 1:
        parser.error("--reps and --gpt2-layers must be >= 1")
    return args, names, reps


def each_tree(names: list[str], trees: dict, gpt2_layers: int):
    """``(name, gpt_tree, shape dict)`` per name; gpt2-small with ``gpt2_layers`` layers."""
    for name in names:
        d, layers, d_ff = trees[name]
        layers = gpt2_layers if name == "gpt2-small" else layers
        yield name, gpt_tree(d, layers, d_ff), {"d_model": d, "n_layers": layers, "d_ff": d_ff}


def _groups(params: dict) -> dict[tuple[int, int], int]:
    """``(k, l) -> count`` of the wide shape groups amemory's update orthogonalises."""
    groups: collections.Counter = collections.Counter()
    for lay in leaf_layouts(params, None)[2]:
        groups[tuple(sorted((lay.fan_in, lay.fan_out)))] += lay.batch
    return dict(groups)


def _semi_orthogonal(b: int, k: int, l: int, seed: int) -> jax.Array:
    """``[b, k, l]`` stack with orthonormal rows (keeps every replayed product bounded)."""
    g = jax.random.normal(jax.random.key(seed), (b, l, k), jnp.float32)
    q, _ = jnp.linalg.qr(g)  # [b, l, k]
    return jnp.swapaxes(q, 1, 2)


_LAYOUT_OPS = ("transpose", "reshape", "broadcast_in_dim", "squeeze", "iota", "slice")


def _replay(jaxpr: Any, consts: list, args: list, sink: list, order: dict) -> list:
    """Evaluate ``jaxpr`` keeping only its matmuls.

    ``dot_general`` (its result also summed into ``sink``, so none is dead code) and layout
    ops run; every other op forwards the operand of the output's shape and dtype derived
    from the latest matmul (``order``: id of a value -> index of that matmul), so the
    matmuls keep their data dependencies while the elementwise work is removed; an op with
    no such operand runs (norms, constants: dead once forwarded).
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
            aval, single = eqn.outvars[0].aval, len(eqn.outvars) == 1
            same = [
                x for x in ins if single and np.shape(x) == aval.shape and x.dtype == aval.dtype
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


def round_robin(timers: dict[str, tuple[Callable, tuple]], reps: int) -> dict[str, list[float]]:
    """Seconds of ``reps`` calls of each ``fn(*args)``, interleaved (load hits all alike)."""
    times: dict[str, list[float]] = {k: [] for k in timers}
    for _ in range(reps):
        for key, (fn, args) in timers.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[key].append(time.perf_counter() - t0)
    return times


def timing(times: dict[str, list[float]], compile_s: dict[str, float], reps: int) -> dict:
    """The timing fields of a benchmark row: medians and every run in ms, compile seconds."""
    return {"reps": reps, "time_ms": {k: 1e3 * float(np.median(v)) for k, v in times.items()},
            "time_ms_all": {k: [1e3 * t for t in v] for k, v in times.items()},
            "compile_s": compile_s}  # fmt: skip


def _ortho_errors(updates: dict, lr: float) -> np.ndarray:
    scaled = [-u / (lr * shape_scale_factor("jordan", *u.shape)) for u in jax.tree.leaves(updates)]
    return np.asarray([float(orthogonality_error(o)) for o in scaled])


def bench_tree(name: str, params: dict, reps: int, mm_n: int) -> dict[str, Any]:
    """Time every row, the NS programs and their rooflines, interleaved; one tree's figures."""
    grads = random_like(params, seed=1)
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
    nominal = sum(ns_flops(s, NS_STEPS, "direct") for s in shapes)
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
    times = round_robin(timers, reps)
    med = {k: float(np.median(v)) for k, v in times.items()}
    fastest = {k: float(np.min(v)) for k, v in times.items()}
    ref_mean, ref_max = errs["optax"].mean(), errs["optax"].max()
    fits = lambda r: errs[r].mean() <= ref_mean and errs[r].max() <= ref_max
    eligible = [r for r, (_, opts) in ROWS.items() if opts is not None and fits(r)]
    best = min(eligible, key=lambda r: med[r]) if eligible else None
    return {
        "tree": name,
        "n_matrices": len(shapes),
        "n_params": int(sum(np.prod(s) for s in shapes)),
        "groups": {f"{k}x{l}": b for (k, l), b in sorted(groups.items())},
        **timing(times, compile_s, reps),
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
    parser = tree_parser("amemory bench optim", __doc__.split("\n")[0], TREES, 12)
    parser.add_argument("--matmul-n", type=int, default=None, help="size of the peak matmul")
    args, trees, reps = parse_trees(parser, argv, TREES)
    mm_n = args.matmul_n or (1024 if args.quick else 2048)
    dev = jax.devices()[0]
    print(
        f"amemory bench optim: jax {jax.__version__}, optax {optax.__version__}, "
        f"{dev.platform} ({dev.device_kind}), {os.cpu_count()} host cores"
    )
    results = []
    for name, params, shape in each_tree(trees, TREES, args.gpt2_layers):
        r = bench_tree(name, params, reps if name == "cpu" else max(1, min(reps, 3)), mm_n)
        r["shape"] = shape
        _print_row(r)
        results.append(r)
    if args.json:
        write_json(args.json, "amemory bench optim " + " ".join(argv), host_load(), results=results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
