"""The workdir lock: one live run per run directory.

Process 0 holds the run directory itself with ``fcntl.flock`` (deleting ``run.lock`` lets no
second run in); ``run.lock`` records the holder's PID, host, start and process count for the
message. :func:`probe_workdir` checks it before ``amemory train`` imports JAX.
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


def _holder(workdir: pathlib.Path) -> dict:
    """What ``workdir``'s lock file says about its holder (empty if unreadable)."""
    try:
        return json.loads((workdir / LOCK_NAME).read_text() or "{}")
    except (OSError, ValueError):
        return {}


def _busy(workdir: pathlib.Path, info: dict | None = None) -> WorkdirBusyError:
    """The one-line error naming the holder of ``workdir``'s lock."""
    info = _holder(workdir) if info is None else info
    who = f"pid {info.get('pid', '?')} on host {info.get('host', '?')}"
    since = f", started {info['started']}" if info.get("started") else ""
    return WorkdirBusyError(
        f"workdir {workdir} is in use by another run ({who}{since}); wait for it to "
        f"finish or stop it, or choose another --workdir (lock: {workdir / LOCK_NAME})"
    )


class WorkdirLock:
    """An exclusive ``fcntl.flock`` on the run directory (created if missing) for a run of
    ``processes`` processes. The kernel drops it when the holder dies (SIGKILL included),
    so it never goes stale; on network file systems it is as good as their lock support.

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
            started = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
            info = {"pid": os.getpid(), "host": socket.gethostname(),
                    "processes": self.processes, "started": started}  # fmt: skip
            self.path.write_text(json.dumps(info) + "\n")
        except OSError as e:
            os.close(fd)
            raise _busy(self.workdir) if isinstance(e, BlockingIOError) else e from None
        self._fd = fd
        return self

    def acquire_everywhere(self) -> None:
        """``acquire`` on process 0; when it fails every process raises (the others a
        ``WorkdirBusyError``)."""
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
                error = _busy(self.workdir)
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
    """``WorkdirBusyError`` (before JAX is imported) when a single-process run holds ``workdir``;
    a multi-process holder is left to ``RunGuard``'s full check."""
    workdir = pathlib.Path(workdir).absolute()
    try:
        fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except BlockingIOError:
        info = _holder(workdir)
        if int(info.get("processes", 1)) == 1:
            raise _busy(workdir, info) from None
    finally:
        os.close(fd)
