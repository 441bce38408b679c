"""``amemory train``: train a transformer or an associative memory from a config file.

    amemory train --config experiments/configs/lm.py --workdir runs/lm_muon \\
        --config.optimizer.name=muon --config.steps=2000
    amemory train --config experiments/configs/memory.py:full --workdir runs/mem
    amemory train --config experiments/configs/lm.py --workdir runs/lm_muon --resume

``--config PATH[:ARG]`` names a file with ``get_config(ARG)``; every
``--config.a.b=VALUE`` (or ``--config.a.b VALUE``) overrides one field. An
unknown field or a disallowed value fails before anything is compiled, with the
allowed values. The run directory is ``--workdir`` (config.json, metrics.jsonl,
checkpoints/, summary.json).
"""

from __future__ import annotations

import argparse
import json
import sys


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # noqa: D401 - argparse API
        sys.stderr.write(f"amemory train: error: {message}\n")
        raise SystemExit(2)


def _split_overrides(rest: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(rest):
        a = rest[i]
        if not a.startswith("--config."):
            raise ValueError(
                f"unrecognised argument {a!r} (overrides look like --config.a.b=VALUE)"
            )
        key = a[len("--config.") :]
        if "=" in key:
            out.append(key)
            i += 1
        elif i + 1 < len(rest):
            out.append(f"{key}={rest[i + 1]}")
            i += 2
        else:
            raise ValueError(f"{a}: missing value")
    return out


def main(argv: list[str]) -> int:
    """Parse ``argv``, load the config, train, print the summary. Returns the exit status."""
    parser = _Parser(
        prog="amemory train",
        description="Train a model from a config file; override fields with --config.a.b=VALUE.",
    )
    parser.add_argument("--config", required=True, help="config file, optionally PATH:ARG")
    parser.add_argument("--workdir", help="run directory (required unless --print-config)")
    parser.add_argument(
        "--resume", action="store_true", help="continue from the newest checkpoint in --workdir"
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved config and exit"
    )
    args, rest = parser.parse_known_args(argv)
    from amemory.train.config import load_config

    try:
        config = load_config(args.config, _split_overrides(rest))
    except ValueError as e:
        sys.stderr.write(f"amemory train: error: {e}\n")
        return 2
    if args.print_config:
        print(config)
        return 0
    if not args.workdir:
        parser.error("the following arguments are required: --workdir")
    from amemory.train.loop import NonFiniteLossError, train

    try:
        summary = train(config, args.workdir, resume=args.resume)
    except ValueError as e:
        sys.stderr.write(f"amemory train: error: {e}\n")
        return 2
    except NonFiniteLossError as e:
        sys.stderr.write(f"amemory train: {e}\n")
        return 1
    brief = {k: v for k, v in summary.items() if k != "final_eval"}
    brief["final_eval"] = {
        k: v for k, v in summary["final_eval"].items() if not k.startswith("per_class")
    }
    print(json.dumps(brief, indent=2))
    return 0
