"""``amemory train``: train a transformer or an associative memory from a config file.

    amemory train --config experiments/configs/memory.py:full --workdir runs/mem \\
        --config.optimizer.name=muon --config.steps=2000 [--resume]

``--config PATH[:ARG]`` names a file with ``get_config(ARG)``; ``--config.a.b=VALUE`` (or
``--config.a.b VALUE``) overrides one field. Exit statuses: ``docs/reliability.md``.
"""

from __future__ import annotations

import json
import sys

from amemory.cli import Parser


def _split_overrides(rest: list[str]) -> list[str]:
    out, args = [], iter(rest)
    for a in args:
        if not a.startswith("--config."):
            raise ValueError(
                f"unrecognised argument {a!r} (overrides look like --config.a.b=VALUE)"
            )
        key = a.removeprefix("--config.")
        if "=" not in key:  # --config.a.b VALUE
            value = next(args, None)
            if value is None:
                raise ValueError(f"{a}: missing value")
            key = f"{key}={value}"
        out.append(key)
    return out


def main(argv: list[str]) -> int:
    """Parse ``argv``, load the config, train, print the summary. Returns the exit status."""
    parser = Parser(
        prog="amemory train",
        description="Train a model from a config file; override fields with --config.a.b=VALUE.",
    )
    parser.add_argument("--config", required=True, help="config file, optionally PATH:ARG")
    parser.add_argument("--workdir", help="run directory (required unless --print-config)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue exactly from the newest intact checkpoint in --workdir; required when it "
        "holds checkpoints, refused (nothing touched) when a field that changes what the run "
        "computes differs from the checkpoint's (see --allow-changed); with no checkpoint, "
        "starts at step 0 only if the workdir records no training",
    )
    parser.add_argument(
        "--allow-changed", action="append", default=[], metavar="FIELD[,FIELD]",
        help="with --resume: config fields that may differ from the checkpoint's (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--print-config", action="store_true",
        help="print the resolved config, each field with its comment, and exit",
    )  # fmt: skip
    args, rest = parser.parse_known_args(argv)
    from amemory.train import lock

    if args.workdir and not args.print_config:
        try:  # fail fast, before numpy or JAX is imported, if another run holds the workdir
            lock.probe_workdir(args.workdir)
        except lock.WorkdirBusyError as e:
            parser.fail(e)
            return lock.EXIT_BUSY
    from amemory.train import guard, noise
    from amemory.train.config import format_config, load_config, validate

    try:  # validated once: here for --print-config, else at the start of train()
        config = load_config(args.config, _split_overrides(rest))
        if args.print_config:
            validate(config)
    except ValueError as e:
        return parser.fail(e)
    if args.print_config:
        print(f"# {args.config}, after --config overrides")
        print(format_config(config, args.config))
        return 0
    if not args.workdir:
        parser.error("the following arguments are required: --workdir")
    from amemory.train.loop import train

    allow = tuple(f.strip() for item in args.allow_changed for f in item.split(",") if f.strip())
    try:
        with noise.held():  # Orbax's thread noise: a failure is reported in one line below
            summary = train(config, args.workdir, resume=args.resume, allow_changed=allow)
    except (ValueError, OSError, guard.WorkdirBusyError) as e:  # OSError: read-only, full disk
        cannot = isinstance(e, OSError) and not str(e).startswith("cannot write")
        parser.fail(f"cannot write the run directory: {e}" if cannot else e)
        return guard.exit_code(e)
    except (guard.NonFiniteLossError, guard.DivergenceError, guard.RunInterrupted) as e:
        sys.stderr.write(f"amemory train: {e}\n")
        return guard.exit_code(e)
    except KeyboardInterrupt:  # a second Ctrl-C while the first one's save was running
        sys.stderr.write("amemory train: aborted by a second Ctrl-C; the checkpoints already "
                         "on disk are intact (Orbax writes atomically)\n")  # fmt: skip
        return guard.EXIT_INTERRUPTED
    brief = {k: v for k, v in summary.items() if k != "final_eval"}
    brief["final_eval"] = {
        k: v for k, v in summary["final_eval"].items() if not k.startswith("per_class")
    }
    print(json.dumps(brief, indent=2))
    return 0
