"""Checkpoint integrity: a per-leaf digest computed on the device, its check, and the move
of a damaged step aside (Orbax checks no array bytes)."""

from __future__ import annotations

import pathlib
import shutil
from typing import Any

import jax
import jax.numpy as jnp

#: Name of the digest written into ``extra["integrity"]["digest"]`` (bump if it changes).
DIGEST = "u32sum+u32possum/v1"


class NonFiniteStateError(RuntimeError):
    """``save`` was asked to write NaN/inf; ``counts``: ``{leaf name: non-finite entries}``."""

    def __init__(self, step: int, counts: dict[str, int]):
        self.step, self.counts = int(step), dict(counts)
        super().__init__(
            f"state of step {step} has non-finite values in {_worst(counts)}; not saved"
        )


class CorruptCheckpointError(RuntimeError):
    """A checkpoint step cannot be read back as saved (raised and caught inside restore)."""


def _worst(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} ({v})" for k, v in list(counts.items())[:3])


def leaf_names(tree: Any) -> dict[str, Any]:
    """``{"opt_state.0.mu.layers.0.w": leaf}``: dotted names as Orbax records them."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(path, simple=True, separator="."): x for path, x in flat}


def _words(x: jax.Array) -> jax.Array:
    """The bit pattern of ``x`` as uint32 words (flat): floats bitcast, ints/bools cast."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        return x.reshape(-1).astype(jnp.uint32)
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
    w = jax.lax.bitcast_convert_type(x, unsigned)  # 8-byte types get a trailing axis of 2
    return w.reshape(-1).astype(jnp.uint32)


@jax.jit
def _digest_tree(tree: Any) -> Any:
    def leaf(x):
        w = _words(x)
        pos = jnp.arange(1, w.size + 1, dtype=jnp.uint32)
        bad = jnp.sum(~jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.inexact) else 0
        # uint32 arithmetic wraps: sums are exact modulo 2**32, whatever the reduction order
        return jnp.stack([jnp.sum(w, dtype=jnp.uint32), jnp.sum(w * pos, dtype=jnp.uint32),
                          jnp.asarray(bad, jnp.uint32)])  # fmt: skip

    return jax.tree.map(leaf, tree)


def state_digest(state: Any) -> tuple[dict[str, list[int]], dict[str, int]]:
    """``({leaf name: [sum, weighted sum]}, {leaf name: non-finite count > 0})`` of a pytree.

    For leaf words ``w_i`` (the bit pattern as uint32, i = 1..n row-major) the digest is
    ``[sum_i w_i, sum_i i * w_i]`` modulo 2**32, exact integer reductions on the device
    (independent of sharding and reduction order). A Fletcher-style checksum (J. G.
    Fletcher, IEEE Trans. Commun. 30(1), 1982) over 32-bit words.
    """
    out = leaf_names(jax.device_get(_digest_tree(state)))
    digest = {k: [int(v[0]), int(v[1])] for k, v in out.items()}
    return digest, {k: int(v[2]) for k, v in out.items() if int(v[2])}


def record(state: Any, step: int) -> dict:
    """``extra["integrity"]`` of ``state`` saved as ``step``; ``NonFiniteStateError`` on NaN/inf."""
    digest, bad = state_digest(state)
    if bad:
        raise NonFiniteStateError(step, bad)
    return {"digest": DIGEST, "leaves": digest}


def verify(state: Any, extra: dict) -> bool:
    """Check a restored ``state`` against ``extra``'s digest and for NaN/inf; False when
    ``extra`` holds no digest. ``CorruptCheckpointError`` names the first bad leaf."""
    digest, bad = state_digest(state)
    if bad:
        raise CorruptCheckpointError(f"non-finite values restored in {_worst(bad)}")
    saved = (extra.get("integrity") or {}).get("leaves")
    for name, want in (saved or {}).items():
        if digest.get(name) != list(want):
            raise CorruptCheckpointError(
                f"checksum mismatch in {name} (saved {want}, read {digest.get(name)}): the data "
                "on disk changed after it was written"
            )
    return saved is not None


def reject(step_dir: pathlib.Path, reason: str, move: bool = True) -> pathlib.Path:
    """Move ``step_dir`` to ``<its parent>-rejected/<step>[.n]`` with a ``REASON.txt``; the new
    path (``move=False``: only the path, for processes other than 0)."""
    root = step_dir.parent.with_name(step_dir.parent.name + "-rejected")
    dest, n = root / step_dir.name, 0
    while dest.exists():
        n += 1
        dest = root / f"{step_dir.name}.{n}"
    if not move:
        return dest
    root.mkdir(parents=True, exist_ok=True)
    shutil.move(str(step_dir), dest)
    (dest / "REASON.txt").write_text(reason + "\n")
    return dest
