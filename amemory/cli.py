"""The `amemory` command line: one entry point, one subcommand per job.

Each subcommand lives in the module that owns the job and exposes
``main(argv: list[str]) -> int``; this file only dispatches, so importing it is
cheap (no jax import until a subcommand runs).
"""

from __future__ import annotations

import argparse
import glob
import importlib
import os
import sys
from typing import NoReturn

# name -> (module with main(argv), one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": ("amemory.train.cli", "train a transformer or associative memory from a config"),
    "check": ("theory_checks.cli", "numerically verify the papers' statements"),
    "reproduce": ("experiments.reproduce", "run the papers' experiments and write a report"),
    "report": ("experiments.report", "the claims table and figures from the committed results"),
    "coordcheck": ("amemory.train.coordcheck", "activation and update sizes against width"),
    "plan": ("amemory.train.planner", "compile the train step for TPU topologies, from any host"),
    "sample": ("amemory.train.sample", "generate text from a trained run (KV-cache decoding)"),
    "data": ("amemory.data.cli", "prepare corpora and print their statistics"),
    "bench": ("experiments.bench.cli", "benchmarks: optimizer update and train step"),
}


class Parser(argparse.ArgumentParser):
    """The parser of every ``amemory`` command: an error is one line naming the command,
    ``{prog}: error: {message}`` on stderr, and exit status 2."""

    def error(self, message: str) -> NoReturn:
        raise SystemExit(self.fail(f"{message} (see `{self.prog} --help`)"))

    def fail(self, message: object) -> int:
        """Write ``{prog}: error: {message}`` to stderr; return the exit status 2."""
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        return 2


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="amemory",
        description=(
            "Muon vs Adam vs SignGD on associative memories: train, check theorems, "
            "reproduce experiments, prepare data, benchmark."
        ),
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name, (_, help_) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_, add_help=False)
    return parser


def _cpu_unless_accelerator() -> None:
    """Keep JAX off accelerator runtimes on a host without accelerators when libtpu or the
    CUDA plugin is installed (JAX would try them and print their warnings):
    ``JAX_PLATFORMS=cpu`` unless it is set or a TPU / NVIDIA device is visible. ``amemory
    plan`` still reaches the TPU and GPU compilers (a topology loads them itself)."""
    if os.environ.get("JAX_PLATFORMS"):
        return
    if not any(importlib.util.find_spec(m) for m in ("libtpu", "jax_cuda12_plugin")):
        return
    if not any(glob.glob(p) for p in ("/dev/accel*", "/dev/vfio/*", "/dev/nvidia[0-9]*")):
        os.environ["JAX_PLATFORMS"] = "cpu"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _cpu_unless_accelerator()
    parser = build_parser()
    # Split at the subcommand: everything after it belongs to the subcommand's own parser.
    split = next((i for i, a in enumerate(argv) if not a.startswith("-")), len(argv))
    top, rest = argv[:split], argv[split + 1 :]
    args = parser.parse_args(top + argv[split : split + 1])
    if args.version:
        from amemory import __version__

        print(__version__)
        return 0
    if args.command is None:
        parser.print_help()
        return 0
    try:
        module = importlib.import_module(SUBCOMMANDS[args.command][0])
    except ModuleNotFoundError as e:  # an optional dependency, or experiments/ outside a checkout
        return parser.fail(f"`amemory {args.command}` cannot start: {e}")
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
