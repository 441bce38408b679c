"""Run records: ``metrics.jsonl`` (schema: ``docs/metrics.md``) and its scalars as
TensorBoard events (``tensorboardX``'s ``EventsWriter``, in the caller's thread, so a full
disk is one ``OSError``). Tags are ``<kind>/<field>`` (events: ``event/<event>/<field>``);
a per-seed list becomes ``<tag>/seed_<seed>``; other lists and strings stay in the jsonl.
On resume both are cut back to the restored step.
"""

from __future__ import annotations

import json
import math
import numbers
import pathlib
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np

from amemory import atomic


def jsonable(x: Any) -> Any:
    """Arrays, numpy scalars and nested containers -> JSON values (non-finite -> None)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (np.ndarray, jax.Array)):
        return jsonable(np.asarray(x).tolist())
    if isinstance(x, (np.floating, float)):
        x = float(x)
        return x if math.isfinite(x) else None
    return x.item() if isinstance(x, (np.integer, np.bool_)) else x


def _number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def scalars(record: dict[str, Any], seeds: Sequence[int] | None) -> Iterator[tuple[str, float]]:
    """``(tag, value)`` of every scalar of a JSON-able jsonl ``record`` (``seeds``: the seeds
    of a multi-seed run, else None)."""
    kind = record["kind"]
    prefix = f"event/{record.get('event')}" if kind == "event" else kind
    for name, v in record.items():
        if name in ("kind", "step", "event"):
            continue
        tag = f"{prefix}/{name}"
        if _number(v):
            yield tag, float(v)
        elif seeds and isinstance(v, list) and len(v) == len(seeds):
            for s, x in zip(seeds, v, strict=True):
                if _number(x):
                    yield f"{tag}/seed_{s}", float(x)


#: Seconds between fsyncs of the TensorBoard event file (one per record cost a disk flush
#: per step at ``log_every = 1``).
TB_SYNC_SECS = 10.0


class RunLog:
    """``metrics.jsonl`` + TensorBoard writer of one run in ``workdir`` (only if ``enabled``).

    ``keep_until``: on resume, the restored step (jsonl records after it are dropped, lines
    that do not read moved to ``metrics.jsonl.unreadable``, TensorBoard events after it
    purged); None for a fresh run. ``seeds``: a multi-seed run's seeds, or None.
    """

    def __init__(self, workdir: pathlib.Path, enabled: bool, keep_until: int | None, seeds=None):
        self.path, self.enabled, self.seeds = workdir / "metrics.jsonl", enabled, seeds
        if not enabled:
            return
        unreadable: list[int] = []  # 1-based numbers of lines that do not read
        if keep_until is None:
            self.path.write_text("")
        elif self.path.exists():
            lines, kept = self.path.read_bytes().splitlines(), []
            for i, line in enumerate(lines, 1):
                try:  # a line cut by a kill or edited by hand: not UTF-8 JSON with an int step
                    step = json.loads(line.decode("utf-8"))["step"]
                    ok = isinstance(step, int) and not isinstance(step, bool)
                except (ValueError, TypeError, KeyError, IndexError):
                    ok = False
                if ok and step <= keep_until:
                    kept.append(line)
                elif not ok and line.strip():
                    unreadable.append(i)
            if unreadable:
                bad = self.path.with_name(self.path.name + ".unreadable")
                old = bad.read_bytes() if bad.exists() else b""
                atomic.write_bytes(bad, old + b"".join(lines[i - 1] + b"\n" for i in unreadable))
                sys.stderr.write(
                    f"amemory train: warning: {self.path}: {len(unreadable)} unreadable line(s) "
                    f"(first: line {unreadable[0]}) moved to {bad}\n"
                )
            atomic.write_bytes(self.path, b"".join(line + b"\n" for line in kept))
        self._f = self.path.open("a")
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event, SessionLog
        from tensorboardX.summary import scalar

        self._event, self._scalar = Event, scalar
        self._tb, self._synced = EventsWriter(str(workdir / "events")), time.monotonic()
        if keep_until is not None:  # TensorBoard hides the older events from this step on
            self._tb.write_event(Event(step=keep_until + 1, file_version="brain.Event:2"))
            self._tb.write_event(Event(step=keep_until + 1, session_log=SessionLog(status=1)))
        if unreadable:
            self.write("event", keep_until, event="log_lines_unreadable", lines=unreadable)

    def write(self, kind: str, step: int, **fields: Any) -> dict[str, Any]:
        """Append one record (``step``: optimizer steps completed); OSError names the file."""
        rec = {"kind": kind, "step": int(step), **jsonable(fields)}
        if not self.enabled:
            return rec
        self._f.write(json.dumps(rec) + "\n")
        self._f.flush()
        try:
            for tag, value in scalars(rec, self.seeds):
                summary, now = self._scalar(tag, value), time.time()
                self._tb.write_event(self._event(wall_time=now, step=int(step), summary=summary))
            if time.monotonic() - self._synced >= TB_SYNC_SECS:
                self._tb.flush()
                self._synced = time.monotonic()
        except OSError as e:
            raise OSError(f"cannot write TensorBoard events in {self.path.parent}: {e}") from e
        return rec

    def close(self) -> None:
        """Flush and close both files."""
        if self.enabled:
            try:
                self._f.close()
            finally:
                self._tb.close()
