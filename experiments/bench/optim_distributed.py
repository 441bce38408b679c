"""`amemory bench optim --devices N`: Muon on FSDP-sharded parameters, owner vs GSPMD vs optax.

On an ``N``-device mesh ``("fsdp",)`` (fake CPU devices on a CPU host), every leaf of
``experiments.bench.optim.gpt_tree``, its gradient and its optimizer state are split along
the largest axis divisible by ``N`` (``parallel.fsdp_spec``). Three jitted updates keep that
sharding: ``amemory-owner`` (``muon(lr, preset="optax", ns_mesh=(mesh, "fsdp"))``, the owner
layout of ``amemory.optim.distributed``: all-to-all in, Newton-Schulz on whole matrices,
all-to-all out), ``amemory-gspmd`` (``distributed="gspmd"``: XLA places Newton-Schulz on
the split matrices) and ``optax`` (``optax.contrib.muon(lr)``), timed interleaved beside
both unsharded on one device (``*-1dev``). Bytes moved are read from the compiled HLO
(``planner.hlo_stats``' ring model, summed over devices), beside one ring all-reduce of the
gradient (``2 (n-1) P`` for ``P`` parameter bytes) and the owner layout's model, checked on
sub-meshes of 2, 4 and 8 devices. Fake CPU devices share the host's cores: a time is the
work of all devices, not the critical path of one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from optax.contrib import muon as optax_muon

from amemory.cli import Parser
from amemory.optim import muon
from amemory.optim._matrices import leaf_layouts
from amemory.optim.distributed import OwnerLayout
from amemory.train.parallel import fsdp_spec
from amemory.train.planner import hlo_stats
from experiments.bench import host_load, optim, random_like, write_json

LR = 0.02
TREES = {"cpu": (256, 4, 1024), "gpt2-small": (768, 4, 3072)}  # (d_model, layers, d_ff)


def hlo_bytes(text: str, n: int) -> dict[str, Any]:
    """Collectives of a compiled HLO module: ops per kind, and bytes sent summed over the
    ``n`` devices (``amemory.train.planner.hlo_stats``'s ring model)."""
    st = hlo_stats(text, "-", n)
    return {"ops": st["collective_ops"], "bytes": n * sum(st["collectives"].values())}


def _candidates(mesh) -> dict[str, optax.GradientTransformation]:
    ns = (mesh, "fsdp")
    return {
        "amemory-owner": muon(LR, preset="optax", ns_mesh=ns, distributed="owner"),
        "amemory-gspmd": muon(LR, preset="optax", ns_mesh=ns, distributed="gspmd"),
        "optax": optax_muon(LR),
    }


def _compile(mesh, tx, params, grads):
    s = mesh.shape["fsdp"]
    shard = lambda t: jax.tree.map(lambda x: NamedSharding(mesh, fsdp_spec(np.shape(x), s)), t)  # noqa: E731
    state = jax.eval_shape(tx.init, params)
    st_sh, p_sh = shard(state), shard(params)
    state = jax.jit(tx.init, out_shardings=st_sh)(params)
    p, g = jax.device_put(params, p_sh), jax.device_put(grads, p_sh)
    fn = jax.jit(tx.update, out_shardings=(p_sh, st_sh)).lower(g, state, p).compile()
    return fn, (g, state, p)


def _model_bytes(mesh, params) -> float:
    layout = OwnerLayout(mesh, ("fsdp",))
    _, _, lays = leaf_layouts(params, None)
    groups = layout.plan(lays, batch_leaves=True, by_orientation=False)
    return sum(layout.bytes_moved(g) for g in groups)


def bench_tree(name: str, params: dict, n: int, reps: int) -> dict[str, Any]:
    """Time (a), (b), (c) on the n-device mesh (interleaved) and measure their bytes."""
    grads = random_like(params, seed=1)
    mesh = jax.make_mesh((n,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))
    fns, args, outs, hlo, compile_s = {}, {}, {}, {}, {}
    for key, tx in _candidates(mesh).items():
        t0 = time.perf_counter()
        fns[key], args[key] = _compile(mesh, tx, params, grads)
        outs[key] = jax.tree.map(np.asarray, fns[key](*args[key])[0])
        compile_s[key] = time.perf_counter() - t0
        hlo[key] = hlo_bytes(fns[key].as_text(), n)
    ref = jax.tree.leaves(outs["optax"])
    diff = {
        k: max(
            float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(outs[k]), ref, strict=True)
        )
        for k in ("amemory-owner", "amemory-gspmd")
    }
    # context: the same updates unsharded on one device (not part of the ratios)
    one = {"amemory-1dev": muon(LR, preset="optax"), "optax-1dev": optax_muon(LR)}
    for key, tx in one.items():
        state = tx.init(params)
        fns[key], args[key] = jax.jit(tx.update), (grads, state, params)
        jax.block_until_ready(fns[key](*args[key]))
    times = optim.round_robin({k: (fn, args[k]) for k, fn in fns.items()}, reps)
    med = {k: float(np.median(v)) for k, v in times.items()}
    p_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    return {
        "tree": name,
        "devices": n,
        "n_matrices": len(jax.tree.leaves(params)),
        "param_bytes": p_bytes,
        "grad_allreduce_bytes": 2 * (n - 1) * p_bytes,
        **optim.timing(times, compile_s, reps),
        "ratio_vs_optax": med["amemory-owner"] / med["optax"],
        "ratio_gspmd_vs_optax": med["amemory-gspmd"] / med["optax"],
        "ratio_owner_vs_gspmd": med["amemory-owner"] / med["amemory-gspmd"],
        "max_abs_diff_vs_optax": diff,
        "collectives": {k: v["ops"] for k, v in hlo.items()},
        "bytes_per_update": {k: v["bytes"] for k, v in hlo.items()},
        "bytes_over_param_bytes": {k: v["bytes"] / p_bytes for k, v in hlo.items()},
        "owner_model_bytes": _model_bytes(mesh, params),
    }


def scaling(params: dict, counts: list[int]) -> list[dict[str, Any]]:
    """Bytes per update of (a), (b), (c) and the owner model on sub-meshes of ``counts`` devices."""
    rows = []
    grads = jax.tree.map(jnp.zeros_like, params)
    p_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    for n in counts:
        devs = np.asarray(jax.devices()[:n])
        mesh = jax.sharding.Mesh(devs, ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))
        row: dict[str, Any] = {"devices": n, "param_bytes": p_bytes,
                               "owner_model_bytes": _model_bytes(mesh, params)}  # fmt: skip
        for key, tx in _candidates(mesh).items():
            fn, _ = _compile(mesh, tx, params, grads)
            row[key] = hlo_bytes(fn.as_text(), n)["bytes"]
        rows.append(row)
    return rows


def _print_row(r: dict[str, Any]) -> None:
    t, b = r["time_ms"], r["bytes_per_update"]
    print(
        f"\n[{r['tree']}] {r['n_matrices']} matrices, {r['param_bytes'] / 1e6:.1f} MB params, "
        f"FSDP over {r['devices']} devices, median of {r['reps']}"
    )
    print(f"  {'':14s} {'time ms':>10s} {'MB moved':>10s} {'x params':>9s}  collectives")
    for k in t:
        if k not in b:  # one-device context rows
            print(f"  {k:14s} {t[k]:10.1f} {'-':>10s} {'-':>9s}  (unsharded, one device)")
            continue
        ops = {o: c for o, c in r["collectives"][k].items() if c}
        print(f"  {k:14s} {t[k]:10.1f} {b[k] / 1e6:10.2f} {b[k] / r['param_bytes']:9.2f}  {ops}")
    print(
        f"  ratio owner/optax = {r['ratio_vs_optax']:.3f}, gspmd/optax = "
        f"{r['ratio_gspmd_vs_optax']:.3f}, owner/gspmd = {r['ratio_owner_vs_gspmd']:.3f}; "
        f"owner model {r['owner_model_bytes'] / 1e6:.2f} MB; one gradient all-reduce "
        f"{r['grad_allreduce_bytes'] / 1e6:.2f} MB; max |update - optax| "
        + ", ".join(f"{k} {v:.1e}" for k, v in r["max_abs_diff_vs_optax"].items())
    )


def _ensure_devices(n: int, argv: list[str], parser: Parser) -> int | None:
    """Make ``n`` CPU devices visible; re-run in a fresh process if JAX already started."""
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:
        pass  # backend already initialised
    if jax.device_count() >= n:
        return None
    if jax.default_backend() != "cpu" or os.environ.get("AMEMORY_BENCH_CHILD"):
        parser.error(f"--devices {n}: only {jax.device_count()} {jax.default_backend()} devices")
    env = dict(os.environ, AMEMORY_BENCH_CHILD="1")
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}"
    ).strip()
    cmd = [sys.executable, "-m", "experiments.bench.optim_distributed", *argv]
    return subprocess.call(cmd, env=env)


def main(argv: list[str]) -> int:
    """Run the distributed benchmark; ``argv`` excludes the program name."""
    parser = optim.tree_parser("amemory bench optim", __doc__.split("\n")[0], TREES, 4)
    parser.add_argument("--devices", type=int, required=True, help="mesh size (fake CPU devices)")
    args, trees, reps = optim.parse_trees(parser, argv, TREES)
    if args.devices < 2:
        parser.error(f"--devices must be >= 2, got {args.devices}")
    code = _ensure_devices(args.devices, argv, parser)
    if code is not None:
        return code
    n = args.devices
    load = host_load()
    print(
        f"amemory bench optim --devices {n}: jax {jax.__version__}, optax {optax.__version__}, "
        f"{jax.devices()[0].platform}, {os.cpu_count()} host cores, "
        f"load {load['load_average'][0]:.1f}"
    )
    results = []
    for name, params, shape in optim.each_tree(trees, TREES, args.gpt2_layers):
        r = bench_tree(name, params, n, reps)
        r["shape"] = shape
        _print_row(r)
        results.append(r)
    counts = [c for c in (2, 4, 8) if c <= n]
    d, layers, d_ff = TREES[trees[0]]
    scale = scaling(optim.gpt_tree(d, layers, d_ff), counts)
    print(f"\nbytes per update vs devices ({trees[0]} tree, MB summed over devices):")
    print(
        f"  {'devices':>7s} {'owner':>8s} {'model':>8s} {'gspmd':>8s} {'optax':>8s} {'params':>8s}"
    )
    for row in scale:
        print(
            f"  {row['devices']:7d} {row['amemory-owner'] / 1e6:8.2f} "
            f"{row['owner_model_bytes'] / 1e6:8.2f} {row['amemory-gspmd'] / 1e6:8.2f} "
            f"{row['optax'] / 1e6:8.2f} {row['param_bytes'] / 1e6:8.2f}"
        )
    if args.json:
        # ratio_vs_optax per tree: amemory's owner layout over optax.contrib.muon, both sharded
        ratios = {r["tree"]: r["ratio_vs_optax"] for r in results}
        distributed = {"ratio_vs_optax": ratios, "results": results, "scaling": scale}
        write_json(
            args.json, "amemory bench optim " + " ".join(argv), load, distributed=distributed
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
