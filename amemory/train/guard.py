"""Run guards: preemption, the workdir lock, divergence, non-finite stops, the resume contract.

One :class:`RunGuard` wraps a training run (``amemory.train.loop.run``) and the loop
calls it at a few points; everything here works when the loop fetches metrics to
the host only at log steps:

  ``g.restore(ckpt, target)``        newest intact checkpoint that passes the resume
                                     contract (``check_resume``), judged before reading
  ``g.attach(ckpt, log)``            once metrics.jsonl is open: writes pending events
  ``g.check_finite(step, loss)``     wherever the loss reaches the host (NaN/inf -> stop)
  ``g.fail(error, step, what, ev)``  any other stop: names the newest healthy checkpoint
  ``g.observe_log(step, loss, gn)``  at each train record: divergence test, health marks
  ``g.save(ckpt, step, state, ex)``  every checkpoint save (never writes NaN/inf)
  ``g.stop_requested(step)``         after every step: SIGTERM/SIGINT/preemption notice
  ``g.stop(ckpt, step)``             after the loop saved that step: "stopped" event, raise

The guarantees (stop signals, preemption on several hosts, the lock, healthy checkpoints)
are README's "Reliability" table, each with its test. A checkpoint is *healthy* when a
train record after it had a finite loss the divergence test did not flag, or the step that
failed after it had such a loss (computed on the checkpoint's parameters) after a healthy
record; non-finite and divergence stops name the newest healthy one and move newer ones to
``checkpoints-rejected/``. Multi-process runs leave SIGTERM to JAX's preemption service
(Orbax ``CheckpointManager.reached_preemption``: every host stops at the same step).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import pathlib
import signal
import sys
import threading
from typing import Any, NoReturn

import numpy as np

from amemory.train.lock import WorkdirBusyError, WorkdirLock, busy_message, holder_info

# Exit statuses of ``amemory train`` (README, "Reliability").
EXIT_NONFINITE = 1
EXIT_CONFIG = 2  # bad config, bad data, unwritable workdir, resume contract
EXIT_DIVERGED = 3
EXIT_PREEMPTED = 75  # SIGTERM / preemption notice: sysexits.h EX_TEMPFAIL, "retry later"
EXIT_INTERRUPTED = 130  # SIGINT: 128 + 2, the shell's convention for Ctrl-C

# Config fields that may differ on resume (they change what is logged or how it runs, not
# what is computed). A dotted prefix covers its whole group. Everything else must match.
RESUME_FREE = (
    "steps",
    "log_every",
    "eval_every",
    "spectrum_every",
    "spectrum_roles",
    "checkpoint_every",
    "keep_checkpoints",
    "progress",
    "parallel",
    "divergence",
    "optimizer.diagnostics",
    "data.eval_batches",
    "data.n_buckets",
    "data.biographies.eval_per_group",
)


class NonFiniteLossError(RuntimeError):
    """The training loss (or the state to be saved) became NaN or infinite; the message names
    the step and the newest healthy checkpoint."""

    exit_code = EXIT_NONFINITE


class DivergenceError(RuntimeError):
    """The divergence test fired (``config.divergence``); the message says which rule and where."""

    exit_code = EXIT_DIVERGED


class RunInterrupted(KeyboardInterrupt):
    """The run stopped on SIGTERM/SIGINT/preemption after saving; ``--resume`` continues it.

    A ``KeyboardInterrupt``, so that callers' ``except Exception`` blocks (``amemory
    reproduce`` records a failed stage and goes on) do not swallow a stop request.

    Attributes:
      reason: ``"SIGTERM"``, ``"SIGINT"`` or ``"preemption"``.
      step: the step saved.
      checkpoint: its directory.
      exit_code: ``EXIT_INTERRUPTED`` for SIGINT, else ``EXIT_PREEMPTED``.
    """

    def __init__(self, reason: str, step: int, checkpoint: str):
        self.reason, self.step, self.checkpoint = reason, int(step), checkpoint
        self.exit_code = EXIT_INTERRUPTED if reason == "SIGINT" else EXIT_PREEMPTED
        super().__init__(
            f"stopped by {reason} after step {step}; checkpoint {checkpoint} saved; "
            "continue with --resume"
        )


def exit_code(error: BaseException) -> int:
    """``amemory train``'s exit status for an exception raised by ``train``: its class's
    ``exit_code``, else ``EXIT_CONFIG``."""
    return getattr(error, "exit_code", EXIT_CONFIG)


@contextlib.contextmanager
def held_background_errors() -> Any:
    """Hold ERROR logs and unraisable exceptions of background threads while a run lasts.

    For ``amemory train``: a failed Orbax save (a full disk) makes its writer threads log
    tracebacks (absl) and TensorStore leave "Event loop is closed" errors to
    ``sys.unraisablehook`` before the main thread raises the same error. They are dropped
    when the run fails (the CLI reports it in one line) and replayed when it does not.
    """
    held_logs: list = []
    held_unraisable: list = []

    class _Hold(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if record.levelno >= logging.ERROR:
                held_logs.append(record)
                return False
            return True

    absl_logger, hold = logging.getLogger("absl"), _Hold()
    previous_hook = sys.unraisablehook
    absl_logger.addFilter(hold)
    sys.unraisablehook = held_unraisable.append
    failed = True
    try:
        yield
        failed = False
    finally:
        absl_logger.removeFilter(hold)
        sys.unraisablehook = previous_hook
        if not failed:
            for record in held_logs:
                absl_logger.handle(record)
            for args in held_unraisable:
                previous_hook(args)


class StopSignals:
    """SIGTERM / SIGINT handlers that only set a flag (restored on exit).

    Installed from the main thread of a single-process run; elsewhere (a worker
    thread, or a multi-process run where JAX's preemption service owns SIGTERM)
    nothing is installed and ``requested`` stays None. After the first signal a
    second SIGINT raises ``KeyboardInterrupt`` at once (the user insists).
    """

    def __init__(self, enabled: bool = True):
        self.requested: str | None = None
        self._enabled = enabled and threading.current_thread() is threading.main_thread()
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested is None:
            self.requested = signal.Signals(signum).name
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def __enter__(self) -> StopSignals:
        if self._enabled:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


class DivergenceMonitor:
    """The divergence test on the losses and gradient norms of train records.

    Per seed, at each train record (loss ``L``, global gradient norm ``g``):

    * *high*: ``L > loss_factor * m`` and ``L > L_0``, where ``m`` is the smallest
      loss of the earlier records and ``L_0`` the first one. The second condition
      keeps a sampled loss that has dropped near zero (a memorised task: minimum
      0.005, typical 0.1) from counting as divergence; a blow-up passes both.
    * *dead*: ``g == 0`` exactly and ``L > 0``: no parameter can move again, though
      the loss is not zero (a loss of exactly 0 with a zero gradient is convergence).

    The run diverged when a seed is high, or dead, at ``patience`` consecutive records.
    (A stop on a loss far above its best, as loss-spike guards in large-model training
    do; big_vision stops on a non-finite loss only. The thresholds are ours.)
    A record is *healthy* when no seed is high or dead and every gradient norm is finite.

    Args:
      loss_factor: the multiple of the running minimum, > 1.
      patience: consecutive records, >= 1.
      enabled: False turns the test off (``observe`` still reports health).
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
        """Take one train record; return ``(healthy, divergence message or None)``.

        Args:
          step: the record's step.
          loss: scalar or ``[S]`` (seeds) finite losses, nats.
          grad_norm: same shape, global L2 gradient norms (None: the dead test is skipped).
        """
        loss = np.atleast_1d(np.asarray(loss, np.float64))
        gn = None if grad_norm is None else np.atleast_1d(np.asarray(grad_norm, np.float64))
        high = self.high_loss(loss)
        if self.first is None:
            self.first, self.best = loss.copy(), loss.copy()
            self.high = self.dead = np.zeros(loss.shape, int)  # replaced, never updated in place
            self.since = np.full(loss.shape, step)
        dead = (gn == 0) & (loss > 0) if gn is not None else np.zeros(loss.shape, bool)
        streak_start = (self.high == 0) & (self.dead == 0)
        self.since = np.where(streak_start, step, self.since)
        self.high = np.where(high, self.high + 1, 0)
        self.dead = np.where(dead, self.dead + 1, 0)
        self.best = np.minimum(self.best, loss)
        blown = ~np.isfinite(gn) if gn is not None else np.zeros(loss.shape, bool)
        healthy = not bool(np.any(high | dead | blown))
        if not self.enabled:
            return healthy, None
        for s in range(loss.size):
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
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}."))
    return out


def _covered(field: str, names: Any) -> bool:
    return any(field == n or field.startswith(n + ".") for n in names)


def config_changes(saved: dict, current: dict) -> dict[str, tuple[Any, Any]]:
    """``{field: (saved value, current value)}`` for every leaf field that differs.

    Both configs are JSON dicts (``json.loads(config.to_json_best_effort())``); a
    field missing on one side shows as ``"<absent>"``.
    """
    a, b = _flat(saved), _flat(current)
    absent = "<absent>"
    return {
        k: (a.get(k, absent), b.get(k, absent))
        for k in sorted(set(a) | set(b))
        if a.get(k, absent) != b.get(k, absent)
    }


def check_resume(
    saved: dict, current: dict, *, step: int, checkpoint: str, allow_changed: Any = ()
) -> tuple[dict, dict]:
    """The resume contract: what may differ between a checkpoint's config and the new one.

    Fields that change what a run computes (model, data, optimizer, schedule, batch,
    seeds: everything outside ``RESUME_FREE``) must be equal, unless listed in
    ``allow_changed`` (a field or a group prefix). ``steps`` may grow but not drop
    below the checkpoint's step.

    Args:
      saved / current: JSON config dicts of the checkpoint and of this run.
      step: the checkpoint's step; checkpoint: its path (for messages).
      allow_changed: field names (dotted) the user changes on purpose.

    Returns:
      ``(allowed, free)``: the changes permitted by ``allow_changed`` and the changes of
      ``RESUME_FREE`` fields, each ``{field: [old, new]}`` (for the metrics event).

    Raises:
      ValueError: an ``allow_changed`` name that is no config field; ``steps`` below
        ``step``; or changed fields, each with both values and how to allow it.
    """
    fields = set(_flat(saved)) | set(_flat(current))
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
    changes = config_changes(saved, current)
    free = {k: list(v) for k, v in changes.items() if _covered(k, RESUME_FREE)}
    allowed = {k: list(v) for k, v in changes.items() if k not in free}
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


def _say(text: str) -> None:
    sys.stderr.write(f"amemory train: {text}\n")
    sys.stderr.flush()


class RunGuard:
    """Everything of this module for one run: use as ``with RunGuard(...) as g:``.

    Entering takes the workdir lock (process 0; every process learns the outcome)
    and installs the stop signals; leaving undoes both.

    Args:
      config: the run ConfigDict (``divergence``: ``enabled``, ``loss_factor``, ``patience``).
      workdir: the run directory.
      allow_changed: fields the resume contract lets differ (``--allow-changed``).

    Raises (on enter):
      WorkdirBusyError: another run holds the workdir.
      OSError: the workdir cannot be created or written.
    """

    def __init__(self, config: Any, workdir: str | os.PathLike, allow_changed: Any = ()):
        import jax

        self.config, self.allow_changed = config, tuple(allow_changed)
        self.workdir = pathlib.Path(workdir).absolute()
        self.processes, self.is_main = jax.process_count(), jax.process_index() == 0
        div = config.get("divergence", None)  # enabled, loss_factor, patience
        self.monitor = DivergenceMonitor(**(div.to_dict() if div is not None else {}))
        self._lock = WorkdirLock(self.workdir, processes=self.processes)
        self._signals = StopSignals(enabled=self.processes == 1)
        self._stack = contextlib.ExitStack()
        self._pending: list[tuple[int, dict]] = []
        self._log: Any = None
        self._ckpt: Any = None
        self.healthy_through: int | None = None  # newest step whose train record was healthy
        self._last_record: int | None = None  # step of the newest train record

    def __enter__(self) -> RunGuard:
        error: BaseException | None = None
        if self.is_main:
            try:
                self._stack.enter_context(self._lock)
            except (WorkdirBusyError, OSError) as e:
                error = e
        if self.processes > 1:
            from jax.experimental import multihost_utils

            ok = multihost_utils.broadcast_one_to_all(np.int32(error is None))
            if not int(ok) and error is None:
                error = WorkdirBusyError(busy_message(self.workdir, holder_info(self._lock.path)))
        if error is not None:
            self._stack.close()
            raise error
        self._stack.enter_context(self._signals)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()

    def restore(
        self, ckpt: Any, target: Any, *, data: bool = False, meta: dict | None = None,
        fresh: Any = None,
    ) -> tuple[int, Any, dict, bytes | None]:  # fmt: skip
        """Newest intact checkpoint of ``ckpt`` into ``target``; each candidate's config must
        pass :func:`check_resume` and its ``task_meta`` equal ``meta`` (this run's) before
        any array is read (``fresh``: as ``Checkpointer.restore_intact``).

        Returns ``(step, state, extra, input position or None)`` (``data``: also read the
        input position); damaged checkpoints (``checkpoint_rejected``), config changes
        (``config_changed``) and restore warnings (``restore_note``) are reported on stderr
        and as events.

        Raises:
          ValueError: from ``Checkpointer.restore_intact`` or :func:`check_resume`.
        """
        current = json.loads(self.config.to_json_best_effort())
        changes: dict = {}

        def accept(step: int, extra: dict) -> dict:
            for key, value in (meta or {}).items():  # layout fields: a conversion, not a flag
                saved = (extra.get("task_meta") or {}).get(key, value)
                if saved != value:
                    raise ValueError(
                        f"checkpoint {ckpt.path(step)} was written with config.{key}={saved!r}, "
                        f"this run has {value!r}: the parameter layouts differ (convert with "
                        "amemory.models.transformer.stack_layers / unstack_layers)"
                    )
            changes["allowed"], changes["free"] = check_resume(
                extra.get("config") or {}, current, step=step,
                checkpoint=str(ckpt.path(step)), allow_changed=self.allow_changed,
            )  # fmt: skip
            return changes["allowed"]

        found = ckpt.restore_intact(target, data=data, accept=accept, fresh=fresh)

        def warn(text: str, **event: Any) -> None:  # on stderr now, in metrics.jsonl later
            if self.is_main:
                _say(f"warning: {text}")
            self._pending.append((found.step, event))

        for moved, why in found.skipped:
            warn(f"checkpoint {moved.name} was damaged ({why}); moved to {moved}",
                 event="checkpoint_rejected", checkpoint=str(moved), reason=why)  # fmt: skip
        for note in found.notes:
            warn(note, event="restore_note", note=note)
        allowed, free = changes["allowed"], changes["free"]
        if allowed or free:
            self._pending.append(
                (found.step, {"event": "config_changed", "allowed": allowed, "bookkeeping": free})
            )
        h = found.extra.get("healthy_through")
        self.healthy_through = int(h) if h is not None else None
        self._last_record = found.step  # h == step: the record of the saved step was healthy
        return found.step, found.state, found.extra, found.data

    def resume_without_checkpoint(self, ckpt: Any) -> None:
        """``--resume`` found no checkpoint: a one-line note when the workdir records no
        training (a preemptible loop's first launch), else a ValueError naming what it
        holds (train records, checkpoints moved aside), touching nothing."""
        log = self.workdir / "metrics.jsonl"
        rejected = ckpt.directory.with_name(ckpt.directory.name + "-rejected")
        held = []
        if log.is_file() and b'"kind": "train"' in log.read_bytes():
            held.append(f"{log} records training steps")
        if rejected.is_dir() and any(rejected.iterdir()):
            held.append(f"{rejected} holds checkpoints moved aside")
        if held:
            raise ValueError(
                f"--resume: no checkpoint in {ckpt.directory}, but {' and '.join(held)}; "
                "starting again at step 0 would overwrite that log: move a checkpoint back, "
                "move those files away, or choose another --workdir"
            )
        if self.is_main:
            _say(f"note: --resume found no checkpoint in {ckpt.directory}; starting at step 0")

    def attach(self, ckpt: Any, log: Any) -> None:
        """Bind the run's Checkpointer and metrics log; write the events gathered so far."""
        self._ckpt, self._log = ckpt, log
        for step, fields in self._pending:
            log.write("event", step, **fields)
        self._pending.clear()

    def _healthy_checkpoint(self) -> int | None:
        self._ckpt.wait()
        h = self.healthy_through
        good = [s for s in self._ckpt.all_steps() if h is not None and s < h]
        return max(good) if good else None

    def _describe_healthy(self) -> tuple[str, int | None]:
        """Text naming the newest healthy checkpoint; newer ones are moved aside."""
        good = self._healthy_checkpoint()
        if good is None:
            newest = self._ckpt.latest_step()
            if newest is None:
                return "no checkpoint on disk", None
            return (
                "no checkpoint on disk is confirmed healthy (the newest, "
                f"{self._ckpt.path(newest)}, has no healthy train record after it)"
            ), None
        newer = [s for s in self._ckpt.all_steps() if s > good]
        moved = self._ckpt.reject(
            newer, f"written after the newest healthy checkpoint ({good}) and before a stop"
        )
        text = f"newest healthy checkpoint: {self._ckpt.path(good)}"
        if moved:
            text += (
                f" (newer unconfirmed ones moved to {moved[0].parent}; --resume continues from it)"
            )
        return text, good

    def fail(self, error: type, step: int, what: str, event: dict) -> NoReturn:
        """Log ``event`` (plus the healthy checkpoint) at ``step`` and raise ``error``
        whose message is ``what`` and the newest healthy checkpoint (newer ones are moved
        aside, so ``--resume`` continues from it)."""
        where, good = self._describe_healthy()
        healthy = str(self._ckpt.path(good)) if good is not None else None
        if self._log is not None:
            self._log.write("event", step, **event, healthy_checkpoint=healthy)
        raise error(f"{what}; {where}")

    def confirm_by_failed_step(self, step: int, loss: Any) -> None:
        """A step failed with a non-finite gradient or update: when its ``loss`` (per seed,
        computed on the parameters of ``step - 1``) is finite and not high, and the last
        train record was healthy, checkpoints up to ``step - 1`` count as healthy."""
        ok = np.all(np.isfinite(loss)) and not np.any(self.monitor.high_loss(loss))
        if ok and self.healthy_through is not None and self.healthy_through == self._last_record:
            self.healthy_through = int(step)

    def check_finite(self, step: int, loss: Any) -> None:
        """Stop on a NaN/inf loss (any seed).

        Raises:
          NonFiniteLossError: naming ``step`` and the newest healthy checkpoint.
        """
        loss = np.asarray(loss)
        if np.all(np.isfinite(loss)):
            return
        values = [x if math.isfinite(x) else None for x in np.atleast_1d(loss).tolist()]
        self.fail(
            NonFiniteLossError, step, f"non-finite training loss {loss.tolist()} at step {step}",
            {"event": "nonfinite", "loss": values},
        )  # fmt: skip

    def observe_log(self, step: int, loss: Any, grad_norm: Any = None) -> None:
        """One train record: mark health, and stop when the divergence test fires.

        Raises:
          NonFiniteLossError: the loss is NaN/inf.
          DivergenceError: the message says which rule fired since which step, and
            names the newest healthy checkpoint.
        """
        self.check_finite(step, loss)
        healthy, message = self.monitor.observe(step, loss, grad_norm)
        self._last_record = int(step)
        if healthy:
            self.healthy_through = int(step)
        if message:
            self.fail(
                DivergenceError, step, message + " (config.divergence sets the test)",
                {"event": "diverged", "message": message},
            )  # fmt: skip

    def save(
        self, ckpt: Any, step: int, state: Any, extra: dict, data: bytes | None = None
    ) -> None:
        """``ckpt.save`` (with input position ``data``) that never writes NaN/inf (checked
        on the device first).

        Raises:
          NonFiniteLossError: the state holds NaN/inf (names the leaves; nothing written).
        """
        from amemory.train.checkpoint import NonFiniteStateError

        try:
            ckpt.save(step, state, {**extra, "healthy_through": self.healthy_through}, data)
        except NonFiniteStateError as e:
            self.fail(NonFiniteLossError, step, str(e), {"event": "nonfinite", "state": e.counts})

    def stop_requested(self, step: int) -> bool:
        """True when the run should save ``step`` and stop (call after every step).

        Single process: a SIGTERM/SIGINT arrived. Several processes: JAX's preemption
        service reached its sync point at ``step`` on every host (the same step on all).

        Raises:
          CheckpointWriteError: an asynchronous save finished since the last step and
            failed (reported at the step it is noticed, not at the next save).
        """
        if self._ckpt is not None:
            self._ckpt.check_errors()  # a background save that failed: report it now
        if self._signals.requested is not None:
            return True
        if self.processes > 1 and self._ckpt is not None:
            if self._ckpt.reached_preemption(step):
                self._signals.requested = "preemption"
                return True
        return False

    def stop(self, ckpt: Any, step: int) -> NoReturn:
        """After the loop wrote the metrics of ``step`` and saved it: wait for the save,
        log a ``stopped`` event, raise.

        Raises:
          RunInterrupted: always (``amemory train`` exits 75 or 130 with its one line).
        """
        ckpt.wait()
        reason = self._signals.requested or "preemption"
        path = str(ckpt.path(step))
        if self._log is not None:
            self._log.write("event", step, event="stopped", reason=reason, checkpoint=path)
        raise RunInterrupted(reason, step, path)
