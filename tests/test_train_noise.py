"""``amemory.train.noise.held``: background noise (fd 2, unraisable exceptions, absl ERROR
logs) is dropped when the block fails and written out, in order, when it does not."""

import contextlib
import logging
import os
import sys
import threading

import pytest

from amemory.train import noise


class _Unraisable:
    def __init__(self, text):
        self.exc_value, self.text = RuntimeError(text), text


def _make_noise(tag):
    """What Orbax's failed threads leave: raw fd-2 bytes written from another thread, an
    unraisable exception, an absl ERROR log."""
    t = threading.Thread(target=os.write, args=(2, f"fd2 {tag}\n".encode()))
    t.start()
    t.join()
    sys.unraisablehook(_Unraisable(f"unraisable {tag}"))
    logging.getLogger("absl").error("absl %s", tag)


@pytest.fixture
def seen(monkeypatch):
    got = []
    monkeypatch.setattr(sys, "unraisablehook", lambda args: got.append(args.text))
    return got


@pytest.mark.parametrize("outcome", ["ok", "raises", "drop", "replay_after_raise"])
def test_held_drops_noise_of_a_failure_and_replays_it_otherwise(capfd, caplog, seen, outcome):
    caplog.set_level(logging.ERROR, logger="absl")
    with pytest.raises(ValueError) if "raise" in outcome else contextlib.nullcontext():
        with noise.held(fd=True) as hold:
            _make_noise(outcome)
            hold.replay = {"drop": False, "replay_after_raise": True}.get(outcome)
            if "raise" in outcome:
                raise ValueError("the caller reports this one")
    err = capfd.readouterr().err
    shown = outcome in ("ok", "replay_after_raise")
    assert (f"fd2 {outcome}" in err) == shown
    assert seen == ([f"unraisable {outcome}"] if shown else [])
    assert (f"absl {outcome}" in caplog.text) == shown
    assert sys.unraisablehook is not None and os.fstat(2)  # fd 2 and the hook are restored
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"
