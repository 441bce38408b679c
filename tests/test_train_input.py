"""The Grain training input (amemory.data.batching) against brute-force references.

Windows are located in the token stream by brute-force search; shards, epochs and
resumption are checked against the stream itself, not against the loader's own state.
"""

import grain
import numpy as np
import pytest

from amemory.data import batching
from amemory.data import biographies as B


def _starts(tokens, batch):
    """Brute force: the offset of every row in ``tokens`` (each must occur exactly once)."""
    win = np.lib.stride_tricks.sliding_window_view(tokens, batch.shape[1])
    out = []
    for row in batch:
        (hit,) = np.flatnonzero((win == row).all(axis=1)).reshape(1, -1)
        assert hit.size == 1, "a row is not one contiguous slice of the stream"
        out.append(int(hit[0]))
    return out


def test_token_windows_epochs_resume_and_shards():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 50_000, size=2003).astype(np.int32)  # ~unique windows
    B_, T = 6, 10
    slots = (2003 - T) // T  # 199 slots of 2T tokens, a T+1 window cropped from each
    it = iter(batching.token_loader(tokens, B_, T, seed=3))
    first = [next(it) for _ in range(5)]
    saved = it.get_state()
    cont = [next(it) for _ in range(95)]  # 100 batches = 600 windows, 3 epochs and more
    starts = [s for b in first + cont for s in _starts(tokens, b)]
    assert all(b.shape == (B_, T + 1) and b.dtype == np.int32 for b in first + cont)
    # Epoch e serves every slot once (slot = start // T, crop offset = start % T).
    per_epoch = slots
    for e in range(3):
        ep = starts[e * per_epoch : (e + 1) * per_epoch]
        assert sorted(s // T for s in ep) == list(range(slots))
    # The crop offsets (window boundaries) of a slot move between epochs.
    by_slot = {}
    for s in starts[: 2 * per_epoch]:
        by_slot.setdefault(s // T, []).append(s % T)
    moved = np.mean([len(set(v)) > 1 for v in by_slot.values()])
    assert moved > 0.8  # offsets are uniform in [0, T): equal by chance 1 time in 10
    # A fresh iterator at the saved position continues the same stream.
    resumed = iter(batching.token_loader(tokens, B_, T, seed=3))
    resumed.set_state(saved)
    for want in cont:
        np.testing.assert_array_equal(next(resumed), want)
    # Same seed -> same stream; another seed -> another, and its state is refused.
    np.testing.assert_array_equal(next(iter(batching.token_loader(tokens, B_, T, 3))), first[0])
    other = iter(batching.token_loader(tokens, B_, T, seed=4))
    assert not np.array_equal(next(other), first[0])
    with pytest.raises(ValueError, match="Sampler in checkpoint does not match"):
        other.set_state(saved)
    # Three processes: each reads batches of B/3 rows from its own contiguous third of
    # the slots, and the thirds do not overlap.
    seen = []
    for p in range(3):
        shard = grain.sharding.ShardOptions(p, 3, drop_remainder=True)
        its = iter(batching.token_loader(tokens, B_, T, seed=3, shard_options=shard))
        mine = {s // T for _ in range(40) for s in _starts(tokens, next(its))}
        lo, hi = p * (slots // 3), (p + 1) * (slots // 3)
        assert mine == set(range(lo, hi))  # 80 windows cover the 66 slots of the shard
        seen.append(mine)
    assert not (seen[0] & seen[1]) and not (seen[1] & seen[2])
    with pytest.raises(ValueError, match="divisible by the process count"):
        batching.token_loader(tokens, 5, T, shard_options=grain.sharding.ShardOptions(0, 2))
    with pytest.raises(ValueError, match="too few"):
        batching.token_loader(tokens[:50], B_, T)
    with pytest.raises(ValueError, match="seq_len"):
        batching.token_loader(tokens, B_, 0)


def _multiset(tokens, mask):
    return sorted(t.tobytes() + m.tobytes() for t, m in zip(tokens, mask, strict=True))


def _stream(it, n_rows):
    """The first ``n_rows`` rows an iterator serves, as (tokens, mask)."""
    got = []
    while sum(len(g["tokens"]) for g in got) < n_rows:
        got.append(next(it))
    toks = np.concatenate([g["tokens"] for g in got])[:n_rows]
    return toks, np.concatenate([g["mask"] for g in got])[:n_rows]


def test_biography_rows_epochs_resume_and_shards():
    data = B.make_biographies(B.BiographyConfig(m=4, seed=3))
    rows, masks = data.train_tokens, data.train_mask
    n = rows.shape[0]
    it = iter(data.loader(batch_size=16, seed=1))
    # The first epoch serves every training row once, each with its own mask.
    toks, mask = _stream(it, n)
    assert toks.dtype == np.int32 and mask.dtype == np.float32
    assert _multiset(toks, mask) == _multiset(rows, masks)
    saved = it.get_state()
    want = [next(it) for _ in range(2 * n // 16)]  # two more epochs
    resumed = iter(data.loader(batch_size=16, seed=1))
    resumed.set_state(saved)
    for w in want:
        got = next(resumed)
        np.testing.assert_array_equal(got["tokens"], w["tokens"])
        np.testing.assert_array_equal(got["mask"], w["mask"])
    # Two processes: batches of 8 rows; process p's first epoch is its half of the rows.
    half = n // 2
    for p in range(2):
        shard = grain.sharding.ShardOptions(p, 2, drop_remainder=True)
        its = iter(data.loader(16, seed=1, shard_options=shard))
        assert next(iter(data.loader(16, seed=1, shard_options=shard)))["tokens"].shape[0] == 8
        toks, mask = _stream(its, half)
        lo = p * half
        assert _multiset(toks, mask) == _multiset(rows[lo : lo + half], masks[lo : lo + half])


def test_eval_batches_sequential():
    tokens = np.arange(1000, dtype=np.int32)
    batches = list(batching.eval_batches(tokens, 4, 9))
    assert len(batches) == (999 // 9) // 4
    np.testing.assert_array_equal(batches[1][2], np.arange(6 * 9, 6 * 9 + 10))
    halves = [
        list(batching.eval_batches(tokens, 4, 9, max_batches=2, process_index=p, process_count=2))
        for p in range(2)
    ]
    np.testing.assert_array_equal(np.concatenate([halves[0][1], halves[1][1]]), batches[1])
