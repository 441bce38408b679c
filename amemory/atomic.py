"""Atomic file writes: a reader sees the old file or the new one, never a torn one.

A temporary sibling is written and ``fsync``-ed, ``os.replace``-d over the destination
(atomic on POSIX within one directory), and the directory ``fsync``-ed; a kill leaves at
most a stray ``.<name>.tmp*`` file. Source: POSIX ``rename(2)``, SQLite's "Atomic Commit".
Imports nothing of amemory, so every layer may use it.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import tempfile
from typing import Any

__all__ = ["write_bytes", "write_text", "write_json", "save_npy"]


def _fsync_dir(directory: pathlib.Path) -> None:
    # Some file systems do not open or fsync directories; the rename still happened.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _replace_with(path: str | os.PathLike, write: Any, suffix: str = "") -> pathlib.Path:
    """Create ``path`` atomically: ``write(binary_file)`` fills a temporary sibling first."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp", suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)
    return path


def write_bytes(path: str | os.PathLike, data: bytes) -> pathlib.Path:
    """Atomically replace ``path`` with ``data`` (parents created); OSError leaves it as it was."""
    return _replace_with(path, lambda f: f.write(data))


def write_text(path: str | os.PathLike, text: str) -> pathlib.Path:
    """Atomically replace ``path`` with ``text`` encoded as UTF-8. Returns the path."""
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2) -> pathlib.Path:
    """Atomically replace ``path`` with ``json.dumps(obj, indent=indent)`` and a newline
    (TypeError, nothing written, when ``obj`` is not JSON-serialisable)."""
    return write_text(path, json.dumps(obj, indent=indent) + "\n")


def save_npy(path: str | os.PathLike, arr: Any) -> pathlib.Path:
    """Atomically replace ``path`` with ``numpy.save(arr)`` (``.npy`` format)."""
    import numpy as np

    return _replace_with(path, lambda f: np.save(f, arr), suffix=".npy")
