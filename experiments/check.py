"""Stage ``check``: the numerical checks of the papers' statements (``amemory check``).

Runs ``theory_checks`` in a subprocess (the checks switch jax to float64, which must not
leak into the other stages) with ``--json`` and ``--out``; stdout/stderr go to
``check.log``. One claim: every check passed; the per-check table goes into the report.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from amemory import atomic
from experiments import common
from experiments.configs import new_config

CLAIM = common.claim_specs("check")["theory"]


def run(cfg: Any, stage: common.Stage) -> dict[str, Any]:
    """``amemory check --quick`` (``--scale full``: without ``--quick``) into ``stage.out_dir``."""
    quick, json_path = cfg.scale == "quick", stage.out_dir / "checks.json"
    argv = ["--quick"] * quick + ["--json", str(json_path), "--out", str(stage.out_dir / "figures")]
    code = f"import sys, theory_checks.cli as c; sys.exit(c.main({argv!r}))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    stage.progress("check")
    log = proc.stdout + ("\n" + proc.stderr if proc.stderr else "")
    atomic.write_text(stage.out_dir / "check.log", log)
    counts, failed = "", []
    if json_path.exists():
        data = common.load_json(json_path)
        meta = data.get("meta", {})
        counts = f"{meta.get('passed')}/{meta.get('total')} passed"
        failed = [r["name"] for r in data.get("results", []) if not r.get("passed")]
    if proc.returncode == 0:
        ours, held = f"all passed ({counts})" if counts else "all passed", True
    elif "No module named" in log and not counts:
        ours, held = "theory_checks not available", None
    elif counts:
        ours, held = f"{counts}; failed: {', '.join(failed)}", False
    else:
        ours, held = f"exit status {proc.returncode} (see check.log)", None
    table = "\n".join(line for line in proc.stdout.splitlines() if line.startswith("|"))
    figures = sorted(stage.figure(p) for p in (stage.out_dir / "figures").glob("*.png"))
    metrics = {"returncode": proc.returncode, "counts": counts, "failed": failed}
    claim = CLAIM.claim(ours=ours, held=held, flags=" --quick" * quick)
    return {"metrics": metrics | {"report_md": table}, "figures": figures, "claims": [claim]}


# The checks run in a subprocess, which no import statement shows: their package is named.
EXPERIMENT = common.Experiment(
    "check", run, default=True, get_config=lambda scale: new_config(scale)[0],
    sources=("theory_checks/*.py",), headline=("check/theory",),
)  # fmt: skip
