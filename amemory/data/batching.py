"""Deterministic, resumable, multi-process batch iterators for language-model training.

* :class:`Batcher` (alias :data:`TokenStream`): contiguous windows of a flat token
  stream (a tokenized corpus), rows int32 [B / P, T + 1].
* :func:`eval_batches`: sequential, non-overlapping windows for evaluation.
* :class:`RowBatcher`: shuffled batches of fixed padded rows plus a loss mask
  (the synthetic biographies of :mod:`amemory.data.biographies`).

The window (row) order of a Batcher or RowBatcher is a pure function of (seed,
epoch), so its state is a small int64 array saved in checkpoints; evaluation
windows are the same on every call. Process p of P receives its own rows of each
global batch, so every process holds the same state.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator

import numpy as np

__all__ = ["Batcher", "TokenStream", "eval_batches", "RowBatcher"]


def _check_pos_int(name: str, v, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    return int(v)


class Batcher:
    """Deterministic, resumable, multi-process batches of contiguous token windows.

    Each epoch e cuts the token stream into non-overlapping windows of T + 1
    tokens starting at an epoch-dependent shift in [0, T) (so window boundaries
    move between epochs), shuffles the windows with ``np.random.default_rng([seed,
    e])`` and serves them ``batch_size`` at a time; the remainder of an epoch that
    does not fill a batch is dropped. ``batch_size`` is the GLOBAL batch: process p
    of P receives rows [p B/P, (p+1) B/P) of every global batch, so all processes
    hold the same state and can save/restore it identically (multi-host runs:
    every host builds a Batcher with its own ``process_index``; feed the local rows
    to ``jax.make_array_from_process_local_data``).

    Args:
      tokens: [N] integer token ids (np array or memmap), N >= batch_size * seq_len + 1.
      batch_size: B, global rows per batch, divisible by ``process_count``.
      seq_len: T, model context; rows have T + 1 tokens (inputs [:, :-1], targets [:, 1:]).
      seed: integer seed of the window order.
      process_index: this process, in [0, process_count).
      process_count: number of processes sharing the global batch.

    Raises:
      ValueError: naming the argument when sizes are invalid or the stream is too
        short to fill one batch.
    """

    def __init__(
        self,
        tokens,
        batch_size: int,
        seq_len: int,
        seed: int = 0,
        process_index: int = 0,
        process_count: int = 1,
    ):
        self.batch_size = _check_pos_int("batch_size", batch_size)
        self.seq_len = _check_pos_int("seq_len", seq_len)
        self.process_count = _check_pos_int("process_count", process_count)
        self.process_index = _check_pos_int("process_index", process_index, lo=0)
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.seed = int(seed)
        if self.process_index >= self.process_count:
            raise ValueError(
                f"process_index must lie in [0, process_count={self.process_count}), "
                f"got {self.process_index}"
            )
        if self.batch_size % self.process_count:
            raise ValueError(
                f"batch_size={self.batch_size} must be divisible by "
                f"process_count={self.process_count}"
            )
        if not hasattr(tokens, "ndim") or tokens.ndim != 1:
            tokens = np.asarray(tokens)
            if tokens.ndim != 1:
                raise ValueError(f"tokens must be a 1-D array, got shape {tokens.shape}")
        if not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(f"tokens must hold integers, got dtype {tokens.dtype}")
        self.tokens = tokens
        self.n_tokens = int(tokens.shape[0])
        need = self.batch_size * self.seq_len + self.seq_len + 1
        if self.n_tokens < need:
            raise ValueError(
                f"tokens has {self.n_tokens} tokens, too few for batch_size={self.batch_size} "
                f"windows of seq_len+1={self.seq_len + 1} (need at least {need}); "
                "reduce batch_size or seq_len"
            )
        self.local_batch = self.batch_size // self.process_count
        self._epoch = 0
        self._cursor = 0
        self._order_epoch = -1
        self._order: np.ndarray | None = None
        self._shift = 0

    # The order of one epoch is a pure function of (seed, epoch, n_tokens, seq_len).
    def _epoch_order(self, epoch: int) -> tuple[int, np.ndarray]:
        if self._order_epoch != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            shift = int(rng.integers(0, self.seq_len))
            n_windows = (self.n_tokens - 1 - shift) // self.seq_len
            self._shift = shift
            self._order = rng.permutation(n_windows)
            self._order_epoch = epoch
        return self._shift, self._order

    @property
    def batches_per_epoch(self) -> int:
        """Number of full global batches in the current epoch."""
        return len(self._epoch_order(self._epoch)[1]) // self.batch_size

    def next(self) -> np.ndarray:
        """The next batch for this process: int32 [batch_size / process_count, seq_len + 1]."""
        shift, order = self._epoch_order(self._epoch)
        if self._cursor + self.batch_size > len(order):
            self._epoch += 1
            self._cursor = 0
            shift, order = self._epoch_order(self._epoch)
        start = self._cursor + self.process_index * self.local_batch
        windows = order[start : start + self.local_batch]
        self._cursor += self.batch_size
        T1 = self.seq_len + 1
        starts = shift + windows * self.seq_len
        out = np.empty((self.local_batch, T1), dtype=np.int32)
        for r, s in enumerate(starts):
            out[r] = self.tokens[s : s + T1]
        return out

    def __iter__(self) -> Iterator[np.ndarray]:
        while True:
            yield self.next()

    def state(self) -> np.ndarray:
        """Position to checkpoint: int64 [4] = (epoch, cursor, seed % 2**31, n_tokens % 2**31).

        Every entry is < 2**31, so casting to int32 (e.g. ``jnp.asarray`` without
        x64) is lossless. The last two entries only guard :meth:`restore` against
        resuming on a different seed or stream.
        """
        return np.array(
            [self._epoch, self._cursor, self.seed % 2**31, self.n_tokens % 2**31], dtype=np.int64
        )

    def restore(self, state) -> None:
        """Continue from a saved :meth:`state`; the next :meth:`next` returns the batch
        that followed it in the original run.

        Raises:
          ValueError: naming ``state`` when it has the wrong shape, or was saved by a
            Batcher with a different seed or token stream.
        """
        s = np.asarray(state).astype(np.int64).ravel()
        if s.shape != (4,):
            raise ValueError(f"state must be an int array of shape [4], got shape {s.shape}")
        epoch, cursor, seed, n = (int(x) for x in s)
        if seed != self.seed % 2**31 or n != self.n_tokens % 2**31:
            raise ValueError(
                f"state was saved with seed={seed}, n_tokens%2**31={n}; this Batcher has "
                f"seed={self.seed}, n_tokens={self.n_tokens}"
            )
        if epoch < 0 or cursor < 0 or cursor % self.batch_size:
            raise ValueError(f"state has an invalid position epoch={epoch}, cursor={cursor}")
        self._epoch, self._cursor = epoch, cursor


#: Alias matching the interface contract's name for the token batch iterator.
TokenStream = Batcher


def eval_batches(
    tokens,
    batch_size: int,
    seq_len: int,
    *,
    max_batches: int | None = None,
    process_index: int = 0,
    process_count: int = 1,
) -> Iterator[np.ndarray]:
    """Sequential non-overlapping windows for evaluation, the same on every call.

    Window i holds tokens [i T, i T + T + 1). Global batches of ``batch_size``
    windows, the last partial batch dropped; process p gets its rows as in
    :class:`Batcher`.

    Args:
      tokens: [N] token ids.
      batch_size: global rows per batch, divisible by ``process_count``.
      seq_len: T.
      max_batches: stop after this many batches (None: the whole stream).
      process_index / process_count: as in :class:`Batcher`.

    Yields:
      int32 [batch_size / process_count, seq_len + 1].

    Raises:
      ValueError: naming the argument when invalid or when not even one batch fits.
    """
    batch_size = _check_pos_int("batch_size", batch_size)
    seq_len = _check_pos_int("seq_len", seq_len)
    process_count = _check_pos_int("process_count", process_count)
    process_index = _check_pos_int("process_index", process_index, lo=0)
    if process_index >= process_count or batch_size % process_count:
        raise ValueError(
            f"process_index must be < process_count and batch_size divisible by it; got "
            f"process_index={process_index}, process_count={process_count}, batch_size={batch_size}"
        )
    n_windows = (int(tokens.shape[0]) - 1) // seq_len
    n_batches = n_windows // batch_size
    if n_batches == 0:
        raise ValueError(
            f"tokens has {tokens.shape[0]} tokens, too few for one eval batch of "
            f"batch_size={batch_size} x seq_len+1={seq_len + 1}"
        )
    if max_batches is not None:
        n_batches = min(n_batches, _check_pos_int("max_batches", max_batches))
    local = batch_size // process_count
    for b in range(n_batches):
        first = b * batch_size + process_index * local
        out = np.empty((local, seq_len + 1), dtype=np.int32)
        for r in range(local):
            s = (first + r) * seq_len
            out[r] = tokens[s : s + seq_len + 1]
        yield out


class RowBatcher:
    """Deterministic, resumable batches of fixed rows (tokens and loss mask).

    Each epoch e shuffles the N rows with ``np.random.default_rng([seed, e])`` and
    serves global batches of ``batch_size`` rows (the remainder is dropped);
    process p of P gets rows [p B/P, (p+1) B/P) of each global batch. Same state
    convention as :class:`Batcher`.

    Args:
      tokens: int32 [N, T]; mask: float32 [N, T]; batch_size <= N, divisible by
      process_count; seed >= 0.

    Raises:
      ValueError: naming the invalid argument.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        mask: np.ndarray,
        batch_size: int,
        seed: int = 0,
        process_index: int = 0,
        process_count: int = 1,
    ):
        tokens, mask = np.asarray(tokens), np.asarray(mask)
        if tokens.ndim != 2 or mask.shape != tokens.shape:
            raise ValueError(
                f"tokens and mask must both be [N, T]; got {tokens.shape} and {mask.shape}"
            )
        for name, v, lo in (
            ("batch_size", batch_size, 1),
            ("process_count", process_count, 1),
            ("process_index", process_index, 0),
            ("seed", seed, 0),
        ):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
                raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
        if process_index >= process_count:
            raise ValueError(f"process_index must be < process_count={process_count}")
        if batch_size % process_count:
            raise ValueError(f"batch_size={batch_size} must be divisible by process_count")
        if batch_size > tokens.shape[0]:
            raise ValueError(f"batch_size={batch_size} exceeds the {tokens.shape[0]} rows")
        self.tokens, self.mask = tokens, mask
        self.batch_size, self.seed = int(batch_size), int(seed)
        self.process_index, self.process_count = int(process_index), int(process_count)
        self.local = self.batch_size // self.process_count
        self._epoch, self._cursor = 0, 0
        self._perm_epoch, self._perm = -1, None

    def _order(self) -> np.ndarray:
        if self._perm_epoch != self._epoch:
            rng = np.random.default_rng([self.seed, self._epoch])
            self._perm = rng.permutation(self.tokens.shape[0])
            self._perm_epoch = self._epoch
        return self._perm

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        """(tokens int32 [B/P, T], mask float32 [B/P, T]) for this process."""
        if self._cursor + self.batch_size > self.tokens.shape[0]:
            self._epoch, self._cursor = self._epoch + 1, 0
        order = self._order()
        start = self._cursor + self.process_index * self.local
        rows = order[start : start + self.local]
        self._cursor += self.batch_size
        return self.tokens[rows], self.mask[rows]

    def state(self) -> np.ndarray:
        """int64 [4] = (epoch, cursor, seed % 2**31, N); every entry < 2**31."""
        return np.array(
            [self._epoch, self._cursor, self.seed % 2**31, self.tokens.shape[0]], dtype=np.int64
        )

    def restore(self, state) -> None:
        """Continue from :meth:`state`. Raises ValueError naming ``state`` on mismatch."""
        s = np.asarray(state).astype(np.int64).ravel()
        if s.shape != (4,) or s[2] != self.seed % 2**31 or s[3] != self.tokens.shape[0]:
            raise ValueError(
                f"state {s.tolist()} does not belong to this RowBatcher "
                f"(seed={self.seed}, rows={self.tokens.shape[0]})"
            )
        if s[0] < 0 or s[1] < 0 or s[1] % self.batch_size:
            raise ValueError(f"state has an invalid position {s.tolist()}")
        self._epoch, self._cursor = int(s[0]), int(s[1])
