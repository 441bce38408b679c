"""Causal self-attention of the decoder: multi-head (MHA) and multi-head latent (MLA).

Both classes have the same interface, selected by ``TransformerConfig.attention``
(:data:`ATTENTIONS`):

* ``__call__(x [B, T, D]) -> (y [B, T, D], max_logit [H])``: full causal attention
  (training, evaluation) and each head's largest pre-softmax logit (for QK-Clip; Kimi K2,
  arXiv 2507.20534, Sec. 2.1), read from the scores the forward pass computes anyway;
* ``cache_spec(config, batch, length)``: the arrays a KV cache holds per layer;
* ``extend(x [B, S, D], cache, pos) -> (y [B, S, D], cache)``: S new tokens at absolute
  positions ``pos .. pos+S-1`` attend to the cached keys and to each other (causally);
  the cache is updated in place (functionally). Prefill is ``extend`` of the prompt at
  ``pos = 0``, decoding is ``extend`` of one token.

Every projection is a separate 2-D ``nnx.Linear`` kernel ``[d_in, d_out]`` named by its
role (:mod:`amemory.models.roles`).

MLA (DeepSeek-AI 2024, "DeepSeek-V2", arXiv 2405.04434, Sec. 2.1.2-2.1.3, eqs. 9-19),
with ``H`` heads of width ``d_h`` (= ``D / H``), latent width ``d_c``, query latent width
``d_c'`` and decoupled RoPE width ``d_R``::

    c_kv = x W_dkv                        kv_down  [D, d_c]      (cached)
    k^C  = c_kv W_uk, v = c_kv W_uv       k_up, v_up [d_c, H d_h]
    k^R  = RoPE(x W_kr)                   k_rope   [D, d_R]      (cached; shared by heads)
    c_q  = x W_dq                         q_down   [D, d_c']     (q_rank > 0; else c_q = x)
    q^C  = c_q W_uq                       q_up     [d_c', H d_h] (role "q" when q_rank = 0)
    q^R  = RoPE(c_q W_qr)                 q_rope   [d_c', H d_R]
    o_h  = softmax([q^C_h; q^R_h]·[k^C_h; k^R] / sqrt(d_h + d_R)) v_h,  y = [o_1..o_H] W_o

The cache holds only ``c_kv`` and ``k^R``: ``d_c + d_R`` numbers per token and layer
instead of MHA's ``2 H d_h``. At decode time ``W_uk`` is absorbed into the query
(``q^C_h · k^C_h = (W_uk,h q^C_h) · c_kv``) and ``W_uv`` is applied after the weighted
sum of latents (eq. 19 and the text after it), so keys and values are never expanded.
DeepSeek-V2's released code also RMS-normalises ``c_kv`` and ``c_q``; the paper does not,
nor do we.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from amemory.models.layers import attend, causal_mask, check_ints, linear, rope


@dataclasses.dataclass(frozen=True)
class MLAConfig:
    """Widths of multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, Sec. 2.1).

    None means "DeepSeek-V2's ratio to the head width ``d_h``", resolved by
    :meth:`resolve`: ``kv_rank = 4 d_h`` (d_c = 512 for d_h = 128), ``rope_dim = d_h / 2``
    rounded down to even (d_R = 64). Per-head query/key (non-RoPE) and value widths are
    ``d_h``, as in DeepSeek-V2.

    Attributes:
      kv_rank: d_c, width of the shared key-value latent ``c_kv`` (cached).
      rope_dim: d_R, width of the decoupled RoPE key (cached) and of each head's RoPE
        query; even.
      q_rank: d_c', width of the query latent; 0 = queries not compressed (as in
        DeepSeek-V2-Lite): one ``q`` kernel ``[D, H d_h]`` and ``q_rope`` ``[D, H d_R]``.
    """

    kv_rank: int | None = None
    rope_dim: int | None = None
    q_rank: int = 0

    def resolve(self, head_dim: int) -> MLAConfig:
        """A copy with None fields set from ``head_dim``; ``ValueError`` for a width that is
        not a positive integer (``q_rank`` may be 0) or an odd ``rope_dim``."""
        out = MLAConfig(
            kv_rank=4 * head_dim if self.kv_rank is None else self.kv_rank,
            rope_dim=2 * max(1, head_dim // 4) if self.rope_dim is None else self.rope_dim,
            q_rank=self.q_rank,
        )
        check_ints(out, "TransformerConfig.mla", {"kv_rank": 1, "rope_dim": 2, "q_rank": 0})
        if out.rope_dim % 2:
            raise ValueError(f"TransformerConfig.mla.rope_dim must be even, got {out.rope_dim}")
        return out


def _write(cache: dict, new: dict, pos: jax.Array) -> dict:
    """``cache`` with each ``new[name] [B, S, ...]`` written at sequence positions ``pos..``."""
    out = {}
    for n, x in new.items():
        start = (0, pos) + (0,) * (x.ndim - 2)
        out[n] = jax.lax.dynamic_update_slice(cache[n], x.astype(cache[n].dtype), start)
    return out


class Attention(nnx.Module):
    """Causal self-attention with separate 2-D kernels: q, o ``[D, D]``; k, v ``[D, H_kv d_h]``
    (``config.kv_heads``: H = MHA, 1 = MQA, else GQA; query head h reads K/V head
    ``h // (H / H_kv)``, as Llama's ``repeat_kv``)."""

    def __init__(self, config: Any, *, rngs: nnx.Rngs):
        d, std, d_kv = config.d_model, config.init_std, config.kv_heads * config.head_dim
        self.config = config
        self.q = linear(config, d, d, std, rngs)
        self.k = linear(config, d, d_kv, std, rngs)
        self.v = linear(config, d, d_kv, std, rngs)
        self.o = linear(config, d, d, std / math.sqrt(2 * config.n_layers), rngs)
        if config.qk_norm:
            kw = dict(epsilon=config.norm_eps, dtype=config.dtype, param_dtype=config.param_dtype)
            self.q_norm = nnx.RMSNorm(config.head_dim, rngs=rngs, **kw)
            self.k_norm = nnx.RMSNorm(config.head_dim, rngs=rngs, **kw)

    def _qkv(self, x: jax.Array, positions: jax.Array | None):
        c = self.config
        b, t, _ = x.shape
        q = self.q(x).reshape(b, t, c.n_heads, c.head_dim)  # (B, T, H, Dh)
        k = self.k(x).reshape(b, t, c.kv_heads, c.head_dim)  # (B, T, H_kv, Dh)
        v = self.v(x).reshape(b, t, c.kv_heads, c.head_dim)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if c.position == "rope":
            q, k = rope(q, c.rope_base, positions), rope(k, c.rope_base, positions)
        return q, k, v

    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        b, t, _ = x.shape
        q, k, v = self._qkv(x, None)
        scale = 1.0 / math.sqrt(self.config.head_dim)
        y, top = attend(q, *self._grouped(k, v), causal_mask(t, t), scale)  # (B, T, H, Dh), (H,)
        return self.o(y.reshape(b, t, self.config.d_model)), top  # (B, T, D)

    def _grouped(self, k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
        """K/V ``[B, T, H_kv, Dh]`` -> ``[B, T, H, Dh]``, each K/V head repeated for its
        ``H / H_kv`` query heads."""
        group = self.config.n_heads // self.config.kv_heads
        return jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)

    @staticmethod
    def cache_spec(config: Any, batch: int, length: int) -> dict[str, tuple[int, ...]]:
        """Cached arrays per layer: ``k``, ``v`` ``[B, L, H_kv, Dh]`` (keys after RoPE)."""
        shape = (batch, length, config.kv_heads, config.head_dim)
        return {"k": shape, "v": shape}

    def extend(self, x: jax.Array, cache: dict, pos: jax.Array) -> tuple[jax.Array, dict]:
        """Attend S new tokens ``x [B, S, D]`` at positions ``pos..pos+S-1`` through the cache.

        Returns ``(y [B, S, D], cache)`` with the new keys and values written at ``pos``.
        """
        b, s, _ = x.shape
        q, k, v = self._qkv(x, pos + jnp.arange(s))
        cache = _write(cache, {"k": k, "v": v}, pos)
        mask = causal_mask(s, cache["k"].shape[1], pos)
        k, v = self._grouped(cache["k"], cache["v"])
        y, _ = attend(q, k, v, mask, 1.0 / math.sqrt(self.config.head_dim))
        return self.o(y.reshape(b, s, self.config.d_model)), cache


class MLAttention(nnx.Module):
    """Multi-head latent attention (DeepSeek-V2); see the module docstring for the equations."""

    def __init__(self, config: Any, *, rngs: nnx.Rngs):
        c, m = config, config.mla_dims
        d, h, dh, std = c.d_model, c.n_heads, c.head_dim, c.init_std
        self.config = config
        if m.q_rank:
            self.q_down = linear(c, d, m.q_rank, std, rngs)  # W_dq
            self.q_up = linear(c, m.q_rank, h * dh, std, rngs)  # W_uq
            self.q_rope = linear(c, m.q_rank, h * m.rope_dim, std, rngs)  # W_qr
        else:
            self.q = linear(c, d, h * dh, std, rngs)
            self.q_rope = linear(c, d, h * m.rope_dim, std, rngs)
        self.kv_down = linear(c, d, m.kv_rank, std, rngs)  # W_dkv
        self.k_up = linear(c, m.kv_rank, h * dh, std, rngs)  # W_uk
        self.v_up = linear(c, m.kv_rank, h * dh, std, rngs)  # W_uv
        self.k_rope = linear(c, d, m.rope_dim, std, rngs)  # W_kr
        self.o = linear(c, h * dh, d, std / math.sqrt(2 * c.n_layers), rngs)

    def _queries(self, x: jax.Array, positions: jax.Array | None):
        c, m = self.config, self.config.mla_dims
        b, s, _ = x.shape
        if m.q_rank:
            cq = self.q_down(x)  # (B, S, d_c')
            q_c = self.q_up(cq)
        else:
            cq, q_c = x, self.q(x)
        q_c = q_c.reshape(b, s, c.n_heads, c.head_dim)  # (B, S, H, d_h)
        q_r = self.q_rope(cq).reshape(b, s, c.n_heads, m.rope_dim)
        return q_c, rope(q_r, c.rope_base, positions)  # (B, S, H, d_R)

    def _latents(self, x: jax.Array, positions: jax.Array | None):
        b, s, _ = x.shape
        c_kv = self.kv_down(x)  # (B, S, d_c)
        k_r = rope(self.k_rope(x)[:, :, None, :], self.config.rope_base, positions)
        return c_kv, k_r[:, :, 0, :]  # (B, S, d_R)

    def _scale(self) -> float:
        return 1.0 / math.sqrt(self.config.head_dim + self.config.mla_dims.rope_dim)

    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        c = self.config
        b, t, _ = x.shape
        h, dh, dr = c.n_heads, c.head_dim, c.mla_dims.rope_dim
        q_c, q_r = self._queries(x, None)
        c_kv, k_r = self._latents(x, None)
        k_c = self.k_up(c_kv).reshape(b, t, h, dh)
        v = self.v_up(c_kv).reshape(b, t, h, dh)
        q = jnp.concatenate([q_c, q_r], axis=-1)  # (B, T, H, d_h + d_R)
        k = jnp.concatenate([k_c, jnp.broadcast_to(k_r[:, :, None, :], (b, t, h, dr))], axis=-1)
        y, top = attend(q, k, v, causal_mask(t, t), self._scale())  # (B, T, H, d_h), (H,)
        return self.o(y.reshape(b, t, h * dh)), top

    @staticmethod
    def cache_spec(config: Any, batch: int, length: int) -> dict[str, tuple[int, ...]]:
        """Cached arrays per layer: the latent ``c_kv [B, L, d_c]`` and ``k_rope [B, L, d_R]``."""
        return {
            "c_kv": (batch, length, config.mla_dims.kv_rank),
            "k_rope": (batch, length, config.mla_dims.rope_dim),
        }

    def extend(self, x: jax.Array, cache: dict, pos: jax.Array) -> tuple[jax.Array, dict]:
        """Absorbed-projection attention of S new tokens ``x [B, S, D]`` through the latent
        cache (module docstring; DeepSeek-V2 Sec. 2.1.2). Returns ``(y [B, S, D], cache)``."""
        c = self.config
        b, s, _ = x.shape
        h, dh, dc = c.n_heads, c.head_dim, c.mla_dims.kv_rank
        positions = pos + jnp.arange(s)
        q_c, q_r = self._queries(x, positions)
        c_new, k_r_new = self._latents(x, positions)
        cache = _write(cache, {"c_kv": c_new, "k_rope": k_r_new}, pos)
        c_kv, k_r = cache["c_kv"], cache["k_rope"]  # (B, L, d_c), (B, L, d_R)
        w_uk = self.k_up.kernel[...].astype(q_c.dtype).reshape(dc, h, dh)
        w_uv = self.v_up.kernel[...].astype(q_c.dtype).reshape(dc, h, dh)
        q_lat = jnp.einsum("bshn,chn->bshc", q_c, w_uk)  # (B, S, H, d_c): W_uk absorbed
        f32 = jnp.float32
        scores = jnp.einsum("bshc,btc->bhst", q_lat, c_kv, preferred_element_type=f32)
        scores += jnp.einsum("bshr,btr->bhst", q_r, k_r, preferred_element_type=f32)
        mask = causal_mask(s, c_kv.shape[1], pos)
        scores = jnp.where(mask, scores * self._scale(), jnp.finfo(f32).min)
        p = jax.nn.softmax(scores, axis=-1).astype(c_kv.dtype)
        o_lat = jnp.einsum("bhst,btc->bshc", p, c_kv)  # (B, S, H, d_c)
        y = jnp.einsum("bshc,chv->bshv", o_lat, w_uv)  # (B, S, H, d_h): W_uv after the sum
        return self.o(y.reshape(b, s, h * dh)), cache


# Registry of attention kinds (TransformerConfig.attention).
ATTENTIONS: dict[str, type[nnx.Module]] = {"mha": Attention, "mla": MLAttention}
