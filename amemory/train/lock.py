"""The workdir lock: one live run per run directory.

The run directory itself is held with ``fcntl.flock`` for the whole run by the run's
process 0 (``amemory.train.guard.RunGuard``), so deleting ``run.lock`` lets no second
run in; ``run.lock`` records the holder's PID, host, start time and process count for
the message a second run prints. ``amemory train`` probes the lock before it imports
JAX (:func:`probe_workdir`), so that failure takes a fraction of a second.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import pathlib
import socket
from typing import Any

LOCK_NAME = "run.lock"
EXIT_BUSY = 4  # ``amemory train``'s exit status when the workdir is in use


class WorkdirBusyError(RuntimeError):
    """Another live run holds the workdir lock; the message names its PID and host."""

    exit_code = EXIT_BUSY


def holder_info(path: pathlib.Path) -> dict:
    """What the lock file at ``path`` says about its holder (empty if unreadable)."""
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def busy_message(workdir: pathlib.Path, info: dict) -> str:
    """The one-line error naming the holder of ``workdir``'s lock."""
    who = f"pid {info.get('pid', '?')} on host {info.get('host', '?')}"
    since = f", started {info['started']}" if info.get("started") else ""
    return (
        f"workdir {workdir} is in use by another run ({who}{since}); wait for it to "
        f"finish or stop it, or choose another --workdir (lock: {workdir / LOCK_NAME})"
    )


class WorkdirLock:
    """An exclusive ``fcntl.flock`` on the run directory for the life of a run.

    ``flock`` locks belong to the open file, so the kernel drops the lock when the
    holder exits or is killed (SIGKILL included): a lock can never go stale. On network
    file systems ``flock`` is as reliable as their lock support (NFSv4 is; some FUSE
    mounts are not).

    Args:
      workdir: the run directory (created if missing).
      processes: ``jax.process_count()`` of the holder (recorded).

    Raises (``acquire``):
      WorkdirBusyError: another process holds the lock (names its PID and host).
      OSError: the directory cannot be created or written (read-only, full disk).
    """

    def __init__(self, workdir: str | os.PathLike, processes: int = 1):
        self.workdir = pathlib.Path(workdir).absolute()
        self.path, self.processes, self._fd = self.workdir / LOCK_NAME, processes, None
        self.is_main = True  # process 0 (set by ``acquire_everywhere``)

    def acquire(self) -> WorkdirLock:
        self.workdir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.workdir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            info = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "processes": self.processes,
                "started": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            }
            self.path.write_text(json.dumps(info) + "\n")
        except BlockingIOError:
            os.close(fd)
            raise WorkdirBusyError(busy_message(self.workdir, holder_info(self.path))) from None
        except OSError:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def acquire_everywhere(self) -> None:
        """``acquire`` on process 0 of a (multi-process) JAX run; every process raises its
        error (the others a ``WorkdirBusyError``) when it fails."""
        import jax
        import numpy as np

        self.is_main, error = jax.process_index() == 0, None
        if self.is_main:
            try:
                self.acquire()
            except (WorkdirBusyError, OSError) as e:
                error = e
        if self.processes > 1:
            from jax.experimental import multihost_utils

            ok = multihost_utils.broadcast_one_to_all(np.int32(error is None))
            if not int(ok) and error is None:
                error = WorkdirBusyError(busy_message(self.workdir, holder_info(self.path)))
        if error is not None:
            raise error

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> WorkdirLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def probe_workdir(workdir: str | os.PathLike) -> None:
    """Fail fast (before JAX is imported) if a single-process run holds ``workdir``.

    A multi-process holder is left to the full check in ``RunGuard`` (its other processes
    share the directory). Does nothing when the directory does not exist.

    Raises:
      WorkdirBusyError: as :class:`WorkdirLock`.
    """
    path = pathlib.Path(workdir).absolute() / LOCK_NAME
    try:
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except BlockingIOError:
        info = holder_info(path)
        if int(info.get("processes", 1)) == 1:
            raise WorkdirBusyError(busy_message(path.parent, info)) from None
    finally:
        os.close(fd)
