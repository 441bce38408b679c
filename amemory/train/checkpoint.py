"""Checkpoints: Orbax ``CheckpointManager`` with digests and a verified, fail-safe restore.

One checkpoint step holds up to three items: ``state`` (the ``TrainState``, restored
against an abstract target so optax states come back as NamedTuples with the target's
sharding); ``extra`` (JSON: the run config, ``task_meta`` such as ``model.scan_layers``,
the integrity digest); ``data`` (the Grain position after the saved step's batch, one JSON
file per process, when the task reads data: a resumed run reads the batch that followed).

Saves are asynchronous and atomic (Orbax writes a temporary directory and renames it), so
a process killed mid-save leaves the previous step as the latest. Multi-process runs call
every method on every process. Orbax checks each TensorStore shard's index but not the
array bytes, so ``save`` stores a per-leaf digest computed on the device
(:func:`state_digest`) and refuses a non-finite state; ``restore_intact`` restores the
newest step that fits the run and reads back intact, moving aside only proven damage.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pathlib
import shutil
import sys
import tempfile
import time
from typing import Any, NamedTuple

import grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from amemory.train import state as state_lib


def _key_name(entry: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def leaf_names(tree: Any) -> dict[str, Any]:
    """``{"opt_state.0.mu.layers.0.w": leaf}``: dotted names as Orbax records them."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {".".join(_key_name(e) for e in path): leaf for path, leaf in flat}


#: Name of the digest written into ``extra["integrity"]["digest"]`` (bump if it changes).
DIGEST = "u32sum+u32possum/v1"


class NonFiniteStateError(RuntimeError):
    """``save`` was asked to write a state with NaN/inf values; nothing was written.

    Attributes:
      step: the step that was not saved.
      counts: ``{leaf name: number of non-finite entries}`` (non-zero entries only).
    """

    def __init__(self, step: int, counts: dict[str, int]):
        self.step, self.counts = int(step), dict(counts)
        worst = ", ".join(f"{k} ({v})" for k, v in list(self.counts.items())[:3])
        super().__init__(f"state of step {step} has non-finite values in {worst}; not saved")


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (full disk, read-only file system); names the directory."""


class IncompatibleCheckpointError(ValueError):
    """A checkpoint this run refuses (a config error; nothing is moved): its leaves do not fit
    the model/optimizer, the resume contract refused it, or it reads back intact but cannot
    be restored into this run."""


class CorruptCheckpointError(RuntimeError):
    """A checkpoint step cannot be read back as saved (raised and caught inside restore)."""


class Restored(NamedTuple):
    """What :meth:`Checkpointer.restore_intact` found: the step, its ``TrainState`` and JSON
    extras, ``skipped`` ``[(path moved to, reason)]`` for newer rejected steps, ``data`` this
    process's input position (or None), ``notes`` one-line warnings of the restore."""

    step: int
    state: state_lib.TrainState
    extra: dict
    skipped: list
    data: bytes | None = None
    notes: tuple = ()


def _words(x: jax.Array) -> jax.Array:
    """The bit pattern of ``x`` as uint32 words (flat): floats bitcast, ints/bools cast."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        return x.reshape(-1).astype(jnp.uint32)
    width = x.dtype.itemsize
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[width]
    w = jax.lax.bitcast_convert_type(x, unsigned)  # 8-byte types get a trailing axis of 2
    return w.reshape(-1).astype(jnp.uint32)


@jax.jit
def _digest_tree(tree: Any) -> Any:
    def leaf(x):
        w = _words(x)
        pos = jnp.arange(1, w.size + 1, dtype=jnp.uint32)
        bad = jnp.sum(~jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.inexact) else 0
        # uint32 arithmetic wraps: sums are exact modulo 2**32, whatever the reduction order
        return jnp.stack([jnp.sum(w, dtype=jnp.uint32), jnp.sum(w * pos, dtype=jnp.uint32),
                          jnp.asarray(bad, jnp.uint32)])  # fmt: skip

    return jax.tree.map(leaf, tree)


def state_digest(state: Any) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Per-leaf digest and non-finite count of a (device) pytree, computed on the device.

    For leaf words ``w_i`` (the bit pattern as uint32, i = 1..n in row-major order)
    the digest is ``[sum_i w_i, sum_i i * w_i]`` modulo 2**32: any single changed
    word changes the first sum, a swap of two words the second. The sums are exact
    integer reductions, so they do not depend on sharding, device count or reduction
    order (the same state saved from 8 devices and read on 1 gives the same digest).
    One fused pass over the state on the device; only 3 integers per leaf reach the host.
    The pair of sums is a Fletcher-style checksum (J. G. Fletcher, "An Arithmetic
    Checksum for Serial Transmissions", IEEE Trans. Commun. 30(1), 1982) over 32-bit words.

    Args:
      state: pytree of arrays (numpy or jax, any sharding whose reduction is replicated).

    Returns:
      ``({leaf name: [sum, weighted sum]}, {leaf name: non-finite count})`` with the
      names of :func:`leaf_names`; the counts dict lists non-zero counts only.
    """
    out = leaf_names(jax.device_get(_digest_tree(state)))
    digest = {k: [int(v[0]), int(v[1])] for k, v in out.items()}
    bad = {k: int(v[2]) for k, v in out.items() if int(v[2])}
    return digest, bad


def _first_line(e: BaseException, tail: bool = False) -> str:
    """``Type: first line of the message`` without TensorStore's spec dump, at most 240 chars
    (``tail``: the end of a long line, where TensorStore puts the OS error)."""
    text = str(e).split(" See full TensorStore details")[0].strip().splitlines()
    line = f"{type(e).__name__}: {text[0] if text else ''}"
    if len(line) <= 240:
        return line
    return "..." + line[-237:] if tail else line[:237] + "..."


def _settle(held: Any, swallowed: list, quiet_s: float = 0.3, max_s: float = 3.0) -> None:
    """Wait until nothing more reaches ``held`` or ``swallowed`` for ``quiet_s`` (<= ``max_s``)."""
    gc.collect()  # finalise the failed readers now, while their messages are held
    t0 = last_change = time.monotonic()
    seen = (-1, -1)
    while time.monotonic() - t0 < max_s:
        sys.stderr.flush()
        now = (os.fstat(held.fileno()).st_size, len(swallowed))
        if now != seen:
            seen, last_change = now, time.monotonic()
        elif time.monotonic() - last_change >= quiet_s:
            break
        time.sleep(0.05)
    gc.collect()


@contextlib.contextmanager
def _stderr_held():
    """Hold what is written to file descriptor 2; yields a list to set ``[True]`` to replay it.

    A failed TensorStore read makes Orbax's reader threads print tracebacks and the full
    TensorStore spec (about 150 lines), and leaves "Event loop is closed" errors to
    ``sys.unraisablehook``, while the exception itself is caught. When a damaged
    checkpoint is skipped that noise is dropped; otherwise it is written out.
    """
    replay = [False]
    swallowed: list = []
    previous_hook = sys.unraisablehook
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no usable fd 2 (embedded interpreters): hold nothing
        yield replay
        return
    sys.unraisablehook = swallowed.append
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield replay
        finally:
            if not replay[0]:  # a failed read: let its reader threads finish here
                _settle(held, swallowed)
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sys.unraisablehook = previous_hook
            if replay[0]:
                for args in swallowed:
                    previous_hook(args)
                held.seek(0)
                data = held.read()
                if data:
                    os.write(2, data)


def _handlers() -> dict:  # built per manager: handlers touch the JAX backend
    return {
        "state": ocp.StandardCheckpointHandler(),
        "extra": ocp.JsonCheckpointHandler(),
        "data": grain.checkpoint.CheckpointHandler(),
    }


class Checkpointer:
    """Orbax ``CheckpointManager`` for ``TrainState`` + JSON extras.

    Args:
      directory: checkpoint root (created if missing); usually ``workdir/checkpoints``.
      max_to_keep: number of most recent steps kept on disk.
      async_save: write arrays in a background thread (default True).
    """

    def __init__(self, directory: str | pathlib.Path, *, max_to_keep: int = 3, async_save=True):
        self.directory = pathlib.Path(directory).absolute()
        self._unconfirmed = False  # an asynchronous save whose outcome is not yet known
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True, enable_async_checkpointing=async_save
        )
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_handlers=_handlers()
        )

    def latest_step(self) -> int | None:
        """Step number of the newest complete checkpoint, or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """All complete checkpoint steps on disk, ascending."""
        return sorted(self._manager.all_steps())

    def path(self, step: int) -> pathlib.Path:
        """Directory of checkpoint ``step``."""
        return self.directory / str(step)

    def save(
        self, step: int, state: state_lib.TrainState, extra: dict, data: bytes | None = None
    ) -> None:
        """Start saving ``state``, JSON-serialisable ``extra`` and this process's input
        position ``data`` (a Grain iterator's ``get_state()``, or None) as ``step``;
        returns early (arrays are written in the background).

        ``extra["integrity"]`` receives the digest of :func:`state_digest`.

        Raises:
          NonFiniteStateError: ``state`` holds NaN/inf (nothing is written).
          CheckpointWriteError: this save, or the previous asynchronous one, failed to
            write (full disk, read-only file system).
        """
        digest, bad = state_digest(state)
        if bad:
            raise NonFiniteStateError(step, bad)
        extra = {**extra, "integrity": {"digest": DIGEST, "leaves": digest}}
        items = {"state": ocp.args.StandardSave(state), "extra": ocp.args.JsonSave(extra)}
        if data is not None:
            items["data"] = grain.checkpoint.CheckpointSave(_InputState(data))
        with self._writing():
            self._manager.save(int(step), args=ocp.args.Composite(**items))
        self._unconfirmed = True

    def check_compatible(self, step: int, target: Any, *, cast=False, fresh_opt=False) -> bool:
        """Compare the saved leaves of ``step`` with ``target`` by name, shape and dtype, from
        the metadata. ``cast`` allows dtype differences; ``fresh_opt`` any difference under
        ``opt_state`` (then returns True). Raises ``IncompatibleCheckpointError`` (a
        ValueError) naming the first differing leaf, ``CorruptCheckpointError`` when the
        metadata does not read."""
        saved, want = _layout(self._manager, step), leaf_names(target)
        problems = []  # (leaf name, how it differs)
        for n, leaf in want.items():
            s, t_shape, t_dtype = saved.get(n), tuple(np.shape(leaf)), np.dtype(leaf.dtype)
            if s is None:
                problems.append((n, "is missing; the current model/optimizer needs it"))
            elif tuple(s.shape) != t_shape:
                problems.append((n, f"has shape {tuple(s.shape)}, but the current "
                                 f"model/optimizer expects {t_shape}"))  # fmt: skip
            elif np.dtype(s.dtype) != t_dtype and not cast:
                problems.append((n, f"was saved as {np.dtype(s.dtype)}, the current "
                                 f"model/optimizer has {t_dtype}"))  # fmt: skip
        extra = sorted(set(saved) - set(want))
        problems += [(n, "is not in the current model/optimizer") for n in extra]
        if fresh_opt and all(n.startswith("opt_state.") for n, _ in problems):
            return bool(problems)
        if problems:
            n, how = problems[0]
            raise IncompatibleCheckpointError(f"checkpoint {self.path(step)}: leaf {n!r} {how}")
        return False

    def extra(self, step: int) -> dict:
        """The JSON ``extra`` item of ``step`` (config, task_meta, ...), without the arrays."""
        items = {"extra": ocp.args.JsonRestore()}
        if _has_input_state(self.path(step)):  # read too, so Orbax does not warn about it
            items["data"] = grain.checkpoint.CheckpointRestore(_InputState(None))
        return dict(self._manager.restore(int(step), args=ocp.args.Composite(**items))["extra"])

    def verify(self, step: int, state: Any, extra: dict) -> bool:
        """Check a restored ``state`` against the digest saved in ``extra`` and for finiteness;
        False when ``extra`` holds no digest (written before digests: finiteness only).

        Raises:
          CorruptCheckpointError: naming the first leaf whose digest differs, or the
            leaves holding NaN/inf and how many.
        """
        digest, bad = state_digest(state)
        if bad:
            worst = ", ".join(f"{k} ({v})" for k, v in list(bad.items())[:3])
            raise CorruptCheckpointError(f"non-finite values restored in {worst}")
        saved = (extra.get("integrity") or {}).get("leaves")
        if saved is None:
            return False
        for name, want in saved.items():
            got = digest.get(name)
            if got != list(want):
                raise CorruptCheckpointError(
                    f"checksum mismatch in {name} (saved {want}, read {got}): the data on "
                    "disk changed after it was written"
                )
        return True

    def _reject(self, step: int, reason: str) -> pathlib.Path:
        """Move checkpoint ``step`` to ``<directory>-rejected/<step>[.n]`` with REASON.txt."""
        dest_root = self.directory.with_name(self.directory.name + "-rejected")
        dest = dest_root / str(step)
        n = 0
        while dest.exists():
            n += 1
            dest = dest_root / f"{step}.{n}"
        if jax.process_index() == 0:
            dest_root.mkdir(parents=True, exist_ok=True)
            shutil.move(str(self.path(step)), dest)
            (dest / "REASON.txt").write_text(reason + "\n")
        _barrier(f"amemory_reject_{step}")
        self._manager.reload()
        return dest

    def reject(self, steps: list[int], reason: str) -> list[pathlib.Path]:
        """Move the given checkpoint steps aside (see ``restore_intact``); returns new paths."""
        self.wait()
        return [self._reject(s, reason) for s in steps if s in self.all_steps()]

    def _read_checked(self, step: int, target: Any, data: bool, accept: Any, fresh: Any):
        """One step of :meth:`restore_intact`: ``(state, extra, position, notes)``."""
        extra = self.extra(step)  # unreadable JSON: damaged (the caller catches it)
        try:
            allowed = accept(step, extra) if accept is not None else {}
        except ValueError as e:  # the resume contract: nothing is read or moved
            raise IncompatibleCheckpointError(str(e)) from e
        reset = fresh is not None and any(k.startswith("optimizer.") for k in allowed)
        cast = any(k.endswith("dtype") for k in allowed)
        reset = self.check_compatible(step, target, cast=cast, fresh_opt=reset)
        if data and not _has_input_state(self.path(step)):
            raise CorruptCheckpointError(
                f"no input position (data/) for process "
                f"{jax.process_index()} of {jax.process_count()}"
            )
        shardings = {n: x.sharding for n, x in leaf_names(target).items()}
        state, extra, position = _read_as_stored(self._manager, step, shardings.get)
        notes = [] if self.verify(step, state, extra) else [
            f"checkpoint {step} has no integrity record (written before digests): its arrays "
            "were checked for NaN/inf only"]  # fmt: skip
        source = leaf_names(state)
        if reset:  # parameters, step and key from the checkpoint, a fresh optimizer state
            count = source["step"]
            for n, x in leaf_names(fresh().opt_state).items():
                fresh_x = x + (count - x) if n.endswith(".count") else x  # schedules go on
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

    def _diagnose(self, step: int) -> str | None:
        """Re-read ``step`` as stored on one device and check its digest: the reason it is
        damaged, or None when it reads back intact."""
        try:
            self.verify(step, *_read_as_stored(self._manager, step)[:2])
        except Exception as e:  # noqa: BLE001 - the plain read fails too: damage
            return _first_line(e)
        return None

    def restore_intact(
        self, target: state_lib.TrainState, *, data: bool = False, accept: Any = None,
        fresh: Any = None,
    ) -> Restored:  # fmt: skip
        """Restore the newest checkpoint that reads back intact, rejecting newer damaged ones.

        From the newest step down, each step is judged before its arrays are read: its
        JSON extras go to ``accept`` (the caller's resume contract) and its recorded tree,
        shapes and dtypes are compared with ``target``; a refusal or mismatch raises and
        moves nothing. The arrays are then read in their saved dtypes and checked against
        their digest. A step is moved to ``<directory>-rejected/`` (with ``REASON.txt``) and
        the next older one tried only when damage is proven: its files fail to read, also
        when re-read as stored on one device, its digest differs, or it holds NaN/inf.

        Args:
          target: ``TrainState`` of arrays or ``jax.ShapeDtypeStruct`` (with shardings).
          data: also read this process's input position; a step without one is damaged.
          accept: ``(step, extra) -> {field: [old, new]}``, the config changes allowed
            (raise ``ValueError`` to refuse). An allowed ``*dtype`` field lets leaves be
            cast; an allowed ``optimizer.*`` field lets the optimizer state differ: then
            params, step and key are restored and the optimizer state comes from ``fresh()``
            (a fresh ``TrainState``), its ``count`` leaves set to the step.

        Returns:
          :class:`Restored` (step, state, extra, skipped, data, notes).

        Raises:
          ValueError: refused by ``accept``; the newest readable checkpoint does not fit
            ``target`` (names the leaf) or reads intact but cannot be restored into it;
            or no checkpoint is intact (lists each one's reason).
        """
        skipped: list[tuple[pathlib.Path, str]] = []
        for step in sorted(self.all_steps(), reverse=True):
            with _stderr_held() as replay:
                try:
                    state, extra, position, notes = self._read_checked(
                        step, target, data, accept, fresh
                    )
                    ok, reason = True, ""
                except IncompatibleCheckpointError:
                    replay[0] = True
                    raise  # the checkpoint reads fine (or was not read); the config does not fit
                except Exception as e:  # noqa: BLE001 - damaged only if a plain re-read says so
                    ok = False
                    corrupt = isinstance(e, CorruptCheckpointError)
                    reason = str(e) if corrupt else self._diagnose(step)
                    if reason is None:
                        replay[0] = True
                        raise IncompatibleCheckpointError(
                            f"checkpoint {self.path(step)} reads back intact but cannot be "
                            f"restored into this run ({_first_line(e)}); nothing was moved"
                        ) from e
                replay[0] = ok
            if _all_agree(ok):
                return Restored(step, state, extra, skipped, position, tuple(notes))
            reason = reason or "damaged on another process"
            skipped.append((self._reject(step, reason), reason))
        if skipped:
            listing = "; ".join(f"{p}: {r}" for p, r in skipped)
            raise ValueError(f"no intact checkpoint in {self.directory} (rejected {listing})")
        raise ValueError(f"no checkpoint in {self.directory}")

    def reached_preemption(self, step: int) -> bool:
        """True on every process at the step JAX's preemption service agreed on (multi-host).

        Orbax's ``CheckpointManager.reached_preemption``; False when the service is
        not running (single process, or ``jax.distributed`` not initialised).
        """
        return bool(self._manager.reached_preemption(int(step)))

    @contextlib.contextmanager
    def _writing(self):
        """Report a failed write (TensorStore raises ValueError) as ``CheckpointWriteError``."""
        try:
            yield
        except (NonFiniteStateError, CheckpointWriteError):
            raise
        except (OSError, ValueError, RuntimeError) as e:
            raise CheckpointWriteError(
                f"cannot write a checkpoint in {self.directory}: {_first_line(e, tail=True)}"
            ) from e

    def check_errors(self) -> None:
        """Raise the ``CheckpointWriteError`` of a finished asynchronous save that failed
        (does not block; single-process runs)."""
        if jax.process_count() > 1:  # hosts finish at different times: left to the next save
            return
        if self._unconfirmed and not self._manager.is_saving_in_progress():
            self._unconfirmed = False
            self.wait()  # finished: returns at once, raising the save's error if it failed

    def wait(self) -> None:
        """Block until pending asynchronous saves are on disk.

        Raises:
          CheckpointWriteError: a pending save failed to write.
        """
        with self._writing():
            self._manager.wait_until_finished()

    def close(self) -> None:
        """Finish pending saves and release the manager (raises as :meth:`wait`)."""
        try:
            self.wait()
        finally:
            self._manager.close()


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _all_agree(ok: bool) -> bool:
    """True when ``ok`` holds on every process (one small all-gather when there are several)."""
    if jax.process_count() == 1:
        return ok
    from jax.experimental import multihost_utils

    return bool(np.all(multihost_utils.process_allgather(np.asarray(ok, np.int32))))


def _has_input_state(step_dir: pathlib.Path) -> bool:
    """Whether ``step_dir`` holds this process's input position (Grain writes one file per
    process: ``data/process_<i>-of-<n>.json``)."""
    i, n = jax.process_index(), jax.process_count()
    return (step_dir / "data" / f"process_{i}-of-{n}.json").is_file()


class _InputState:
    """A saved or restored Grain iterator state, in the shape Grain's Orbax handler wants
    (``get_state`` / ``set_state`` / ``start_prefetch``): the loop saves the state recorded
    when the batch of the saved step was read, not the live iterator's (which is ahead by
    the prefetched batches), and sets the restored one on its iterator itself."""

    def __init__(self, state: bytes | None):
        self.state = state

    def get_state(self) -> bytes:
        return self.state

    def set_state(self, state: bytes) -> None:
        self.state = state

    def start_prefetch(self) -> None:
        pass


def load_params(directory: str | pathlib.Path, step: int | None = None) -> Any:
    """Parameters of a saved run as a nested dict of numpy arrays (no target needed).

    For analysis and tests: the tree is restored as stored (list indices become
    string keys such as ``"0"``); pass it through ``leaf_names`` to compare by name.

    Args:
      directory: a run's ``checkpoints/`` directory.
      step: checkpoint step; None = the latest.

    Raises:
      ValueError: if the directory holds no checkpoint.
    """
    manager = ocp.CheckpointManager(pathlib.Path(directory).absolute(), item_handlers=_handlers())
    try:
        step = manager.latest_step() if step is None else step
        if step is None:
            raise ValueError(f"no checkpoint in {directory}")
        state = _read_as_stored(manager, step)[0]
    finally:
        manager.close()
    return jax.tree.map(np.asarray, state["params"])


def _layout(manager: ocp.CheckpointManager, step: int) -> dict[str, Any]:
    """``{leaf name: array metadata (shape, dtype)}`` of ``step`` (CorruptCheckpointError
    when it does not read)."""
    try:
        meta = manager.item_metadata(step)["state"]
    except Exception as e:  # noqa: BLE001 - a missing or unreadable _METADATA file
        raise CorruptCheckpointError(_first_line(e)) from e
    saved = {m.name: m for m in jax.tree.leaves(meta) if hasattr(m, "shape")}
    if not saved:
        raise CorruptCheckpointError(f"no array metadata readable in step {step}")
    return saved


def _read_as_stored(manager: ocp.CheckpointManager, step: int, sharding: Any = None):
    """``(state, extra, input position)`` of ``step`` with the stored tree (nested dicts),
    shapes and dtypes; leaf ``name`` placed with ``sharding(name)``, else like the ``step``
    leaf, else on the first local device."""
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
