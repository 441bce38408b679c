"""Run guards: the policy of a run's stops, health and resume contract.

One :class:`RunGuard` wraps a training run; the guarantees are the table of
``docs/reliability.md``, each with its test. A checkpoint is *healthy* when a train record
after it had a finite loss the divergence test did not flag, or the step that failed after
it had such a loss after a healthy record; non-finite and divergence stops name the newest
healthy one and move newer ones to ``checkpoints-rejected/``.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import signal
import sys
import threading
from typing import Any, NoReturn

import numpy as np

from amemory.train.lock import WorkdirBusyError, WorkdirLock  # noqa: F401 - re-exported

# Exit statuses of ``amemory train`` (docs/reliability.md).
EXIT_NONFINITE = 1
EXIT_CONFIG = 2  # bad config, bad data, unwritable workdir, resume contract
EXIT_DIVERGED = 3
EXIT_PREEMPTED = 75  # SIGTERM / preemption notice: sysexits.h EX_TEMPFAIL, "retry later"
EXIT_INTERRUPTED = 130  # SIGINT: 128 + 2, the shell's convention for Ctrl-C

# Config fields (or dotted group prefixes) that may differ on resume: not what is computed.
RESUME_FREE = (
    "steps", "log_every", "eval_every", "spectrum_every", "spectrum_roles",
    "checkpoint_every", "keep_checkpoints", "progress", "parallel", "divergence",
    "optimizer.diagnostics", "data.eval_batches", "data.n_buckets",
    "data.biographies.eval_per_group",
)  # fmt: skip


class NonFiniteLossError(RuntimeError):
    """The loss (or the state to be saved) became NaN/inf; names the step and healthy checkpoint."""

    exit_code = EXIT_NONFINITE


class DivergenceError(RuntimeError):
    """The divergence test fired (``config.divergence``); the message says which rule and where."""

    exit_code = EXIT_DIVERGED


class RunInterrupted(KeyboardInterrupt):
    """The run stopped on SIGTERM/SIGINT/preemption after saving ``step`` to ``checkpoint``.

    A ``KeyboardInterrupt``, so that callers' ``except Exception`` blocks do not swallow it.
    """

    def __init__(self, reason: str, step: int, checkpoint: str, finished: bool = False):
        self.reason, self.step, self.checkpoint = reason, int(step), checkpoint
        self.exit_code = EXIT_INTERRUPTED if reason == "SIGINT" else EXIT_PREEMPTED
        then = (
            "the run had finished (summary.json written)" if finished else "continue with --resume"
        )
        super().__init__(
            f"stopped by {reason} after step {step}; checkpoint {checkpoint} saved; {then}"
        )


def exit_code(error: BaseException) -> int:
    """``amemory train``'s exit status for an exception of ``train`` (default ``EXIT_CONFIG``)."""
    return getattr(error, "exit_code", EXIT_CONFIG)


class StopSignals:
    """SIGTERM / SIGINT handlers (main thread only) that set ``requested``; restored on exit.
    After the first signal a second SIGINT raises ``KeyboardInterrupt`` at once."""

    def __init__(self, enabled: bool = True):
        self.requested: str | None = None
        self._enabled = enabled and threading.current_thread() is threading.main_thread()
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = self.requested or signal.Signals(signum).name
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def __enter__(self) -> StopSignals:
        for sig in (signal.SIGTERM, signal.SIGINT) if self._enabled else ():
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


class DivergenceMonitor:
    """The divergence test on the losses and gradient norms of train records.

    Per seed, at each train record (loss ``L`` in nats, global gradient norm ``g``):
    *high*: ``L > loss_factor * m`` and ``L > L_0`` (``m`` the smallest earlier loss,
    ``L_0`` the first; a loss memorised near zero is not a blow-up); *dead*: ``g == 0``
    and ``L > 0``. The run diverged when a seed is high, or dead, at ``patience``
    consecutive records; a record is *healthy* when no seed is high or dead and every
    gradient norm is finite. The thresholds are ours (big_vision stops on NaN only).
    ``enabled=False`` turns the test off (``observe`` still reports health).
    """

    def __init__(self, loss_factor: float = 10.0, patience: int = 3, enabled: bool = True):
        self.loss_factor, self.patience, self.enabled = float(loss_factor), int(patience), enabled
        # per seed: first and smallest loss, high / dead streak lengths, streak start step
        self.first = self.best = self.high = self.dead = self.since = None

    def high_loss(self, loss: Any) -> np.ndarray:
        """Per seed: the *high* rule on ``loss`` (False before the first record)."""
        loss = np.atleast_1d(np.asarray(loss, np.float64))
        if self.first is None:
            return np.zeros(loss.shape, bool)
        return (loss > self.loss_factor * self.best) & (loss > self.first)

    def observe(self, step: int, loss: Any, grad_norm: Any) -> tuple[bool, str | None]:
        """One train record (``loss``: scalar or ``[S]`` nats; ``grad_norm``: same shape or
        None); returns ``(healthy, divergence message or None)``."""
        loss = np.atleast_1d(np.asarray(loss, np.float64))
        gn = np.asarray(1.0 if grad_norm is None else grad_norm, np.float64)  # None: not dead
        high = self.high_loss(loss)
        if self.first is None:
            self.first, self.best = loss.copy(), loss.copy()
            self.high = self.dead = np.zeros(loss.shape, int)  # replaced, never updated in place
            self.since = np.full(loss.shape, step)
        dead = (gn == 0) & (loss > 0)
        self.since = np.where((self.high == 0) & (self.dead == 0), step, self.since)
        self.high, self.dead = np.where(high, self.high + 1, 0), np.where(dead, self.dead + 1, 0)
        self.best = np.minimum(self.best, loss)
        healthy = not bool(np.any(high | dead | ~np.isfinite(gn)))
        for s in range(loss.size) if self.enabled else ():
            seed = f" (seed index {s})" if loss.size > 1 else ""
            if self.high[s] >= self.patience:
                return healthy, (
                    f"training diverged at step {step}{seed}: loss {loss[s]:.4g} nats exceeds "
                    f"{self.loss_factor:g} x its running minimum {self.best[s]:.4g} (and its "
                    f"first value {self.first[s]:.4g}) at {self.high[s]} consecutive train "
                    f"records since step {self.since[s]}"
                )
            if self.dead[s] >= self.patience:
                return healthy, (
                    f"training is stuck at step {step}{seed}: the gradient norm is exactly 0 "
                    f"with loss {loss[s]:.4g} nats at {self.dead[s]} consecutive train records "
                    f"since step {self.since[s]}"
                )
        return healthy, None


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix[:-1]: d}
    return {k: v for key, sub in d.items() for k, v in _flat(sub, f"{prefix}{key}.").items()}


def _covered(field: str, names: Any) -> bool:
    return any(field == n or field.startswith(n + ".") for n in names)


def check_resume(
    saved: dict, current: dict, *, step: int, checkpoint: str, allow_changed: Any = ()
) -> tuple[dict, dict]:
    """The resume contract between the checkpoint's JSON config ``saved`` and ``current``.

    Fields outside ``RESUME_FREE`` must be equal unless named (or their group) in
    ``allow_changed``; ``steps`` may not drop below the checkpoint's ``step``. Returns
    ``(allowed, free)``, the permitted and the ``RESUME_FREE`` changes, ``{field: [old, new]}``.

    Raises:
      ValueError: an ``allow_changed`` name that is no config field; ``steps`` below
        ``step``; or changed fields, each with both values and how to allow it.
    """
    a, b, absent = _flat(saved), _flat(current), "<absent>"  # a field missing on one side
    fields = sorted(set(a) | set(b))
    unknown = [n for n in allow_changed if not any(_covered(f, [n]) for f in fields)]
    if unknown:
        raise ValueError(
            f"--allow-changed {', '.join(unknown)}: no such config field (fields look like "
            "optimizer.lr, data.batch_size)"
        )
    steps = current.get("steps")
    if isinstance(steps, int) and steps < step:
        raise ValueError(
            f"config.steps={steps} is smaller than the step of the checkpoint being resumed "
            f"({step}, {checkpoint}); pass --config.steps >= {step}"
        )
    changes = {k: [a.get(k, absent), b.get(k, absent)] for k in fields
               if a.get(k, absent) != b.get(k, absent)}  # fmt: skip
    free = {k: v for k, v in changes.items() if _covered(k, RESUME_FREE)}
    allowed = {k: v for k, v in changes.items() if k not in free}
    refused = {k: v for k, v in allowed.items() if not _covered(k, allow_changed)}
    if refused:
        listing = "; ".join(
            f"{k}: {v[0]!r} in the checkpoint, {v[1]!r} now" for k, v in refused.items()
        )
        raise ValueError(
            f"resuming {checkpoint} with a config that changes what the run computes ({listing}); "
            f"restore those values, or pass --allow-changed {','.join(refused)} to change "
            "them on purpose (recorded in metrics.jsonl)"
        )
    return allowed, free


def _contract(guard: RunGuard, ckpt: Any, meta: dict, changes: dict):
    """``accept(step, extra)`` for ``restore_intact``: ``meta`` must equal the checkpoint's
    ``task_meta``, then :func:`check_resume`."""
    current = json.loads(guard.config.to_json_best_effort())

    def accept(step: int, extra: dict) -> dict:
        for key, value in meta.items():  # layout fields: a conversion, not a flag
            saved = (extra.get("task_meta") or {}).get(key, value)
            if saved != value:
                raise ValueError(
                    f"checkpoint {ckpt.path(step)} was written with config.{key}={saved!r}, "
                    f"this run has {value!r}: the parameter layouts differ (convert with "
                    "amemory.models.transformer.stack_layers / unstack_layers)"
                )
        changes["allowed"], changes["free"] = check_resume(
            extra.get("config") or {}, current, step=step,
            checkpoint=str(ckpt.path(step)), allow_changed=guard.allow_changed,
        )  # fmt: skip
        return changes["allowed"]

    return accept


def _say(text: str) -> None:
    print(f"amemory train: {text}", file=sys.stderr, flush=True)


def process_count() -> int:
    """``jax.process_count()``; ValueError naming ``JAX_PLATFORMS`` if its backend cannot start."""
    import jax

    try:
        return jax.process_count()
    except RuntimeError as e:
        raise ValueError(
            f"JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS', '')!r}: {str(e).splitlines()[0]}"
        ) from None


def _no_checkpoint(workdir: pathlib.Path, ckpt: Any, is_main: bool) -> None:
    """``--resume`` found no checkpoint: a note when ``workdir`` records no training, else a
    ValueError naming what it holds and the way out, touching nothing."""
    log, rejected = workdir / "metrics.jsonl", pathlib.Path(f"{ckpt.directory}-rejected")
    held = [f"{log} records training steps"] if log.is_file() and (
        b'"kind": "train"' in log.read_bytes()) else []  # fmt: skip
    if rejected.is_dir() and any(rejected.iterdir()):
        held.append(f"{rejected} holds checkpoints moved aside")
    killed = (f" (the run was killed while writing its first one: {', '.join(ckpt.unfinished)} "
              "was never finished and is removed)") if ckpt.unfinished else ""  # fmt: skip
    if held:
        raise ValueError(
            f"--resume: no checkpoint in {ckpt.directory}{killed}, but {' and '.join(held)}; "
            "starting again at step 0 would overwrite that log: move a checkpoint back, "
            f"move those files away (mv {log} {log}.old), or choose another --workdir"
        )
    if is_main:
        _say(f"note: --resume found no checkpoint in {ckpt.directory}; starting at step 0")


def _newest_healthy(ckpt: Any, healthy_through: int | None) -> tuple[str, int | None]:
    """``(text naming the newest healthy checkpoint, its step or None)``; newer ones move aside."""
    ckpt.wait()
    h, steps = healthy_through, ckpt.all_steps()
    good = max((s for s in steps if h is not None and s < h), default=None)
    if good is None and not steps:
        return "no checkpoint on disk", None
    if good is None:
        return (f"no checkpoint on disk is confirmed healthy (the newest, {ckpt.path(steps[-1])}, "
                "has no healthy train record after it)"), None  # fmt: skip
    why = f"written after the newest healthy checkpoint ({good}) and before a stop"
    moved = ckpt.reject([s for s in steps if s > good], why)
    where = f"newest healthy checkpoint: {ckpt.path(good)}"
    if moved:
        where += f" (newer unconfirmed ones moved to {moved[0].parent}; --resume continues from it)"
    return where, good


class RunGuard:
    """This module's policy for one run: ``with RunGuard(config, workdir, allow_changed) as g:``.

    Entering takes the workdir lock and installs the stop signals; leaving undoes both, and
    raises ``RunInterrupted`` when a signal arrived after the last step's check.

    Raises:
      ValueError: ``JAX_PLATFORMS`` names a backend this host cannot start. On enter:
        ``WorkdirBusyError`` (another run holds the workdir), ``OSError`` (not writable).
    """

    def __init__(self, config: Any, workdir: str | os.PathLike, allow_changed: Any = ()):
        self.config, self.allow_changed = config, tuple(allow_changed)
        self.workdir = pathlib.Path(workdir).absolute()
        self.processes = process_count()
        div = config.get("divergence", None)  # enabled, loss_factor, patience
        self.monitor = DivergenceMonitor(**(div.to_dict() if div is not None else {}))
        self._lock = WorkdirLock(self.workdir, processes=self.processes)
        self._signals = StopSignals(enabled=self.processes == 1)
        self._pending: list[tuple[int, dict]] = []  # events waiting for metrics.jsonl
        self._log = self._ckpt = None
        self.healthy_through: int | None = None  # newest step whose train record was healthy
        self._last_record: int | None = None  # step of the newest train record

    def __enter__(self) -> RunGuard:
        self._lock.acquire_everywhere()
        self._signals.__enter__()
        return self

    def __exit__(self, kind: Any, *exc: Any) -> None:
        self._signals.__exit__()
        self._lock.release()
        late = self._signals.requested if kind is None and self._ckpt is not None else None
        if late:  # a signal in the last step or the end phase: the run is complete and saved
            step = self._ckpt.latest_step() or 0
            raise RunInterrupted(late, step, str(self._ckpt.path(step)), finished=True)

    def restore(self, ckpt: Any, target: Any, *, data=False, meta=None, fresh=None) -> tuple:
        """``ckpt.restore_intact`` with the resume contract: ``(step, state, extra, position)``;
        rejections, config changes and notes go to stderr and the log. Raises ValueError."""
        changes: dict = {}
        accept = _contract(self, ckpt, meta or {}, changes)
        found = ckpt.restore_intact(target, data=data, accept=accept, fresh=fresh)
        warnings = [(f"checkpoint {moved.name} was damaged ({why}); moved to {moved}",
                     {"event": "checkpoint_rejected", "checkpoint": str(moved), "reason": why})
                    for moved, why in found.skipped]  # fmt: skip
        warnings += [(note, {"event": "restore_note", "note": note}) for note in found.notes]
        for text, event in warnings:  # on stderr now, in metrics.jsonl once it is open
            if self._lock.is_main:
                _say(f"warning: {text}")
            self._pending.append((found.step, event))
        if changes["allowed"] or changes["free"]:
            event = {"event": "config_changed", "allowed": changes["allowed"]}
            self._pending.append((found.step, event | {"bookkeeping": changes["free"]}))
        h = found.extra.get("healthy_through")
        self.healthy_through = int(h) if h is not None else None
        self._last_record = found.step  # h == step: the record of the saved step was healthy
        return found.step, found.state, found.extra, found.data

    def resume_without_checkpoint(self, ckpt: Any) -> None:
        _no_checkpoint(self.workdir, ckpt, self._lock.is_main)

    def attach(self, ckpt: Any, log: Any) -> None:
        """Bind the run's Checkpointer and metrics log; write the events gathered so far."""
        self._ckpt, self._log = ckpt, log
        for step, fields in self._pending:
            log.write("event", step, **fields)
        self._pending.clear()

    def fail(self, error: type, step: int, what: str, event: dict) -> NoReturn:
        """Log ``event`` and raise ``error``: ``what`` and the newest healthy checkpoint."""
        where, good = _newest_healthy(self._ckpt, self.healthy_through)
        if self._log is not None:
            healthy = str(self._ckpt.path(good)) if good is not None else None
            self._log.write("event", step, **event, healthy_checkpoint=healthy)
        raise error(f"{what}; {where}")

    def confirm_by_failed_step(self, step: int, loss: Any) -> None:
        """``step`` failed: checkpoints before it are healthy when its ``loss`` (per seed) is
        finite and not high and the last train record was healthy."""
        ok = np.all(np.isfinite(loss)) and not np.any(self.monitor.high_loss(loss))
        if ok and self.healthy_through is not None and self.healthy_through == self._last_record:
            self.healthy_through = int(step)

    def check_finite(self, step: int, loss: Any) -> None:
        """``NonFiniteLossError`` on a NaN/inf loss (any seed)."""
        loss = np.asarray(loss)
        if not np.all(np.isfinite(loss)):
            values = [x if math.isfinite(x) else None for x in np.atleast_1d(loss).tolist()]
            self.fail(NonFiniteLossError, step, f"non-finite training loss {loss.tolist()} at "
                      f"step {step}", {"event": "nonfinite", "loss": values})  # fmt: skip

    def observe_log(self, step: int, loss: Any, grad_norm: Any = None) -> None:
        """One train record: mark health; ``NonFiniteLossError`` or ``DivergenceError``."""
        self.check_finite(step, loss)
        healthy, message = self.monitor.observe(step, loss, grad_norm)
        self._last_record = int(step)
        self.healthy_through = int(step) if healthy else self.healthy_through
        if message:
            self.fail(DivergenceError, step, message + " (config.divergence sets the test)",
                      {"event": "diverged", "message": message})  # fmt: skip

    def save(self, ckpt: Any, step: int, state: Any, extra: dict, data=None) -> None:
        """``ckpt.save`` that never writes NaN/inf: ``NonFiniteLossError`` naming the leaves."""
        from amemory.train.integrity import NonFiniteStateError

        try:
            ckpt.save(step, state, {**extra, "healthy_through": self.healthy_through}, data)
        except NonFiniteStateError as e:
            self.fail(NonFiniteLossError, step, str(e), {"event": "nonfinite", "state": e.counts})

    def stop_requested(self, step: int) -> bool:
        """Whether to save ``step`` and stop: a signal, or JAX's preemption sync point (several
        processes). ``CheckpointWriteError``: an asynchronous save failed."""
        if self._ckpt is not None:
            self._ckpt.check_errors()  # a background save that failed: report it now
            if self.processes > 1 and self._ckpt.reached_preemption(step):
                self._signals.requested = "preemption"
        return self._signals.requested is not None

    def stop(self, ckpt: Any, step: int) -> NoReturn:
        """After ``step`` was logged and saved: wait, log ``stopped``, raise ``RunInterrupted``."""
        ckpt.wait()
        reason, path = self._signals.requested or "preemption", str(ckpt.path(step))
        if self._log is not None:
            self._log.write("event", step, event="stopped", reason=reason, checkpoint=path)
        self._signals.requested = None  # reported here, not again on exit
        raise RunInterrupted(reason, step, path)
