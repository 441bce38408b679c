"""``python -m experiments <name> [--scale quick|full] [--out DIR] [--set FIELD=VALUE ...]``.

Runs one registered experiment (:func:`experiments.common.experiments`) in its full
config at ``--scale`` (``amemory reproduce --only <name>`` runs the same and adds the
report), writes ``result.json`` and ``figures/`` into ``--out`` (default
``runs/<name>-<UTC timestamp>``) and prints one line per claim.
"""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Sequence

from amemory.cli import Parser
from experiments import common


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, run the experiment, print its claims; 2 on a bad argument."""
    names = tuple(common.experiments())
    parser = Parser(prog="python -m experiments", description="one experiment of reproduce")
    parser.add_argument("name", choices=names, help="the experiment")
    parser.add_argument("--scale", default="quick", choices=common.SCALES, help="quick or full")
    parser.add_argument("--out", default=None, help="run directory (default runs/<name>-<ts>)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE",
        help="override a config field, e.g. --set base.steps=50 (repeatable)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    exp = common.experiments()[args.name]
    cfg = exp.config(args.scale)
    try:
        for key, value in map(common.parse_set, args.set):
            common.apply_override(cfg, key, value)
    except ValueError as e:
        parser.error(str(e))
    out = pathlib.Path(args.out or pathlib.Path("runs") / f"{args.name}-{common.timestamp()}")
    result = exp(cfg, out)
    print(common.format_summary(result))
    print(f"run dir: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
