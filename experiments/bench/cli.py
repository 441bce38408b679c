"""`amemory bench NAME`: dispatch to the benchmark module `experiments.bench.NAME`."""

from __future__ import annotations

import importlib

from amemory.cli import Parser

BENCHMARKS = {
    "optim": "Muon update time vs optax.contrib.muon, orthogonality error, GFLOP/s",
    "train": "train-step time and tokens/s: Muon/Adam and SignGD/Adam ratios",
    "plan": "the train step compiled for TPU topologies (amemory plan over a table)",
}


def main(argv: list[str]) -> int:
    parser = Parser(prog="amemory bench", description=__doc__)
    parser.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark")
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        for k, v in BENCHMARKS.items():
            print(f"  {k:8s} {v}")
        return 0
    if argv[0] not in BENCHMARKS:
        return parser.fail(f"unknown benchmark {argv[0]!r}; choose from {sorted(BENCHMARKS)}")
    module = importlib.import_module(f"experiments.bench.{argv[0]}")
    return int(module.main(argv[1:]) or 0)
