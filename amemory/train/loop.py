"""``train(config, workdir)``: the training loop for every task (run directory and
metrics schema: ``docs/metrics.md``).

Metrics are reduced on the device and read only at the points of :class:`_SyncPoints`
(log, evaluation, spectrum, checkpoint, profile, the guards of :mod:`amemory.train.guard`);
the steps in between run under ``jax.transfer_guard_device_to_host("disallow_explicit")``,
so an accidental device-to-host copy is an error. Batches are put on the devices
``PREFETCH`` steps ahead.
"""

from __future__ import annotations

import collections
import contextlib
import json
import pathlib
import time
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from ml_collections import ConfigDict
from tqdm.auto import tqdm

from amemory import atomic
from amemory.analysis import spectrum as spectrum_lib
from amemory.train import checkpoint as ckpt_lib
from amemory.train import config as config_lib
from amemory.train import engine as engine_lib
from amemory.train import guard as guard_lib
from amemory.train import optimizers, parallel, tasks
from amemory.train.records import RunLog, jsonable
from amemory.train.state import TrainState

PREFETCH = 2  # batches put on the devices ahead of the step that uses them


class _Feed:
    """Training batches on the devices ``depth`` steps ahead: ``(placed batch, the Grain
    position after it)``, what a checkpoint of that step stores; ``(None, None)`` without
    input."""

    def __init__(self, it: Iterator | None, put, depth: int):
        self.it, self.put = it, put
        self.queue: collections.deque = collections.deque(self._read() for _ in range(depth))

    def _read(self) -> tuple[Any, bytes | None]:
        if self.it is None:
            return None, None
        return self.put(next(self.it)), self.it.get_state()

    def get(self) -> tuple[Any, bytes | None]:
        return self.queue.popleft()

    def refill(self) -> None:  # after dispatching the step, to overlap with it
        self.queue.append(self._read())

    def peek(self) -> Any:  # the next batch
        return self.queue[0][0]


def _routes(table: list) -> str:
    """One line of the routing table and its decay: ``routing: q,k,v,o -> muon wd=0.1;
    head -> adam wd=0.01; embed,norm -> adam`` (``wd`` only where it is not 0)."""
    by_tx: dict[tuple, dict[str, None]] = {}  # (transform, wd) -> its roles, an ordered set
    for _, _, role, tx_name, _, wd in table:
        by_tx.setdefault((tx_name, f" wd={wd:g}" if wd else ""), {})[role] = None
    return "routing: " + "; ".join(f"{','.join(r)} -> {t}{w}" for (t, w), r in by_tx.items())


def _per_seed(x: Any, multi: bool) -> Any:
    """numpy scalar -> float; [S] -> list (multi-seed)."""
    a = np.asarray(x)
    return a.item() if a.ndim == 0 and not multi else a.tolist()


def train(
    config: ConfigDict, workdir: str | pathlib.Path, *, resume: bool = False,
    allow_changed: tuple[str, ...] = (),
) -> dict:  # fmt: skip
    """Train ``config`` (a run ConfigDict; missing engine fields take their defaults) in the
    run directory ``workdir``; return the summary dict (also ``summary.json``).

    Args:
      resume: continue exactly from the newest intact checkpoint in ``workdir``, under the
        resume contract (``guard.check_resume``); needed when it holds checkpoints.
      allow_changed: config fields that may differ from the checkpoint's on resume.

    Raises:
      ValueError: bad config (names the field and allowed values), data not found, or a
        checkpoint that does not fit (names the leaf or field), all before compiling.
      amemory.train.guard.NonFiniteLossError: loss, gradient or parameters of any seed
        became NaN/inf; names the step and the newest healthy checkpoint (never saved).
      amemory.train.guard.DivergenceError: the divergence test fired (``config.divergence``).
      amemory.train.guard.RunInterrupted: SIGTERM/SIGINT/preemption; the step was saved.
      amemory.train.guard.WorkdirBusyError: another run holds ``workdir``.
      OSError: the workdir cannot be written (read-only, full disk).
    """
    return run(config, workdir, resume=resume, allow_changed=allow_changed)[0]


def run(
    config: ConfigDict, workdir: str | pathlib.Path, *, resume: bool = False,
    allow_changed: tuple[str, ...] = (), task: tasks.Task | None = None,
) -> tuple[dict, TrainState]:  # fmt: skip
    """``train``, also returning the final ``TrainState`` on the host; ``task`` (any object
    with the :class:`~amemory.train.tasks.Task` interface) replaces the config's task."""
    t_start = time.perf_counter()
    config = ConfigDict(config.to_dict()) if isinstance(config, ConfigDict) else config
    config_lib.with_engine_defaults(config)
    config_lib.validate(config)
    parallel.initialize_distributed(config.parallel)
    with guard_lib.RunGuard(config, workdir, allow_changed) as g:
        return _run(config, workdir, resume, task, g, t_start)


def _run(
    config: ConfigDict, workdir: str | pathlib.Path, resume: bool, task: tasks.Task | None,
    g: guard_lib.RunGuard, t_start: float,
) -> tuple[dict, TrainState]:  # fmt: skip
    place = parallel.placement(config.parallel)
    workdir = pathlib.Path(workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    b = engine_lib.build(config, place, task)  # the step `amemory plan` compiles, too
    with contextlib.ExitStack() as closing:  # checkpointer, records, bar, trace: closed on errors
        ckpt = ckpt_lib.Checkpointer(workdir / "checkpoints", max_to_keep=config.keep_checkpoints)
        closing.callback(ckpt.close)
        state, inputs, resumed = _start_or_resume(b, ckpt, resume, g)
        log = RunLog(workdir, jax.process_index() == 0, resumed, b.seeds if b.multi else None)
        closing.callback(log.close)
        g.attach(ckpt, log)
        _announce(config, workdir, b, place.mode, log, ckpt, resumed)
        start = resumed or 0
        points = _SyncPoints(config, workdir, b, ckpt, log, start, g)
        closing.callback(points.close)
        state = _train_steps(config, b, state, inputs, start, points, g, closing)
        ckpt.wait()
        final_host = parallel.to_host(state)
        final_step = int(np.asarray(final_host.step).ravel()[0])
        if not points.last_eval:
            points.last_eval = _evaluate(b.engine, b.task, state, b.multi)
        summary = jsonable(dict(
            workdir=str(workdir), task=b.task.kind, optimizer=config.optimizer.name,
            muon_roles=config.optimizer.muon_roles, mode=place.mode, seeds=b.seeds,
            steps=final_step, n_params=b.n_params, final_train_loss=points.last_loss,
            final_eval=points.last_eval,
            tokens_per_s=float(np.median(points.throughput)) if points.throughput else None,
            compile_s=points.compile_s, wall_s=time.perf_counter() - t_start, resumed_from=resumed,
            last_checkpoint=str(ckpt.path(points.last_saved)) if points.last_saved else None,
        ))  # fmt: skip
        log.write("event", final_step, event="end", wall_s=summary["wall_s"])
    if jax.process_index() == 0:
        atomic.write_json(workdir / "summary.json", summary)
    return summary, final_host


def _start_or_resume(
    b: engine_lib.Built, ckpt: ckpt_lib.Checkpointer, resume: bool, g: guard_lib.RunGuard
) -> tuple[TrainState, Iterator | None, int | None]:
    """``(state, train input, step resumed from or None)`` by :func:`train`'s resume rule."""
    latest = ckpt.latest_step()
    if latest is not None and not resume:
        raise ValueError(
            f"workdir {ckpt.directory.parent} already holds checkpoints (latest step {latest}); "
            "pass --resume (resume=True) to continue it, or choose another --workdir"
        )
    if latest is None and resume:
        g.resume_without_checkpoint(ckpt)
    inputs = b.task.train_input()
    if latest is None:
        return b.engine.init_state(), inputs, None
    latest, state, _, position = g.restore(
        ckpt, b.engine.restore_target, data=inputs is not None,
        meta=b.task.checkpoint_meta(), fresh=b.engine.init_state,
    )  # fmt: skip
    if inputs is not None:
        inputs.set_state(position)
    return state, inputs, int(latest)


def _announce(config, workdir, b: engine_lib.Built, mode: str, log, ckpt, resumed) -> None:
    """Write config.json and the start (routing table) or resume event; print one line."""
    is_main = jax.process_index() == 0
    if is_main:
        atomic.write_text(workdir / "config.json", config.to_json_best_effort(indent=2) + "\n")
    if resumed is not None:
        log.write("event", resumed, event="resume", checkpoint=str(ckpt.path(resumed)))
    else:
        log.write(
            "event", 0, event="start", task=b.task.kind, optimizer=config.optimizer.name,
            lr=optimizers.resolved_lr(config.optimizer), adam_lr=config.optimizer.adam_lr,
            mode=mode, seeds=b.seeds, n_params=b.n_params, devices=jax.device_count(),
            processes=jax.process_count(), routing=b.opt.table, layout=b.opt.layout,
        )  # fmt: skip
    if is_main and config.progress:
        tqdm.write(
            f"amemory train: {b.task.kind}, {b.n_params:,} parameters, {_routes(b.opt.table)}"
        )


def _train_steps(config, b, state, inputs, start, points, g, closing) -> TrainState:
    """Steps ``start + 1 .. config.steps``; between two sync points no host read is allowed."""
    steps = points.steps
    bar = tqdm(
        total=steps, initial=start, disable=not (config.progress and jax.process_index() == 0),
        desc=f"{b.task.kind}/{config.optimizer.name}", unit="step", dynamic_ncols=True,
    )  # fmt: skip
    closing.callback(bar.close)
    feed = _Feed(inputs, b.engine.put_batch, PREFETCH)
    acc = b.engine.new_accumulator(feed.peek())
    for s in range(start + 1, steps + 1):
        with jax.transfer_guard_device_to_host("disallow_explicit"):
            points.before_step(s)
            batch, position = feed.get()
            state, acc = b.engine.step(state, acc, batch)
            feed.refill()
            bar.update(1)
            acc = points.after_step(s, state, acc, position, bar)
            if s < steps and g.stop_requested(s):  # SIGTERM/SIGINT/preemption: save, stop
                points.stop(s, state, acc, position, bar)
    return state


class _SyncPoints:
    """The host-side points of the loop, one method each; the guard ``g`` (``RunGuard``)
    judges health, divergence and what a stop message names."""

    def __init__(self, config, workdir, b: engine_lib.Built, ckpt, log, start: int, g):
        self.config, self.workdir, self.engine, self.task = config, workdir, b.engine, b.task
        self.ckpt, self.log, self.multi, self.g = ckpt, log, b.multi, g
        self.extra = {"config": json.loads(config.to_json_best_effort()), "seeds": b.seeds,
                      "task_meta": b.task.checkpoint_meta()}  # beside each state  # fmt: skip
        self.steps, self.first = int(config.steps), start + 1
        self.profile = tuple(config.get("profile_steps", ()))
        self.last_logged = self.last_loss = self.compile_s = None
        self.last_eval: dict = {}
        self.throughput: list[float] = []  # tokens/s of each log interval
        self.last_saved: int | None = start or None
        self.mark = (time.perf_counter(), start)  # (time, step) when the device was idle
        self.tracing = False

    def _due(self, s: int, every: int) -> bool:
        return s == self.steps or bool(every and s % every == 0)

    def before_step(self, s: int) -> None:
        if self.profile and s == self.profile[0]:
            jax.profiler.start_trace(str(self.workdir))
            self.tracing = True

    def close(self) -> None:
        """Stop a trace left running by an error."""
        if self.tracing:
            jax.profiler.stop_trace()
            self.tracing = False

    def after_step(self, s: int, state: TrainState, acc: dict, position, bar) -> dict:
        """Run the points due at step ``s`` (the only host reads of the loop, allowed here
        alone); returns the accumulator to continue with."""
        every = int(self.config.spectrum_every)
        due = {
            "compiled": s == self.first,  # compile + first step
            "profile": bool(self.profile) and s == self.profile[1],
            "log": self._due(s, int(self.config.log_every)),
            "eval": self._due(s, int(self.config.eval_every)),
            "spectrum": bool(every) and self._due(s, every),
            "save": self._due(s, int(self.config.checkpoint_every)),
        }
        if not any(due.values()):
            return acc
        with jax.transfer_guard_device_to_host("allow"):
            if due["compiled"]:
                jax.block_until_ready(acc)
                self.compile_s = time.perf_counter() - self.mark[0]
                self.log.write("event", s, event="compiled", first_step_s=self.compile_s)
            if due["profile"]:
                jax.block_until_ready(state)
                self.close()
            if due["log"]:
                acc = self.log_point(s, acc, bar)
            if due["eval"]:
                self.last_eval = _evaluate(self.engine, self.task, state, self.multi)
                self.log.write("eval", s, **self.last_eval)
            if due["spectrum"]:
                self.log.write("spectrum", s, **_spectrum(self.task, state, self.multi))
            if due["save"]:
                self.save_point(s, state, acc, position)
        self.mark = (time.perf_counter(), s)
        return acc

    def check_finite(self, acc: dict, s: int) -> None:
        """``NonFiniteLossError`` when a step up to ``s`` had a non-finite loss, gradient or
        parameters (``acc``: the host accumulator's per-seed ``bad_step``, ``bad_loss``)."""
        bad = np.asarray(acc["bad_step"]).ravel()
        if (bad < 0).all():
            return
        first = int(bad[bad >= 0].min())
        self.g.confirm_by_failed_step(first, np.asarray(acc["bad_loss"]).ravel()[bad == first])
        self.g.fail(
            guard_lib.NonFiniteLossError, first,
            f"non-finite training loss, gradient or parameters at step {first}",
            {"event": "nonfinite", "bad_step": bad.tolist()},
        )  # fmt: skip

    def log_point(self, s: int, acc: dict, bar) -> dict:
        """Read the accumulated metrics, check them, write the train record; fresh acc."""
        host = self.engine.fetch(acc)
        now = time.perf_counter()
        self.check_finite(host, s)
        rec = {k: _per_seed(v, self.multi) for k, v in engine_lib.interval_metrics(host).items()}
        t0, s0 = self.mark
        if s0 >= self.first and s > s0:  # excludes compilation; a stop may follow a sync
            tps = self.task.tokens_per_step * (s - s0) / (now - t0)
            rec["tokens_per_s"], rec["step_time_s"] = tps, (now - t0) / (s - s0)
            self.throughput.append(tps)
            bar.set_postfix(loss=np.mean(rec["loss"]), tok_s=f"{tps:.0f}")
        else:
            bar.set_postfix(loss=np.mean(rec["loss"]))
        self.last_loss = rec["loss"]
        self.log.write("train", s, **rec)
        self.last_logged = s
        self.g.observe_log(s, rec["loss"], rec.get("grad_norm"))  # health, divergence test
        return self.engine.new_accumulator(None)

    def save_point(self, s: int, state: TrainState, acc: dict, position: bytes | None) -> None:
        """Save step ``s`` after the non-finite check (a non-finite state is never saved)."""
        self.check_finite(self.engine.fetch({k: acc[k] for k in ("bad_step", "bad_loss")}), s)
        self.g.save(self.ckpt, s, state, self.extra, data=position)
        self.last_saved = s

    def stop(self, s: int, state: TrainState, acc: dict, position: bytes | None, bar) -> None:
        """A stop after step ``s``: log and save it (if not yet), raise ``RunInterrupted``."""
        with jax.transfer_guard_device_to_host("allow"):
            if self.last_logged != s:
                acc = self.log_point(s, acc, bar)
            if self.last_saved != s:
                self.save_point(s, state, acc, position)
        self.g.stop(self.ckpt, s)


def _evaluate(engine: engine_lib.Engine, task, state: TrainState, multi: bool) -> dict:
    """The task's evaluation of every seed; per-seed values become lists (labels stay one)."""
    if not multi:
        return task.evaluate(engine.eval_params(state, None), engine.put_batch)
    n = len(jax.tree.leaves(state.params)[0])
    per = [task.evaluate(engine.eval_params(state, i), engine.put_batch) for i in range(n)]
    return {k: per[0][k] if _is_label(per[0][k]) else [p[k] for p in per] for k in per[0]}


def _is_label(v: Any) -> bool:
    return isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))


def _spectrum(task, state: TrainState, multi: bool) -> dict:
    mats = task.spectrum_matrices(parallel.to_host(state.params))
    out = {}
    for role, stack in mats.items():  # stack: [L, (S,) m, n]
        for name, v in spectrum_lib.spectrum_metrics(stack).items():
            out[f"spectrum/{role}/{name}"] = _per_seed(np.nanmean(np.asarray(v), axis=0), multi)
    return out
