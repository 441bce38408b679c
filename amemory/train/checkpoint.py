"""Checkpoints: a thin wrapper over Orbax ``CheckpointManager``.

One checkpoint step holds up to three items:
  state   the ``TrainState`` (params, opt_state, step, rng), saved with
          ``StandardSave``; restored against an abstract target so optax states
          come back as their NamedTuples and arrays land with the target's sharding;
  extra   JSON: the run config, the fields that fix the parameter layout
          (``task_meta``, e.g. ``model.scan_layers``) and free metadata;
  data    the Grain iterator state of the training input, one JSON file per process
          (``grain.checkpoint.CheckpointHandler``), present when the task reads data:
          the position after the last batch the saved state was trained on, so a
          resumed run reads exactly the batch that followed.

Saves are asynchronous (training continues while the arrays are written) and
atomic (Orbax writes to a temporary directory and renames it when complete), so a
process killed mid-save leaves the previous step as the latest one. ``max_to_keep``
bounds the number of steps on disk. Multi-process runs call every method on every
process; Orbax writes each process's shards and the JSON once.
"""

from __future__ import annotations

import pathlib
from typing import Any

import grain
import jax
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


class Checkpointer:
    """Orbax ``CheckpointManager`` for ``TrainState`` + JSON extras.

    Args:
      directory: checkpoint root (created if missing); usually ``workdir/checkpoints``.
      max_to_keep: number of most recent steps kept on disk.
      async_save: write arrays in a background thread (default True).
    """

    def __init__(self, directory: str | pathlib.Path, *, max_to_keep: int = 3, async_save=True):
        self.directory = pathlib.Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True, enable_async_checkpointing=async_save
        )
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=options,
            item_handlers={
                "state": ocp.StandardCheckpointHandler(),
                "extra": ocp.JsonCheckpointHandler(),
                "data": grain.checkpoint.CheckpointHandler(),
            },
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
        returns early (arrays are written in the background)."""
        items = {"state": ocp.args.StandardSave(state), "extra": ocp.args.JsonSave(extra)}
        if data is not None:
            items["data"] = grain.checkpoint.CheckpointSave(_InputState(data))
        self._manager.save(int(step), args=ocp.args.Composite(**items))

    def check_compatible(self, step: int, target: state_lib.TrainState) -> None:
        """Compare the saved leaves of ``step`` with ``target`` by name, shape and dtype.

        Raises:
          ValueError: naming the first missing, extra or mismatched leaf, with both shapes.
        """
        meta = self._manager.item_metadata(step)["state"]
        saved = {m.name: m for m in jax.tree.leaves(meta) if hasattr(m, "shape")}
        want = leaf_names(target)
        for name, leaf in want.items():
            if name not in saved:
                raise ValueError(
                    f"checkpoint {self.path(step)} has no leaf {name!r} that the current "
                    "model/optimizer needs (different config?)"
                )
            s_shape, t_shape = tuple(saved[name].shape), tuple(np.shape(leaf))
            if s_shape != t_shape:
                raise ValueError(
                    f"checkpoint {self.path(step)}: leaf {name!r} has shape {s_shape}, "
                    f"but the current model/optimizer expects {t_shape}"
                )
        extra = sorted(set(saved) - set(want))
        if extra:
            raise ValueError(
                f"checkpoint {self.path(step)} has leaves the current model/optimizer lacks: "
                f"{extra[:5]}"
            )

    def extra(self, step: int) -> dict:
        """The JSON ``extra`` item of ``step`` (config, task_meta, ...), without the arrays."""
        items = {"extra": ocp.args.JsonRestore()}
        if _has_input_state(self.path(step)):  # read too, so Orbax does not warn about it
            items["data"] = grain.checkpoint.CheckpointRestore(_InputState(None))
        return dict(self._manager.restore(int(step), args=ocp.args.Composite(**items))["extra"])

    def restore(
        self, step: int, target: state_lib.TrainState, *, data: bool = False
    ) -> tuple[state_lib.TrainState, dict, bytes | None]:
        """Restore ``step`` into the structure, shapes, dtypes and shardings of ``target``.

        Args:
          step: checkpoint step to read.
          target: a ``TrainState`` of arrays or ``jax.ShapeDtypeStruct`` (``state.abstract``).
          data: also read this process's input position (saved by ``save(data=...)``).

        Returns:
          ``(state, extra, data)``; ``data`` is the saved iterator state (bytes) or None.

        Raises:
          ValueError: if a leaf's shape differs from the checkpoint's (names the leaf), or
            ``data`` is requested from a checkpoint without it.
        """
        self.check_compatible(step, target)
        abstract = state_lib.abstract(target)
        items = {"state": ocp.args.StandardRestore(abstract), "extra": ocp.args.JsonRestore()}
        holder = _InputState(None)
        if data and not _has_input_state(self.path(step)):
            raise ValueError(
                f"checkpoint {self.path(step)} holds no input position (data/) for process "
                f"{jax.process_index()} of {jax.process_count()}"
            )
        if _has_input_state(self.path(step)):
            items["data"] = grain.checkpoint.CheckpointRestore(holder)
        out = self._manager.restore(int(step), args=ocp.args.Composite(**items))
        return out["state"], dict(out["extra"]), holder.state

    def wait(self) -> None:
        """Block until pending asynchronous saves are on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Finish pending saves and release the manager."""
        self._manager.wait_until_finished()
        self._manager.close()


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
    manager = ocp.CheckpointManager(
        pathlib.Path(directory).absolute(),
        item_handlers={
            "state": ocp.StandardCheckpointHandler(),
            "extra": ocp.JsonCheckpointHandler(),
            "data": grain.checkpoint.CheckpointHandler(),
        },
    )
    try:
        step = manager.latest_step() if step is None else step
        if step is None:
            raise ValueError(f"no checkpoint in {directory}")
        meta = manager.item_metadata(step)["state"]
        dev = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        target = jax.tree.map(
            lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=dev),
            dict(meta),
            is_leaf=lambda m: hasattr(m, "shape") and hasattr(m, "dtype"),
        )
        items = {"state": ocp.args.StandardRestore(target)}
        if _has_input_state(pathlib.Path(directory) / str(step)):  # read, so Orbax does not warn
            items["data"] = grain.checkpoint.CheckpointRestore(_InputState(None))
        items["extra"] = ocp.args.JsonRestore()
        out = manager.restore(step, args=ocp.args.Composite(**items))
    finally:
        manager.close()
    return jax.tree.map(np.asarray, out["state"]["params"])
