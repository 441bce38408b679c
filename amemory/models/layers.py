"""Small building blocks shared by the decoder's modules (attention, feed-forward, blocks).

Every function takes the decoder's :class:`amemory.models.transformer.TransformerConfig`
(read duck-typed, so this module imports nothing of amemory): ``linear`` builds a
role-named 2-D kernel, ``norm`` the configured normalisation, ``rope`` rotates by
absolute positions (so a KV cache can rotate new tokens at their offset), ``attend`` is
causal softmax attention over a key set, ``dropout`` the inverted dropout of blocks.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def check_ints(obj: Any, where: str, minimums: dict[str, int]) -> None:
    """Raise ``ValueError`` unless each field ``obj.<name>`` is an integer ``>= minimums[name]``.

    ``where`` prefixes the message, e.g. ``"TransformerConfig.moe"``.
    """
    for name, lo in minimums.items():
        v = getattr(obj, name)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise ValueError(f"{where}.{name} must be an integer >= {lo}, got {v!r}")


def norm(config: Any, features: int, rngs: nnx.Rngs) -> nnx.Module:
    """``nnx.LayerNorm`` or ``nnx.RMSNorm`` over the last axis (``config.norm``)."""
    kw = dict(epsilon=config.norm_eps, dtype=config.dtype, param_dtype=config.param_dtype)
    if config.norm == "layernorm":
        return nnx.LayerNorm(features, rngs=rngs, **kw)
    return nnx.RMSNorm(features, rngs=rngs, **kw)


def linear(
    config: Any, d_in: int, d_out: int, std: float, rngs: nnx.Rngs, *,
    use_bias: bool | None = None, dtype: Any = None,
) -> nnx.Linear:  # fmt: skip
    """``nnx.Linear`` with kernel ``[d_in, d_out]`` ~ N(0, std^2), parameters in
    ``config.param_dtype``; bias if ``use_bias`` (default ``config.use_bias``), compute in
    ``dtype`` (default ``config.dtype``)."""
    return nnx.Linear(
        d_in,
        d_out,
        use_bias=config.use_bias if use_bias is None else use_bias,
        kernel_init=nnx.initializers.normal(std),
        dtype=config.dtype if dtype is None else dtype,
        param_dtype=config.param_dtype,
        rngs=rngs,
    )


def split_batch(x: jax.Array) -> jax.Array:
    """``x [B, ...]`` with its leading (batch) axis split over every ``Auto`` axis of the mesh
    in context, the layout of FSDP (``amemory.train.parallel``: each device holds distinct
    rows, parameters are all-gathered where they are used). Without a mesh, on ``Explicit``
    axes (whose types already say how ``x`` is split), or when ``B`` does not divide over
    the axes, ``x`` unchanged.

    Inside a scanned block the partitioner would otherwise be free to all-gather the batch
    of activations rather than the layer's weights (MaxText constrains its activations for
    the same reason: ``nn_partitioning.with_sharding_constraint`` in its decoder layers).
    """
    mesh = jax.sharding.get_abstract_mesh()
    axes = () if mesh.empty else mesh.auto_axes
    size = int(np.prod([mesh.shape[a] for a in axes]))
    if size == 1 or x.shape[0] % size:
        return x
    return jax.lax.with_sharding_constraint(x, jax.sharding.PartitionSpec(axes))


def dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    """Inverted dropout; identity when key is None or rate is 0."""
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


def rope(x: jax.Array, base: float, positions: jax.Array | None = None) -> jax.Array:
    """Rotary position embedding (Su et al. 2021, arXiv 2104.09864), rotate-half form.

    Args:
      x: ``[B, T, H, Dh]`` with ``Dh`` even.
      base: frequency base (10000 in the paper).
      positions: int ``[T]`` absolute positions of the T rows (default ``0..T-1``); a KV
        cache passes ``pos + arange(T)`` so cached keys keep their rotation.

    Returns:
      ``x`` rotated, same shape and dtype (computed in float32).
    """
    t, dh = x.shape[1], x.shape[-1]
    if positions is None:
        positions = jnp.arange(t)
    inv_freq = 1.0 / (base ** (jnp.arange(0, dh, 2, dtype=jnp.float32) / dh))  # (Dh/2,)
    angles = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]  # (T, Dh/2)
    cos = jnp.cos(angles)[None, :, None, :]  # (1, T, 1, Dh/2)
    sin = jnp.sin(angles)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def causal_mask(n_query: int, n_key: int, pos: jax.Array | int = 0) -> jax.Array:
    """Bool ``[n_query, n_key]``: query i (at position ``pos + i``) sees keys ``<= pos + i``."""
    q = pos + jnp.arange(n_query)[:, None]
    return jnp.arange(n_key)[None, :] <= q


def attend(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float
) -> tuple[jax.Array, jax.Array]:
    """Softmax attention ``softmax(scale q kᵀ + mask) v`` per head, scores in float32, and
    each head's largest attended pre-softmax logit (the statistic QK-Clip reads).

    Args:
      q: ``[B, S, H, Dk]`` queries.
      k: ``[B, T, H, Dk]`` keys.
      v: ``[B, T, H, Dv]`` values (``Dv`` may differ from ``Dk``, as in MLA).
      mask: bool ``[S, T]`` (or broadcastable to ``[B, H, S, T]``); False = not attended.
      scale: score multiplier, usually ``1 / sqrt(Dk)``.

    Returns:
      ``(y, max_logit)``: ``y [B, S, H, Dv]`` in ``v``'s dtype, ``max_logit [H]`` float32
      (over batch, queries and attended keys; no gradient flows through it).
    """
    s = jnp.einsum("bshd,bthd->bhst", q, k, preferred_element_type=jnp.float32) * scale
    s = jnp.where(mask, s, jnp.finfo(jnp.float32).min)
    p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
    return jnp.einsum("bhst,bthd->bshd", p, v), jax.lax.stop_gradient(jnp.max(s, (0, 2, 3)))
