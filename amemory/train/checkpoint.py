"""Checkpoints: an Orbax ``CheckpointManager`` with digests and a verified, fail-safe restore.

A step holds ``state`` (the ``TrainState``), ``extra`` (JSON: config, ``task_meta``, the
digest of :mod:`amemory.train.integrity`) and ``data`` (the Grain position after the saved
step's batch, one file per process). Orbax saves asynchronously and atomically (a
``<step>.orbax-checkpoint-tmp`` directory, then a rename); multi-process runs call every
method on every process.
"""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import tempfile
from typing import Any, NamedTuple

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp

from amemory.train import noise
from amemory.train import state as state_lib
from amemory.train.integrity import (  # noqa: F401 - the names callers import from here
    CorruptCheckpointError,
    NonFiniteStateError,
    leaf_names,
    record,
    reject,
    verify,
)  # fmt: skip

TMP_SUFFIX = ".orbax-checkpoint-tmp"  # Orbax's unfinished step directories: <step><suffix>*


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (full disk, read-only file system); names the directory."""


class IncompatibleCheckpointError(ValueError):
    """A checkpoint this run refuses (leaves that do not fit, the resume contract); not moved."""


class Restored(NamedTuple):
    """:meth:`Checkpointer.restore_intact`'s result; ``skipped``: ``[(moved to, reason)]``."""

    step: int
    state: state_lib.TrainState
    extra: dict
    skipped: list
    data: bytes | None = None
    notes: tuple = ()


def _first_line(e: BaseException, tail: bool = False) -> str:
    """``Type: first line of the message`` without TensorStore's spec dump, at most 240 chars
    (``tail``: the end of a long line, where TensorStore puts the OS error)."""
    text = str(e).split(" See full TensorStore details")[0].strip().splitlines()
    line = f"{type(e).__name__}: {text[0] if text else ''}"
    if len(line) <= 240:
        return line
    return "..." + line[-237:] if tail else line[:237] + "..."


def _manager(directory: pathlib.Path, read_only: bool = False, **options) -> ocp.CheckpointManager:
    handlers = {  # built per manager: handlers touch the JAX backend
        "state": ocp.StandardCheckpointHandler(),
        "extra": ocp.JsonCheckpointHandler(),
        "data": grain.checkpoint.CheckpointHandler(),
    }
    options = ocp.CheckpointManagerOptions(create=not read_only, read_only=read_only, **options)
    return ocp.CheckpointManager(directory, options=options, item_handlers=handlers)


class Checkpointer:
    """Orbax ``CheckpointManager`` for ``TrainState`` + JSON extras; the manager's own methods
    (``latest_step``, ``all_steps``, ``reached_preemption``) are reached through it.
    ``unfinished`` names the unfinished step directories found (and removed) at start.

    Raises:
      CheckpointWriteError: ``directory`` cannot be created or written, before training.
    """

    def __init__(self, directory: str | pathlib.Path, *, max_to_keep: int = 3, async_save=True):
        self.directory = pathlib.Path(directory).absolute()
        with _writing(self.directory):
            self.directory.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=self.directory).close()  # writable, or fail now
        self.unfinished = sorted(p.name for p in self.directory.glob(f"*{TMP_SUFFIX}*"))
        for name in self.unfinished if jax.process_index() == 0 else ():
            shutil.rmtree(self.directory / name)  # a save killed before Orbax renamed it
        self._unconfirmed = False  # an asynchronous save whose outcome is not yet known
        options = {"max_to_keep": max_to_keep, "enable_async_checkpointing": async_save}
        self._manager = _manager(self.directory, **options)

    def __getattr__(self, name: str) -> Any:
        if name == "_manager":  # not yet set (failed __init__)
            raise AttributeError(name)
        return getattr(self._manager, name)

    def path(self, step: int) -> pathlib.Path:
        """Directory of checkpoint ``step``."""
        return self.directory / str(step)

    def save(self, step: int, state: Any, extra: dict, data: bytes | None = None) -> None:
        """Start saving ``state``, JSON ``extra`` (plus its digest) and this process's input
        position ``data`` (or None) as ``step``; arrays are written in the background.

        Raises:
          NonFiniteStateError: ``state`` holds NaN/inf (nothing is written).
          CheckpointWriteError: this save, or the previous asynchronous one, failed to write.
        """
        extra = {**extra, "integrity": record(state, step)}
        items = {"state": ocp.args.StandardSave(state), "extra": ocp.args.JsonSave(extra)}
        if data is not None:
            items["data"] = grain.checkpoint.CheckpointSave(_InputState(data))
        with _writing(self.directory):
            self._manager.save(int(step), args=ocp.args.Composite(**items))
        self._unconfirmed = True

    def extra(self, step: int) -> dict:
        """The JSON ``extra`` item of ``step`` (config, task_meta, ...), without the arrays."""
        items = {"extra": ocp.args.JsonRestore()}
        if _has_input_state(self.path(step)):  # read too, so Orbax does not warn about it
            items["data"] = grain.checkpoint.CheckpointRestore(_InputState(None))
        return dict(self._manager.restore(int(step), args=ocp.args.Composite(**items))["extra"])

    def reject(self, steps: list[int], reason: str) -> list[pathlib.Path]:
        """Move the given steps to ``<directory>-rejected/`` with REASON.txt; the new paths."""
        self.wait()
        moved = []
        for step in (s for s in steps if s in self.all_steps()):
            moved.append(reject(self.path(step), reason, move=jax.process_index() == 0))
            _all_agree(True)  # a barrier: the move is done before any process reloads
            self._manager.reload()
        return moved

    def restore_intact(
        self, target: Any, *, data: bool = False, accept: Any = None, fresh: Any = None
    ) -> Restored:
        """Restore the newest checkpoint that reads back intact, rejecting newer damaged ones.

        From the newest step down, ``accept`` and the recorded leaves judge a step before its
        arrays are read (a refusal moves nothing); a step is moved aside only on proven
        damage (it fails to read also as stored, its digest differs, NaN/inf).

        Args:
          target: ``TrainState`` of arrays or ``jax.ShapeDtypeStruct`` (with shardings).
          data: also read this process's input position (a step without one is damaged).
          accept: ``(step, extra) -> {field: [old, new]}``, the allowed config changes
            (``ValueError`` refuses). An allowed ``*dtype`` field lets leaves be cast; an
            allowed ``optimizer.*`` field takes the optimizer state from ``fresh()`` (a
            fresh ``TrainState``), its ``count`` leaves set to the step.

        Raises:
          ValueError: refused by ``accept``; the newest readable checkpoint does not fit
            ``target`` (names the leaf); or no checkpoint is intact (lists the reasons).
        """
        skipped: list[tuple[pathlib.Path, str]] = []
        for step in sorted(self.all_steps(), reverse=True):
            reason = None
            with noise.held(fd=True) as hold:  # a failed read's threads print ~150 lines
                try:
                    found = _read_checked(self, step, target, data, accept, fresh)
                except IncompatibleCheckpointError:
                    hold.replay = True
                    raise  # the checkpoint reads fine (or was not read); the config does not fit
                except Exception as e:  # noqa: BLE001 - damaged only if a plain re-read says so
                    reason = _diagnose(self._manager, step, e)
                    hold.replay = reason is None
                    if reason is None:
                        raise IncompatibleCheckpointError(
                            f"checkpoint {self.path(step)} reads back intact but cannot be "
                            f"restored into this run ({_first_line(e)}); nothing was moved"
                        ) from e
            if _all_agree(reason is None):
                return Restored(step, found[0], found[1], skipped, found[2], tuple(found[3]))
            reason = reason or "damaged on another process"
            skipped.append((self.reject([step], reason)[0], reason))
        if skipped:
            listing = "; ".join(f"{p}: {r}" for p, r in skipped)
            raise ValueError(f"no intact checkpoint in {self.directory} (rejected {listing})")
        raise ValueError(f"no checkpoint in {self.directory}")

    def check_errors(self) -> None:
        """Raise the ``CheckpointWriteError`` of a finished asynchronous save that failed
        (does not block; single-process runs only)."""
        if jax.process_count() == 1 and self._unconfirmed:
            if not self._manager.is_saving_in_progress():
                self._unconfirmed = False
                self.wait()  # finished: returns at once, raising the save's error if it failed

    def wait(self) -> None:
        """Block until pending saves are on disk (``CheckpointWriteError`` if one failed)."""
        with _writing(self.directory):
            self._manager.wait_until_finished()

    def close(self) -> None:
        """Finish pending saves and release the manager (raises as :meth:`wait`)."""
        try:
            self.wait()
        finally:
            self._manager.close()


@contextlib.contextmanager
def _writing(directory: pathlib.Path):
    """Report a failed write (TensorStore raises ValueError) as ``CheckpointWriteError``."""
    try:
        yield
    except (NonFiniteStateError, CheckpointWriteError):
        raise
    except (OSError, ValueError, RuntimeError) as e:
        raise CheckpointWriteError(
            f"cannot write a checkpoint in {directory}: {_first_line(e, tail=True)}"
        ) from e


def _diagnose(manager: ocp.CheckpointManager, step: int, error: Exception) -> str | None:
    """Why ``step`` is damaged given its restore's ``error``, or None when a plain re-read
    (as stored, digest checked) succeeds."""
    if isinstance(error, CorruptCheckpointError):
        return str(error)
    try:
        verify(*_read_as_stored(manager, step)[:2])
    except Exception as e:  # noqa: BLE001 - the plain read fails too: damage
        return _first_line(e)
    return None


def _compare(saved: dict, target: Any, where: pathlib.Path, cast: bool, fresh_opt: bool) -> bool:
    """Compare saved leaf metadata with ``target`` by name, shape and dtype (``cast``: any
    dtype; ``fresh_opt``: any difference under ``opt_state``, then True). Raises
    ``IncompatibleCheckpointError`` naming the first differing leaf."""
    problems = []  # (leaf name, how it differs)
    for n, leaf in leaf_names(target).items():
        s, shape, dtype = saved.get(n), tuple(np.shape(leaf)), np.dtype(leaf.dtype)
        if s is None:
            problems.append((n, "is missing; the current model/optimizer needs it"))
        elif tuple(s.shape) != shape:
            problems.append((n, f"has shape {tuple(s.shape)}, but the current "
                             f"model/optimizer expects {shape}"))  # fmt: skip
        elif np.dtype(s.dtype) != dtype and not cast:
            problems.append((n, f"was saved as {np.dtype(s.dtype)}, the current "
                             f"model/optimizer has {dtype}"))  # fmt: skip
    extra = sorted(set(saved) - set(leaf_names(target)))
    problems += [(n, "is not in the current model/optimizer") for n in extra]
    if fresh_opt and all(n.startswith("opt_state.") for n, _ in problems):
        return bool(problems)
    if problems:
        raise IncompatibleCheckpointError(
            f"checkpoint {where}: leaf {problems[0][0]!r} {problems[0][1]}"
        )
    return False


def _read_checked(ckpt: Checkpointer, step: int, target: Any, data: bool, accept, fresh):
    """One step of :meth:`Checkpointer.restore_intact`: ``(state, extra, position, notes)``."""
    extra = ckpt.extra(step)  # unreadable JSON: damaged (the caller catches it)
    try:
        allowed = accept(step, extra) if accept is not None else {}
    except ValueError as e:  # the resume contract: nothing is read or moved
        raise IncompatibleCheckpointError(str(e)) from e
    reset = fresh is not None and any(k.startswith("optimizer.") for k in allowed)
    cast = any(k.endswith("dtype") for k in allowed)
    reset = _compare(_layout(ckpt._manager, step), target, ckpt.path(step), cast, reset)
    if data and not _has_input_state(ckpt.path(step)):
        raise CorruptCheckpointError(
            f"no input position (data/) for process {jax.process_index()} of {jax.process_count()}"
        )
    shardings = {n: x.sharding for n, x in leaf_names(target).items()}
    state, extra, position = _read_as_stored(ckpt._manager, step, shardings.get)
    notes = [] if verify(state, extra) else [
        f"checkpoint {step} has no integrity record (written before digests): its arrays "
        "were checked for NaN/inf only"]  # fmt: skip
    source = leaf_names(state)
    if reset:  # parameters, step and key from the checkpoint, a fresh optimizer state
        for n, x in leaf_names(fresh().opt_state).items():
            fresh_x = x + (source["step"] - x) if n.endswith(".count") else x  # schedules go on
            source["opt_state." + n] = jax.device_put(fresh_x, x.sharding)
        notes.append(
            f"the optimizer state of checkpoint {step} does not fit the changed optimizer: "
            "parameters, step and key restored, optimizer state fresh (moments zero, "
            "schedule counts at the checkpoint's step)"
        )
    flat, treedef = jax.tree_util.tree_flatten(target)
    leaves = [source[n] for n in leaf_names(target)]
    if any(x.dtype != t.dtype for x, t in zip(leaves, flat, strict=True)):
        leaves = [x.astype(t.dtype) for x, t in zip(leaves, flat, strict=True)]
        notes.append(f"checkpoint {step}: leaves cast to this run's dtypes")
    return jax.tree_util.tree_unflatten(treedef, leaves), extra, position, notes


def _all_agree(ok: bool) -> bool:
    """True when ``ok`` holds on every process (one small all-gather when there are several)."""
    if jax.process_count() == 1:
        return ok
    from jax.experimental import multihost_utils

    return bool(np.all(multihost_utils.process_allgather(np.asarray(ok, np.int32))))


def _has_input_state(step_dir: pathlib.Path) -> bool:
    """Whether ``step_dir`` holds this process's input position (Grain's file per process)."""
    i, n = jax.process_index(), jax.process_count()
    return (step_dir / "data" / f"process_{i}-of-{n}.json").is_file()


class _InputState:
    """A Grain iterator state as Grain's Orbax handler wants it (the live iterator is ahead
    by the prefetched batches, so the loop saves the one recorded with the step's batch)."""

    def __init__(self, state: bytes | None):
        self.state = state

    def get_state(self) -> bytes | None:
        return self.state

    def set_state(self, state: bytes) -> None:
        self.state = state

    def start_prefetch(self) -> None:  # called by Grain's restore
        pass


def load_params(directory: str | pathlib.Path, step: int | None = None) -> Any:
    """Parameters of a run's ``checkpoints/`` at ``step`` (None: the latest) as a nested dict
    of numpy arrays, read only; the stored tree (list indices are keys like ``"0"``).

    Raises:
      ValueError: the directory holds no checkpoint (or not ``step``).
    """
    directory = pathlib.Path(directory).absolute()
    if not directory.is_dir():
        raise ValueError(f"no checkpoint in {directory} (no such directory)")
    manager = _manager(directory, read_only=True)
    try:
        steps = manager.all_steps()
        step = manager.latest_step() if step is None else step
        if step not in steps:
            raise ValueError(f"no checkpoint {step} in {directory} (steps: {list(steps)})"
                             if steps else f"no checkpoint in {directory}")  # fmt: skip
        state = _read_as_stored(manager, step)[0]
    finally:
        manager.close()
    return jax.tree.map(np.asarray, state["params"])


def _layout(manager: ocp.CheckpointManager, step: int) -> dict[str, Any]:
    """``{leaf name: array metadata}`` of ``step`` (CorruptCheckpointError when unreadable)."""
    try:
        meta = manager.item_metadata(step)["state"]
    except Exception as e:  # noqa: BLE001 - a missing or unreadable _METADATA file
        raise CorruptCheckpointError(_first_line(e)) from e
    saved = {m.name: m for m in jax.tree.leaves(meta) if hasattr(m, "shape")}
    if not saved:
        raise CorruptCheckpointError(f"no array metadata readable in step {step}")
    return saved


def _read_as_stored(manager: ocp.CheckpointManager, step: int, sharding: Any = None):
    """``(state, extra, input position)`` of ``step`` as stored; leaf ``name`` placed with
    ``sharding(name)``, else like the ``step`` leaf, else on the first local device."""
    dev = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    where = sharding or (lambda name: None)
    other = where("step") or dev
    target = jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=where(m.name) or other),
        dict(manager.item_metadata(step)["state"]),
        is_leaf=lambda m: hasattr(m, "shape") and hasattr(m, "dtype"),
    )
    holder = _InputState(None)
    items = {"state": ocp.args.StandardRestore(target), "extra": ocp.args.JsonRestore()}
    if _has_input_state(pathlib.Path(manager.directory) / str(step)):  # so Orbax does not warn
        items["data"] = grain.checkpoint.CheckpointRestore(holder)
    out = manager.restore(int(step), args=ocp.args.Composite(**items))
    return out["state"], dict(out["extra"]), holder.state
