"""Orbax's noise: what its background threads print when a checkpoint read or write fails
(tracebacks and TensorStore specs on fd 2, "Event loop is closed" unraisables, absl ERROR
logs). The caller reports the exception in one line, so :func:`held` keeps the noise back
and writes it out only when the block turned out well.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator


class Hold(logging.Filter):
    """What :func:`held` keeps back. ``replay``: True writes it out at the end, False drops
    it, None (default) writes it out when the block raised nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.replay: bool | None = None
        self.logs: list[logging.LogRecord] = []
        self.unraisable: list = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            self.logs.append(record)
            return False
        return True


def _settle(fd_file, hold: Hold, quiet_s: float = 0.3, max_s: float = 3.0) -> None:
    """Wait until nothing more reaches ``fd_file`` or ``hold`` for ``quiet_s`` (<= ``max_s``):
    the failed reader threads finish writing while their output is still held."""
    gc.collect()  # finalise the failed readers now
    t0 = changed = time.monotonic()
    seen = None
    while time.monotonic() - t0 < max_s and time.monotonic() - changed < quiet_s:
        sys.stderr.flush()
        now = (os.fstat(fd_file.fileno()).st_size, len(hold.unraisable), len(hold.logs))
        if now != seen:
            seen, changed = now, time.monotonic()
        time.sleep(0.05)
    gc.collect()


@contextlib.contextmanager
def held(fd: bool = False) -> Iterator[Hold]:
    """Hold absl ERROR logs, unraisable exceptions and (``fd``, when usable) file descriptor 2
    while the block runs; yields the :class:`Hold` whose ``replay`` decides their fate."""
    hold, absl, previous_hook = Hold(), logging.getLogger("absl"), sys.unraisablehook
    saved = None
    if fd:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
            saved = os.dup(2)
    absl.addFilter(hold)
    sys.unraisablehook = hold.unraisable.append
    with tempfile.TemporaryFile() as fd_file:
        if saved is not None:
            os.dup2(fd_file.fileno(), 2)
        failed = True
        try:
            yield hold
            failed = False
        finally:
            replay = hold.replay if hold.replay is not None else not failed
            if saved is not None:
                if not replay:
                    _settle(fd_file, hold)
                sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
            absl.removeFilter(hold)
            sys.unraisablehook = previous_hook
            if replay:
                for log_record in hold.logs:
                    absl.handle(log_record)
                for args in hold.unraisable:
                    previous_hook(args)
                fd_file.seek(0)
                if data := fd_file.read():
                    os.write(2, data)
