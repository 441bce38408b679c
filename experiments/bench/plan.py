"""`amemory bench plan`: `amemory plan` over the table of experiments/bench/RESULTS.md.

    amemory bench plan --out experiments/bench/results_plan_tpu.json [--only small]
    amemory bench plan --ns v5e:2x2   # the optimizer update alone: amemory's NS vs optax's

Each case is a config of `experiments/configs/lm.py:full` (Shakespeare, 8192-token BPE;
gpt2-small and nanogpt-160m at their own 50,257 / 50,304-token vocabularies) with
overrides, compiled for one TPU topology by `amemory.train.planner.plan`; the results
(compiler figures, roofline estimates, and the host's load while compiling) are appended
to the JSON file as they finish, so an interrupted sweep keeps what it measured.
"""

from __future__ import annotations

import json
import os
import pathlib

from amemory import atomic
from amemory.cli import Parser
from experiments.bench import host_load

SMALL = {"model.preset": "small", "model.dtype": "bfloat16", "data.batch_size": 32,
         "parallel.mode": "sharded", "parallel.fsdp": 4}  # fmt: skip
GPT2 = {"model.preset": "gpt2-small", "model.vocab_size": 50257, "model.dtype": "bfloat16",
        "model.scan_layers": True, "data.seq_len": 1024, "data.batch_size": 64,
        "parallel.mode": "sharded", "parallel.fsdp": 8}  # fmt: skip
# (name, topology, overrides), in the order the sweep runs them
CASES = [
    ("gpt2-small/muon/scanned", "v5p:2x2x2", {**GPT2, "optimizer.name": "muon"}),
] + [
    (f"small/{opt}/scanned", "v5e:2x2", {**SMALL, "optimizer.name": opt, "model.scan_layers": True})
    for opt in ("adam", "muon", "normuon")
] + [
    ("small/muon/per-layer", "v5e:2x2", {**SMALL, "optimizer.name": "muon"}),
    ("gpt2-small/adam/scanned", "v5p:2x2x2", {**GPT2, "optimizer.name": "adam"}),
    ("small-mla-moe/muon/scanned", "v5e:2x2",
     {**SMALL, "optimizer.name": "muon", "model.scan_layers": True, "model.attention": "mla",
      "model.moe.experts": 8, "model.moe.top_k": 2, "model.moe.shared": 1,
      "model.moe.capacity_factor": 1.0}),
    ("nanogpt-160m/normuon/scanned", "v5e:4x4",
     {**GPT2, "model.preset": "nanogpt-160m", "model.vocab_size": 50304,
      "optimizer.name": "normuon", "data.batch_size": 64, "parallel.fsdp": 16}),
    ("gpt2-small/muon/per-layer", "v5p:2x2x2",
     {**GPT2, "optimizer.name": "muon", "model.scan_layers": False}),
]  # fmt: skip


def ns_view(topology: str, tree: str = "gpt2-small") -> list[dict]:
    """The TPU compiler's view of one Muon update (the rows of ``amemory bench optim``) on
    one chip of ``topology``: FLOPs from the HLO (``planner.hlo_stats``), the dtype of its
    dots, and a roofline estimate (compute at peak bf16, every buffer once through HBM)."""
    import jax
    import numpy as np
    from jax.experimental import topologies

    from amemory.train import planner
    from experiments.bench.optim import ROWS, TREES, gpt_tree

    chip = planner.CHIPS[topology.split(":")[0]]
    device = topologies.get_topology_desc(topology_name=topology, platform="tpu").devices[0]
    mesh = jax.sharding.Mesh(np.array([device]), ("x",))
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    params = jax.eval_shape(lambda: gpt_tree(*TREES[tree]))
    sds = lambda t: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), t)  # noqa: E731
    rows = []
    with planner.uncached():
        for name in ("optax", "amemory", "dion4-aol"):
            tx = ROWS[name][0]()
            with jax.sharding.set_mesh(mesh):
                state = jax.eval_shape(tx.init, params)
                c = jax.jit(tx.update).lower(sds(params), sds(state), sds(params)).compile()
            st, m = planner.hlo_stats(c.as_text(), "jit(update_fn)"), c.memory_analysis()
            traffic = m.argument_size_in_bytes + m.output_size_in_bytes + 2 * m.temp_size_in_bytes
            est = max(st["flops"] / chip["peak"], traffic / chip["hbm_bw"])
            rows.append({"row": name, "tree": tree, "topology": topology, "flops": st["flops"],
                         "dot_dtypes": st["scope_dot_dtypes"], "hbm_bytes": traffic,
                         "estimate_s": est})  # fmt: skip
            print(f"{name:10s} {st['flops'] / 1e9:8.2f} GFLOP {st['scope_dot_dtypes']} "
                  f"~{est * 1e3:.3f} ms (estimate)", flush=True)  # fmt: skip
    return rows


def main(argv: list[str]) -> int:
    from amemory.train import planner
    from amemory.train.config import load_config

    parser = Parser(prog="amemory bench plan", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/bench/results_plan_tpu.json")
    parser.add_argument("--only", default="", help="run the cases whose name has this prefix")
    parser.add_argument("--ns", metavar="TOPOLOGY", help="only the Muon update: ours vs optax")
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out)
    if args.ns:
        atomic.write_json(out, {**host_load(), "rows": ns_view(args.ns)})
        return 0
    done = json.loads(out.read_text()) if out.exists() else []
    for name, topo, kw in CASES:
        if not name.startswith(args.only) or any(r["case"] == name for r in done):
            continue
        config = load_config("experiments/configs/lm.py:full", [f"{k}={v}" for k, v in kw.items()])
        load0 = host_load()
        try:
            report = planner.plan(config, topo)
        except ValueError as e:  # a case the config or data cannot serve: recorded, skipped
            report = {"topology": topo, "error": str(e)}
        report |= {"case": name, "overrides": kw, **load0, "load_end": os.getloadavg()[0]}
        done.append(report)
        atomic.write_json(out, done)
        print(planner.format_table([report]).splitlines()[-1], f"| {name}", flush=True)
    return 0
