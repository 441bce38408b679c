"""Training runs of the experiments: the run cache (config + code version), seeded
(vmapped) runs, learning-rate sweeps, and reading metrics off the run records.

Every stage trains through :func:`train_cached`, so runs are shared between stages and
resumed after an interruption; :func:`choose_lrs` and :func:`seeded_runs` are the
language-model stages' grid search on seed 0 and held-out-seed runs.
"""

from __future__ import annotations

import math
import os
import pathlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from ml_collections import ConfigDict

from experiments import common

# Config fields that do not change what a run computes (excluded from the cache key).
_NON_SEMANTIC = ("progress",)


def _semantic_hash(cfg: Any) -> str:
    """The cache key of a training run: its config and the code that trains it."""
    d = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
    d = {k: v for k, v in d.items() if k not in _NON_SEMANTIC}
    return common.config_hash({"config": d, "amemory": common.amemory_version()})


def _read_cached(workdir: pathlib.Path) -> tuple[dict[str, Any], list] | None:
    """A cached run's (summary, metrics records), or None when absent or unreadable.

    An unreadable entry (a summary.json or metrics.jsonl cut short by an older,
    non-atomic writer, or damaged on disk) is treated as missing: the run is trained
    again from scratch, and a line on stderr says so.
    """
    path = workdir / "summary.json"
    if not path.exists():
        return None
    try:
        summary = common.load_json(path)
        if not isinstance(summary, dict):
            raise ValueError("summary.json holds no JSON object")
        return summary, common.read_jsonl(workdir / "metrics.jsonl")
    except (OSError, ValueError) as e:  # json.JSONDecodeError and UnicodeDecodeError included
        sys.stderr.write(f"amemory: cached run {workdir} is unreadable ({e}); training it again\n")
        import shutil

        shutil.rmtree(workdir)
        return None


def train_cached(cfg: Any, cache_dir: str | os.PathLike, label: str) -> dict[str, Any]:
    """Train ``cfg`` with :func:`amemory.train.train`, reusing an identical earlier run.

    The run directory is ``cache_dir/<label>-<hash>``, the hash of the config and of the
    ``amemory`` sources (:func:`amemory_version`: a code change retrains). When it holds
    a readable ``summary.json`` the run is not repeated (an unreadable one is retrained
    from scratch, with a line on stderr); when it holds an unfinished run (stopped by
    SIGTERM, or killed), training resumes from its newest checkpoint. This lets stages
    share runs (the ablation's "none" and "all" are tail_lm's Adam and Muon).

    Returns:
      {"summary": train's summary dict, "records": metrics.jsonl rows, "workdir": path,
       "cached": bool, "label": label}.

    Raises:
      ValueError: from :func:`amemory.train.train` on a bad config.
      amemory.train.RunInterrupted: on SIGTERM/SIGINT (the step was saved).
    """
    from amemory.train import train

    h = _semantic_hash(cfg)
    workdir = pathlib.Path(cache_dir) / f"{label}-{h}"
    if not workdir.exists():  # same config under another label?
        same = sorted(pathlib.Path(cache_dir).glob(f"*-{h}/summary.json"))
        workdir = same[0].parent if same else workdir
    found = _read_cached(workdir)
    cached = found is not None
    if not cached:
        # a run killed before its first checkpoint was finished (none, or only Orbax's
        # unfinished <step>.orbax-checkpoint-tmp) starts again: a cache, not user work
        done = (p.name.isdigit() for p in (workdir / "checkpoints").glob("*"))
        summary = train(cfg, workdir, resume=any(done))
        found = summary, common.read_jsonl(workdir / "metrics.jsonl")
    return {"summary": found[0], "records": found[1], "workdir": str(workdir),
            "cached": cached, "label": label}  # fmt: skip


def seeded(run_cfg: Any, seeds: Sequence[int]) -> Any:
    """A copy of the run config ``run_cfg`` training ``seeds`` at once (``config.seeds``).

    The engine vmaps the seeds in one program: seed s initialises with ``PRNGKey(s)``;
    the data order is ``run_cfg.seed``'s for every seed (seeds differ in initialisation).
    An empty ``seeds`` keeps the single-seed run.
    """
    c = ConfigDict(run_cfg.to_dict())
    c.seeds = tuple(int(s) for s in seeds)
    return c


def eval_series(records: Sequence[dict[str, Any]], key: str, kind: str = "eval"):
    """(steps [n], values [n]) of ``key`` over the ``kind`` records (None -> NaN).

    Multi-seed records (lists) are returned as ``[n, seeds]``.
    """
    steps, vals = [], []
    for r in records:
        if r.get("kind") == kind and key in r:
            steps.append(r["step"])
            v = r[key]
            if isinstance(v, list):
                vals.append([np.nan if x is None else float(x) for x in v])
            else:
                vals.append(np.nan if v is None else float(v))
    return np.asarray(steps, dtype=float), np.asarray(vals, dtype=float)


def final_eval(run: dict[str, Any], key: str = "loss") -> float:
    """The last evaluation's ``key`` of a :func:`train_cached` result (NaN if absent).

    A multi-seed run gives the mean over seeds (:func:`final_eval_seeds` keeps them apart).
    """
    return float(np.mean(final_eval_seeds(run, key)))


def final_eval_seeds(run: dict[str, Any], key: str = "loss") -> np.ndarray:
    """``[seeds]`` last evaluation's ``key`` per seed (``[1]`` for one seed; NaN if absent)."""
    _, vals = eval_series(run["records"], key)
    if vals.size == 0:
        v = run["summary"].get("final_eval", {}).get(key)
        v = [np.nan if x is None else x for x in v] if isinstance(v, list) else v
        return np.atleast_1d(np.asarray(np.nan if v is None else v, float))
    return np.atleast_1d(np.asarray(vals[-1], float))


def final_train_loss(run: dict[str, Any], last: int = 5) -> float:
    """Mean training loss of the last ``last`` train records (mean over seeds; NaN if none)."""
    return float(np.mean(final_train_loss_seeds(run, last)))


def final_train_loss_seeds(run: dict[str, Any], last: int = 5) -> np.ndarray:
    """``[seeds]`` mean training loss of the last ``last`` train records per seed."""
    _, vals = eval_series(run["records"], "loss", kind="train")
    if vals.size == 0:
        return np.array([np.nan])
    return np.atleast_1d(np.mean(vals[-last:], axis=0))


def steps_to_reach(steps: np.ndarray, values: np.ndarray, target: float) -> float:
    """First step at which ``values <= target``, linearly interpolated between evals.

    Returns NaN if the target is never reached.
    """
    for i, (s, v) in enumerate(zip(steps, values, strict=True)):
        if v <= target:
            if i == 0:
                return float(s)
            s0, v0 = steps[i - 1], values[i - 1]
            if v0 == v:
                return float(s)
            return float(s0 + (s - s0) * (v0 - target) / (v0 - v))
    return float("nan")


def lr_sweep(
    make_cfg: Callable[[float], Any],
    grid: Sequence[float],
    cache_dir: str | os.PathLike,
    label: str,
    *,
    progress: Callable[[str], None] | None = None,
    key: str = "loss",
    score: Callable[[dict[str, Any]], float] | None = None,
) -> tuple[float, dict[str, Any], list[dict[str, Any]]]:
    """Train ``make_cfg(lr)`` for every lr in ``grid``; pick the lowest score.

    The score of a run is its final evaluation ``key`` (validation loss by default), or
    ``score(run)`` when given (e.g. :func:`final_train_loss` where the evaluation has no
    loss). Lower is better.

    Returns:
      (chosen lr, the chosen run (train_cached result), table rows
      [{"lr", "final_<key>", "chosen", "at_edge"}]).
    """
    runs = []
    for lr in grid:
        runs.append(train_cached(make_cfg(lr), cache_dir, f"{label}-lr{lr:g}"))
        if progress:
            progress(f"{label} lr={lr:g}")
    finals = [score(r) if score else final_eval(r, key) for r in runs]
    finite = [i for i, v in enumerate(finals) if math.isfinite(v)]
    best = min(finite, key=lambda i: finals[i]) if finite else 0
    edge = best in (0, len(grid) - 1) and len(grid) > 1
    rows = [{"lr": float(lr), f"final_{key}": finals[i], "chosen": i == best,
             "at_edge": i == best and edge} for i, lr in enumerate(grid)]  # fmt: skip
    return float(grid[best]), runs[best], rows


def run_config(
    base: ConfigDict, optimizer: str, lr: float, adam_lr: float, muon_roles: str = "hidden"
) -> ConfigDict:
    """A copy of ``base`` training ``optimizer`` at ``lr`` on ``muon_roles``, Adam elsewhere.

    ``optimizer == "adam"`` trains every parameter with Adam at ``lr`` (``adam_lr`` unused).

    Raises:
      ValueError: if ``optimizer`` is not in ``amemory.train.optimizers.names()``.
    """
    from amemory.train.optimizers import names  # "adam" and amemory.optim.OPTIMIZERS

    if optimizer not in names():
        raise ValueError(f"optimizer must be one of {names()}, got {optimizer!r}")
    c, adam = ConfigDict(base.to_dict()), optimizer == "adam"
    c.optimizer.update(name=optimizer, lr=float(lr), adam_lr=float(lr if adam else adam_lr),
                       muon_roles="none" if adam else muon_roles)  # fmt: skip
    return c


def choose_lrs(
    cfg: ConfigDict,
    cache_dir: Any,
    *,
    progress: Callable[[str], None] | None = None,
    optimizers: Sequence[str] | None = None,
    score: Callable[[dict[str, Any]], float] | None = None,
) -> tuple[dict[str, float], dict[str, Any], dict[str, list]]:
    """Grid-search each optimizer's learning rate (Adam first) on ``cfg.base``.

    ``score(run)`` (lower wins) replaces the final validation loss, as in :func:`lr_sweep`
    (e.g. :func:`final_train_loss` on biographies).

    Returns:
      (chosen lr per optimizer, chosen run per optimizer (train_cached results),
      sweep table rows per optimizer).
    """
    chosen: dict[str, float] = {}
    runs: dict[str, Any] = {}
    tables: dict[str, list] = {}
    for opt in ("adam", *(o for o in optimizers or cfg.optimizers if o != "adam")):
        # Adam's sweep (adam_lr = lr: unused) comes first; its choice is the others' adam_lr
        chosen[opt], runs[opt], tables[opt] = lr_sweep(
            lambda lr, o=opt: run_config(cfg.base, o, lr, chosen.get("adam", lr), cfg.muon_roles),
            cfg.lr_grid[opt], cache_dir, _label(cfg, opt), progress=progress, score=score,
        )  # fmt: skip
    return chosen, runs, tables


def _label(cfg: ConfigDict, optimizer: str) -> str:
    """The run-cache label of ``optimizer``'s runs in :func:`choose_lrs` and :func:`seeded_runs`."""
    return "lm-adam" if optimizer == "adam" else f"lm-{optimizer}-{cfg.muon_roles}"


def seeded_runs(
    cfg: ConfigDict,
    chosen: dict[str, float],
    cache_dir: Any,
    *,
    progress: Callable[[str], None] | None = None,
    optimizers: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Train each optimizer at its chosen learning rate on the seeds ``cfg.seeds`` at once.

    Returns optimizer -> :func:`train_cached` result (a multi-seed run; with an
    empty ``cfg.seeds`` the single-seed run of ``base.seed``).
    """
    runs = {}
    for opt in tuple(optimizers or cfg.optimizers):
        rc = run_config(cfg.base, opt, chosen[opt], chosen["adam"], cfg.muon_roles)
        label = f"{_label(cfg, opt)}-lr{chosen[opt]:g}-seeds"
        runs[opt] = train_cached(seeded(rc, cfg.seeds), cache_dir, label)
        if progress:
            progress(f"{opt} seeds {tuple(cfg.seeds)}")
    return runs


def bucket_curves(run: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(eval steps [n], per-bucket val loss [n, n_buckets, seeds], bucket labels) of one run.

    Buckets with no validation tokens (e.g. "unseen") are dropped. A single-seed run
    has a seed axis of length 1.
    """
    labels = []
    for r in run["records"]:
        if r.get("kind") == "eval" and "bucket_labels" in r:
            labels = list(r["bucket_labels"])
    cols, keep = [], []
    steps = np.zeros(0)
    for b, lab in enumerate(labels):
        steps, v = eval_series(run["records"], f"loss/bucket_{b}")
        if v.size and np.isfinite(v).any():
            cols.append(v.reshape(len(steps), -1))
            keep.append(lab)
    arr = np.stack(cols, axis=1) if cols else np.zeros((0, 0, 1))
    return steps, arr, keep


def final_spectrum(run: dict[str, Any]) -> dict[str, list[float]]:
    """The last spectrum record's ``spectrum/<role>/<metric>`` values per seed of one run."""
    last: dict[str, Any] = {}
    for r in run["records"]:
        if r.get("kind") == "spectrum":
            last = {k: v for k, v in r.items() if k.startswith("spectrum/")}
    return {k: np.atleast_1d(np.asarray(v, float)).tolist() for k, v in last.items()}


def steps_to_target(steps: np.ndarray, loss: np.ndarray, target: np.ndarray) -> np.ndarray:
    """``[seeds]`` first (interpolated) step at which seed s's loss reaches ``target[s]``.

    Args:
      steps: ``[n]`` eval steps; loss: ``[n, seeds]``; target: ``[seeds]`` (e.g. Adam's
        final loss of the same seed). NaN where a seed never reaches its target.
    """
    loss = np.asarray(loss, float).reshape(len(steps), -1)
    target = np.broadcast_to(np.asarray(target, float), loss.shape[1:])
    return np.array([steps_to_reach(steps, loss[:, s], target[s])
                     for s in range(loss.shape[1])])  # fmt: skip
