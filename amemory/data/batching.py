"""Training input on Grain, plus deterministic evaluation windows.

Training batches come from ``grain.DataLoader`` (as in the Flax examples and MaxText): a
random-access source, an ``IndexSampler`` that shuffles every epoch and gives process ``p``
of ``P`` a contiguous ``1/P`` of the records (``ShardByJaxProcess``), batches of ``B / P``
rows, and an iterator whose state (``get_state`` / ``set_state``) is checkpointed with the
model, so a resumed run continues the exact data order. A step's global batch concatenates
the processes' batches (``jax.make_array_from_process_local_data``). The records:

* :class:`TokenWindows` + :class:`RandomCrop`: slot ``i`` covers tokens ``[i T, i T + 2T)``
  of a flat stream and the crop keeps ``T + 1`` of them from a random offset in ``[0, T)``
  drawn per (epoch, position), so window boundaries move between epochs;
* :class:`MaskedRows`: fixed padded rows with a loss mask (:mod:`amemory.data.biographies`).

:func:`eval_batches` yields the same sequential validation windows on every call.
"""

from __future__ import annotations

import numbers
import zlib
from collections.abc import Iterator

import grain
import numpy as np

from amemory.data.frequencies import _check_int


def _fingerprint(a: np.ndarray) -> int:
    """CRC32 of up to 4096 evenly spaced entries: identifies an array in a loader's repr."""
    flat = a.reshape(-1)
    step = max(1, flat.size // 4096)
    return zlib.crc32(np.ascontiguousarray(flat[::step]).tobytes())


class TokenWindows:
    """Grain source of ``2T``-token slots: record ``i`` is ``tokens[i T : i T + 2T]`` (int32),
    for :class:`RandomCrop`; ``len = (N - T) // T``.

    Args:
      tokens: ``[N]`` integer token ids (np array or memmap).
      seq_len: T.

    Raises:
      ValueError: naming the argument for a non-1-D / non-integer stream or a bad T.
    """

    def __init__(self, tokens, seq_len: int):
        self.seq_len = _check_int("seq_len", seq_len, 1)
        if not hasattr(tokens, "ndim"):
            tokens = np.asarray(tokens)
        if tokens.ndim != 1:
            raise ValueError(f"tokens must be a 1-D array, got shape {tokens.shape}")
        if not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(f"tokens must hold integers, got dtype {tokens.dtype}")
        self.tokens = tokens
        self._repr = (
            f"TokenWindows(n_tokens={tokens.shape[0]}, seq_len={self.seq_len}, "
            f"crc={_fingerprint(np.asarray(tokens[: 1 << 20]))})"
        )

    def __len__(self) -> int:
        return max(0, (int(self.tokens.shape[0]) - self.seq_len) // self.seq_len)

    def __getitem__(self, i: int) -> np.ndarray:
        T = self.seq_len
        return np.asarray(self.tokens[i * T : i * T + 2 * T], dtype=np.int32)

    def __repr__(self) -> str:  # Grain compares it on restore: no object address
        return self._repr


class RandomCrop(grain.transforms.RandomMap):
    """``[2T]`` slot -> ``[T + 1]`` window from a random offset in ``[0, T)`` (Grain transform)."""

    def __init__(self, seq_len: int):
        self.seq_len = seq_len

    def random_map(self, element: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        off = int(rng.integers(0, self.seq_len))
        return element[off : off + self.seq_len + 1]


class MaskedRows:
    """Random-access source of padded rows ``{"tokens": int32 [T], "mask": float32 [T]}``.

    Raises:
      ValueError: unless tokens and mask are both ``[N, T]``.
    """

    def __init__(self, tokens: np.ndarray, mask: np.ndarray):
        tokens, mask = np.asarray(tokens), np.asarray(mask)
        if tokens.ndim != 2 or mask.shape != tokens.shape:
            raise ValueError(
                f"tokens and mask must both be [N, T]; got {tokens.shape} and {mask.shape}"
            )
        self.tokens = tokens.astype(np.int32, copy=False)
        self.mask = mask.astype(np.float32, copy=False)
        self._repr = (
            f"MaskedRows(shape={tokens.shape}, crc={_fingerprint(tokens)}/{_fingerprint(mask)})"
        )

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {"tokens": self.tokens[i], "mask": self.mask[i]}

    def __repr__(self) -> str:
        return self._repr


def _loader(
    source,
    transforms: list,
    batch_size: int,
    seed: int,
    shard_options: grain.sharding.ShardOptions | None,
) -> grain.DataLoader:
    batch_size = _check_int("batch_size", batch_size, 1)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an integer in [0, 2**32), got {seed!r}")
    shard = shard_options or grain.sharding.ShardByJaxProcess(drop_remainder=True)
    if batch_size % shard.shard_count:
        raise ValueError(
            f"batch_size={batch_size} must be divisible by the process count {shard.shard_count}"
        )
    if len(source) < batch_size:
        raise ValueError(
            f"{source!r} has {len(source)} records, too few for batch_size={batch_size}; "
            "reduce batch_size or seq_len"
        )
    sampler = grain.samplers.IndexSampler(
        len(source), shard_options=shard, shuffle=True, num_epochs=None, seed=int(seed)
    )
    return grain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=[*transforms, grain.transforms.Batch(batch_size // shard.shard_count, True)],
        # The records are in memory: read them in the loader's thread, no worker processes
        # or reader threads (Grain's advice for in-memory data); the loop prefetches.
        worker_count=0,
        shard_options=shard,
        read_options=grain.ReadOptions(num_threads=0, prefetch_buffer_size=0),
    )


def token_loader(
    tokens,
    batch_size: int,
    seq_len: int,
    seed: int = 0,
    *,
    shard_options: grain.sharding.ShardOptions | None = None,
) -> grain.DataLoader:
    """Grain loader of shuffled ``T + 1``-token windows of ``tokens``, every epoch anew.

    Yields int32 ``[batch_size / P, seq_len + 1]`` forever (every epoch a new order and
    new crop offsets). ``set_state(get_state())`` on a fresh iterator of an identical
    loader continues the same stream (Grain checks the sampler and source match).

    Args:
      tokens: ``[N]`` token ids; seq_len: T.
      batch_size: B, GLOBAL rows per step, divisible by the process count P.
      seed: shuffle / crop seed in ``[0, 2**32)``.
      shard_options: Grain sharding (default ``ShardByJaxProcess(drop_remainder=True)``:
        process p reads the p-th contiguous ``1/P`` of the windows).

    Raises:
      ValueError: naming the argument for bad sizes, or a stream with fewer than B windows.
    """
    src = TokenWindows(tokens, seq_len)
    return _loader(src, [RandomCrop(src.seq_len)], batch_size, seed, shard_options)


def row_loader(
    tokens: np.ndarray,
    mask: np.ndarray,
    batch_size: int,
    seed: int = 0,
    *,
    shard_options: grain.sharding.ShardOptions | None = None,
) -> grain.DataLoader:
    """Grain loader of shuffled rows ``{"tokens": int32 [B / P, T], "mask": float32 [B / P, T]}``,
    with :func:`token_loader`'s contract (global ``batch_size``, checkpointable iterator).

    Raises:
      ValueError: naming the argument for bad shapes or sizes.
    """
    return _loader(MaskedRows(tokens, mask), [], batch_size, seed, shard_options)


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

    Window i holds tokens [i T, i T + T + 1); the last partial global batch is dropped;
    process p gets rows ``[p B/P, (p+1) B/P)`` of each global batch.

    Args:
      tokens: [N] token ids; seq_len: T.
      batch_size: global rows per batch, divisible by ``process_count``.
      max_batches: stop after this many batches (None: the whole stream).
      process_index / process_count: this process and the number of processes.

    Yields:
      int32 [batch_size / process_count, seq_len + 1].

    Raises:
      ValueError: naming the argument when invalid or when not even one batch fits.
    """
    batch_size = _check_int("batch_size", batch_size, 1)
    seq_len = _check_int("seq_len", seq_len, 1)
    process_count = _check_int("process_count", process_count, 1)
    process_index = _check_int("process_index", process_index, 0)
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
        n_batches = min(n_batches, _check_int("max_batches", max_batches, 1))
    local = batch_size // process_count
    window = np.arange(seq_len + 1)
    for b in range(n_batches):
        starts = (b * batch_size + process_index * local + np.arange(local)) * seq_len
        yield np.asarray(tokens[starts[:, None] + window], dtype=np.int32)
