"""A decoder-only transformer in Flax NNX whose parameter paths name their roles.

Read top to bottom: :class:`TransformerConfig` and :func:`preset`, the modules
(:class:`Attention`, :class:`MLP`, :class:`Block`, :class:`Transformer`), the functional
API used by the training loop (:func:`init`, :func:`apply`), then roles
(:func:`role_of`, :func:`param_roles`, from :mod:`amemory.models.roles`) and analysis
helpers (:func:`vo_maps`, :func:`ffn_matrices`, :func:`hidden_matrices`).

Design choices (papers.md A.3; peers.md "Routing of non-matrix parameters"):

* Q, K, V, O are four separate 2-D ``nnx.Linear`` kernels of shape ``[d_model, d_model]``
  (never 3-D head-split kernels), and the FFN has ``w_in``/``w_out`` (GELU) or
  ``w_in``/``w_gate``/``w_out`` (SwiGLU), so an optimizer router and a spectrum logger see
  exactly one matrix per role and layer.
* Parameter paths read as roles, e.g. ``layers/3/attn/v/kernel`` -> ``"v"``. Every leaf
  has exactly one role among ``q, k, v, o, w_in, w_gate, w_out, embed, head, norm, bias``;
  :func:`role_of` raises ``ValueError`` on anything else, never guessing.
* Kernel layout is Flax's ``[d_in, d_out]`` (``y = x @ kernel``). Analysis helpers return
  the mathematical ``[d_out, d_in]`` (``y = W x``) form, i.e. ``kernel.T``.
* Dropout (off by default) is applied to the embeddings and to each residual branch
  output with keys derived from the ``rng`` argument, so the module holds no RNG state and
  the parameters are the whole model state. ``jax.nn.dot_product_attention`` has no
  attention-probability dropout, so there is none.

Parameter tree (``init`` returns it as a plain nested dict; list indices are ints)::

    embed/embedding              [V, D]        embed
    pos_embed/embedding          [max_len, D]  embed   (position="learned" only)
    layers/i/attn_norm/scale     [D]           norm    (+ bias for layernorm: norm)
    layers/i/attn/{q,k,v,o}/kernel [D, D]      q, k, v, o (+ bias: bias if use_bias)
    layers/i/attn/{q,k}_norm/scale [D/H]       norm    (qk_norm only)
    layers/i/mlp_norm/scale      [D]           norm
    layers/i/mlp/w_in/kernel     [D, F]        w_in
    layers/i/mlp/w_gate/kernel   [D, F]        w_gate  (ffn="swiglu" only)
    layers/i/mlp/w_out/kernel    [F, D]        w_out
    final_norm/scale             [D]           norm
    head/kernel                  [D, V]        head    (tied_head=False only)

With ``scan_layers=True`` the ``layers/i/...`` entries become one ``layers/...`` entry
whose leaves carry a leading layer axis, e.g. ``layers/attn/q/kernel [L, D, D]``
(:mod:`amemory.models.scan`; the roles are the same).

Example (multi-seed forward, as the training loop uses it)::

    >>> config = preset("tiny")
    >>> graphdef, params = init(config, jax.random.split(jax.random.key(0), 4))
    >>> tokens = jnp.zeros((2, 7), jnp.int32)
    >>> logits = jax.jit(jax.vmap(lambda p: apply(graphdef, p, tokens)))(params)
    >>> logits.shape  # [seeds, B, T, V]
    (4, 2, 7, 37)
    >>> param_roles(params)["layers"][1]["attn"]["v"]["kernel"]
    'v'
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from amemory.models.roles import ATTN_ROLES, FFN_ROLES, ROLES, matrix_axes, param_roles, role_of
from amemory.models.scan import (
    REMAT_POLICIES,
    is_scanned,
    remat,
    scan_blocks,
    stack_layers,
    stacked_modules,
    unstack_layers,
)

__all__ = [
    "ATTN_ROLES",
    "FFN_ROLES",
    "PRESETS",
    "REMAT_POLICIES",
    "ROLES",
    "Attention",
    "Block",
    "MLP",
    "Transformer",
    "TransformerConfig",
    "apply",
    "count_params",
    "ffn_matrices",
    "hidden_matrices",
    "init",
    "init_params",
    "is_scanned",
    "matrix_axes",
    "param_roles",
    "preset",
    "role_of",
    "stack_layers",
    "unstack_layers",
    "vo_maps",
]

_DTYPES = ("float32", "bfloat16", "float16", "float64")


# ----------------------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Shape and options of the decoder. Frozen and hashable (usable as a static jit arg).

    Attributes:
      vocab_size: V, number of token ids.
      d_model: D, residual width; must be divisible by ``n_heads``.
      n_layers: number of blocks.
      n_heads: H; head dim ``D / H`` must be even when ``position="rope"``.
      d_ff: F, FFN hidden width.
      max_len: longest sequence accepted (size of the learned position table).
      ffn: ``"gelu"`` (non-gated: w_in, w_out) or ``"swiglu"`` (gated: w_in, w_gate, w_out).
      norm: ``"layernorm"`` (scale and bias) or ``"rmsnorm"`` (scale); pre-norm blocks.
      position: ``"rope"`` (rotary on q, k) or ``"learned"`` (absolute table).
      qk_norm: RMS-normalise q and k per head (scale ``[D/H]``) before attention.
      tied_head: logits use the token embedding transposed (no ``head`` parameter).
      dropout: rate in ``[0, 1)`` on embeddings and residual branches (0 = off).
      remat: rematerialise each block in the backward pass (``jax.checkpoint``).
      remat_policy: what a rematerialised block keeps from the forward pass, a name of
        ``jax.checkpoint_policies`` (:data:`REMAT_POLICIES`; ``"nothing_saveable"``
        recomputes everything, ``"dots_with_no_batch_dims_saveable"`` keeps the matmuls).
      scan_layers: store the blocks' parameters stacked with a leading layer axis
        ``[L, ...]`` (paths ``layers/attn/q/kernel``) and run them with one
        ``jax.lax.scan`` over a single compiled block, instead of ``L`` separate blocks
        (paths ``layers/i/attn/q/kernel``) unrolled in the program. Same function, so
        :func:`stack_layers` / :func:`unstack_layers` convert parameters between the two.
      dtype: compute dtype name (``"float32"``, ``"bfloat16"``, ...); logits are float32.
        With ``param_dtype="float32"`` this is the usual mixed-precision policy: float32
        master weights (and optimizer state), matmuls and activations in ``dtype``.
      param_dtype: parameter dtype name.
      use_bias: biases in every Linear (GPT-2 style; role ``"bias"``).
      rope_base: RoPE frequency base.
      init_std: std of the normal initialisation of kernels and embeddings; the output
        projections ``o`` and ``w_out`` use ``init_std / sqrt(2 n_layers)`` (GPT-2).
      norm_eps: epsilon of every normalisation layer.
    """

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    max_len: int
    ffn: str = "gelu"
    norm: str = "layernorm"
    position: str = "rope"
    qk_norm: bool = False
    tied_head: bool = True
    dropout: float = 0.0
    remat: bool = False
    remat_policy: str = "nothing_saveable"
    scan_layers: bool = False
    dtype: str = "float32"
    param_dtype: str = "float32"
    use_bias: bool = False
    rope_base: float = 10000.0
    init_std: float = 0.02
    norm_eps: float = 1e-5

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_len"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"TransformerConfig.{name} must be a positive integer, got {v!r}")
        choices = {
            "ffn": ("gelu", "swiglu"),
            "norm": ("layernorm", "rmsnorm"),
            "position": ("rope", "learned"),
            "remat_policy": REMAT_POLICIES,
        }
        for name, allowed in choices.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(
                    f"TransformerConfig.{name} must be one of {allowed}, got {value!r}"
                )
        for name in ("dtype", "param_dtype"):
            v = getattr(self, name)
            try:
                canon = jnp.dtype(v).name
            except TypeError:
                canon = None
            if canon not in _DTYPES:
                raise ValueError(f"TransformerConfig.{name} must be one of {_DTYPES}, got {v!r}")
            object.__setattr__(self, name, canon)
        if self.d_model % self.n_heads:
            raise ValueError(
                f"TransformerConfig.d_model={self.d_model} must be divisible by "
                f"n_heads={self.n_heads}"
            )
        if self.position == "rope" and self.head_dim % 2:
            raise ValueError(
                f"TransformerConfig: position='rope' needs an even head dim, got "
                f"d_model/n_heads={self.head_dim}"
            )
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ValueError(f"TransformerConfig.dropout must lie in [0, 1), got {self.dropout}")
        for name in ("rope_base", "init_std", "norm_eps"):
            if not float(getattr(self, name)) > 0:
                raise ValueError(f"TransformerConfig.{name} must be > 0, got {getattr(self, name)}")

    @property
    def head_dim(self) -> int:
        """D / H."""
        return self.d_model // self.n_heads

    def replace(self, **overrides: Any) -> TransformerConfig:
        """A copy with fields replaced (validated again)."""
        return dataclasses.replace(self, **overrides)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict of all fields."""
        return dataclasses.asdict(self)


PRESETS: dict[str, TransformerConfig] = {
    # Tests: distinct small sizes (V=37, D=24, H=3 -> head dim 8, F=56, T<=19) so that a
    # transposed or mixed-up axis fails loudly.
    "tiny": TransformerConfig(
        vocab_size=37, d_model=24, n_layers=2, n_heads=3, d_ff=56, max_len=19,
        ffn="gelu", norm="rmsnorm", position="rope", tied_head=False,
    ),
    # CPU experiments: 7,342,336 parameters with V=8192 (override vocab_size from the data).
    "small": TransformerConfig(
        vocab_size=8192, d_model=256, n_layers=4, n_heads=8, d_ff=1024, max_len=256,
        ffn="gelu", norm="rmsnorm", position="rope", tied_head=False,
    ),
    # GPT-2 small (Radford et al. 2019): 124,439,808 parameters.
    "gpt2-small": TransformerConfig(
        vocab_size=50257, d_model=768, n_layers=12, n_heads=12, d_ff=3072, max_len=1024,
        ffn="gelu", norm="layernorm", position="learned", tied_head=True, use_bias=True,
    ),
    # Paper A ablation model, 162,220,800 parameters (see `preset`).
    "nanogpt-160m": TransformerConfig(
        vocab_size=50304, d_model=768, n_layers=12, n_heads=12, d_ff=3072, max_len=1024,
        ffn="gelu", norm="rmsnorm", position="rope", tied_head=False, use_bias=False,
    ),
}  # fmt: skip


def preset(name: str, **overrides: Any) -> TransformerConfig:
    """A named model configuration, optionally with fields overridden.

    Presets (parameter counts at the default vocabulary; closed form checked in tests):

    * ``tiny``: V=37, D=24, 2 layers, 3 heads (head dim 8), F=56, max_len 19, GELU,
      RMSNorm, RoPE, untied head. For tests.
    * ``small``: V=8192, D=256, 4 layers, 8 heads, F=1024, max_len 256, GELU, RMSNorm,
      RoPE, untied head: 7,342,336 parameters (5,245,184 of them outside the embeddings).
      Set ``vocab_size`` from the tokenizer. About 1 s per 32x128 training step on 2 CPU
      cores (measured.md).
    * ``gpt2-small``: GPT-2 124M: V=50257, D=768, 12 layers, 12 heads, F=3072, max_len
      1024, GELU, LayerNorm, learned positions, tied head, biases: 124,439,808 parameters.
    * ``nanogpt-160m``: the "160M NanoGPT" of paper A's ablation (Wang et al. 2025, A.3).
      The paper gives only the size; this is the modded-nanogpt GPT-2-small shape with an
      untied head, which lands at 160M: V=50304, D=768, 12 layers, 12 heads (head dim 64),
      F=3072, max_len 1024, non-gated GELU FFN, RMSNorm, RoPE, no biases, untied head:
      2 x 38,633,472 (embed + head) + 12 x 7,079,424 + 768 = 162,220,800 parameters.
      For the gated column of the ablation use ``preset("nanogpt-160m", ffn="swiglu",
      d_ff=2048)`` (same FFN parameter count, 162,220,800 in total).

    Args:
      name: one of ``PRESETS``.
      **overrides: any :class:`TransformerConfig` field.

    Raises:
      ValueError: for an unknown name, an unknown field, or an invalid value.
    """
    if name not in PRESETS:
        raise ValueError(f"preset name must be one of {tuple(PRESETS)}, got {name!r}")
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown TransformerConfig field(s) {unknown}; allowed: {sorted(fields)}")
    return dataclasses.replace(PRESETS[name], **overrides)


# ----------------------------------------------------------------------------- modules


def _norm(config: TransformerConfig, features: int, rngs: nnx.Rngs) -> nnx.Module:
    kw = dict(epsilon=config.norm_eps, dtype=config.dtype, param_dtype=config.param_dtype)
    if config.norm == "layernorm":
        return nnx.LayerNorm(features, rngs=rngs, **kw)
    return nnx.RMSNorm(features, rngs=rngs, **kw)


def _linear(config: TransformerConfig, d_in: int, d_out: int, std: float, rngs) -> nnx.Linear:
    return nnx.Linear(
        d_in,
        d_out,
        use_bias=config.use_bias,
        kernel_init=nnx.initializers.normal(std),
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        rngs=rngs,
    )


def _dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    """Inverted dropout; identity when key is None or rate is 0."""
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


def _rope(x: jax.Array, base: float) -> jax.Array:
    """Rotary position embedding (Su et al. 2021), rotate-half form, on x ``[B, T, H, Dh]``."""
    t, dh = x.shape[1], x.shape[-1]
    inv_freq = 1.0 / (base ** (jnp.arange(0, dh, 2, dtype=jnp.float32) / dh))  # (Dh/2,)
    angles = jnp.arange(t, dtype=jnp.float32)[:, None] * inv_freq[None, :]  # (T, Dh/2)
    cos = jnp.cos(angles)[None, :, None, :]  # (1, T, 1, Dh/2)
    sin = jnp.sin(angles)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


class Attention(nnx.Module):
    """Causal multi-head self-attention with separate 2-D q, k, v, o kernels ``[D, D]``."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        d, std = config.d_model, config.init_std
        self.config = config
        self.q = _linear(config, d, d, std, rngs)
        self.k = _linear(config, d, d, std, rngs)
        self.v = _linear(config, d, d, std, rngs)
        self.o = _linear(config, d, d, std / math.sqrt(2 * config.n_layers), rngs)
        if config.qk_norm:
            kw = dict(epsilon=config.norm_eps, dtype=config.dtype, param_dtype=config.param_dtype)
            self.q_norm = nnx.RMSNorm(config.head_dim, rngs=rngs, **kw)
            self.k_norm = nnx.RMSNorm(config.head_dim, rngs=rngs, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        c = self.config
        b, t, _ = x.shape
        heads = (b, t, c.n_heads, c.head_dim)
        q = self.q(x).reshape(heads)  # (B, T, H, Dh)
        k = self.k(x).reshape(heads)
        v = self.v(x).reshape(heads)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if c.position == "rope":
            q, k = _rope(q, c.rope_base), _rope(k, c.rope_base)
        y = jax.nn.dot_product_attention(q, k, v, is_causal=True)  # (B, T, H, Dh)
        return self.o(y.reshape(b, t, c.d_model))  # (B, T, D)


class MLP(nnx.Module):
    """FFN: ``w_out(gelu(w_in x))`` or SwiGLU ``w_out(silu(w_gate x) * w_in x)``."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        d, f, std = config.d_model, config.d_ff, config.init_std
        self.gated = config.ffn == "swiglu"
        self.w_in = _linear(config, d, f, std, rngs)
        if self.gated:
            self.w_gate = _linear(config, d, f, std, rngs)
        self.w_out = _linear(config, f, d, std / math.sqrt(2 * config.n_layers), rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.gated:
            h = jax.nn.silu(self.w_gate(x)) * self.w_in(x)  # (B, T, F)
        else:
            h = jax.nn.gelu(self.w_in(x))  # (B, T, F), tanh approximation as GPT-2
        return self.w_out(h)  # (B, T, D)


class Block(nnx.Module):
    """Pre-norm block: ``x + attn(norm(x))`` then ``x + mlp(norm(x))``."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.rate = float(config.dropout)
        self.attn_norm = _norm(config, config.d_model, rngs)
        self.attn = Attention(config, rngs=rngs)
        self.mlp_norm = _norm(config, config.d_model, rngs)
        self.mlp = MLP(config, rngs=rngs)

    def __call__(self, x: jax.Array, key: jax.Array | None = None) -> jax.Array:
        k1, k2 = jax.random.split(key) if key is not None else (None, None)
        x = x + _dropout(self.attn(self.attn_norm(x)), self.rate, k1)
        return x + _dropout(self.mlp(self.mlp_norm(x)), self.rate, k2)


class Transformer(nnx.Module):
    """Decoder-only language model.

    ``Transformer(config, rngs=nnx.Rngs(params=key))``; calling it on tokens ``[B, T]``
    int (``T <= max_len``) returns next-token logits ``[B, T, V]`` float32. Position t
    only sees tokens ``<= t`` (causal).
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.config = config
        emb_kw = dict(
            embedding_init=nnx.initializers.normal(config.init_std),
            dtype=config.dtype,
            param_dtype=config.param_dtype,
            rngs=rngs,
        )
        self.embed = nnx.Embed(config.vocab_size, config.d_model, **emb_kw)
        if config.position == "learned":
            self.pos_embed = nnx.Embed(config.max_len, config.d_model, **emb_kw)
        if config.scan_layers:
            # one Block whose every Param is [L, ...]
            make = lambda r: Block(config, rngs=r)  # noqa: E731
            self.layers = stacked_modules(make, config.n_layers, rngs)
        else:
            self.layers = nnx.List([Block(config, rngs=rngs) for _ in range(config.n_layers)])
        self.final_norm = _norm(config, config.d_model, rngs)
        if not config.tied_head:
            self.head = nnx.Linear(
                config.d_model,
                config.vocab_size,
                use_bias=False,
                kernel_init=nnx.initializers.normal(config.init_std),
                dtype=config.dtype,
                param_dtype=config.param_dtype,
                rngs=rngs,
            )

    def __call__(
        self, tokens: jax.Array, *, rng: jax.Array | None = None, deterministic: bool = True
    ) -> jax.Array:
        """Logits ``[B, T, V]`` float32 for tokens ``[B, T]``.

        Args:
          tokens: int ``[B, T]`` with ``T <= max_len``.
          rng: dropout key; required when ``dropout > 0`` and ``deterministic=False``.
          deterministic: disable dropout.

        Raises:
          ValueError: on a bad token shape/dtype or a missing dropout key.
        """
        c = self.config
        _check_tokens(c, tokens)
        use_dropout = c.dropout > 0 and not deterministic
        if use_dropout and rng is None:
            raise ValueError("rng is required when dropout > 0 and deterministic=False")
        keys = jax.random.split(rng, c.n_layers + 1) if use_dropout else None  # (L + 1,)
        x = self.embed(tokens)  # (B, T, D)
        if c.position == "learned":
            x = x + self.pos_embed(jnp.arange(tokens.shape[1]))[None]
        x = _dropout(x, c.dropout, None if keys is None else keys[0])
        layer_keys = None if keys is None else keys[1:]  # (L,)
        if c.scan_layers:
            x = scan_blocks(self.layers, x, layer_keys, c.remat, c.remat_policy)
        else:
            for i, block in enumerate(self.layers):
                key = None if layer_keys is None else layer_keys[i]
                x = remat(c.remat, c.remat_policy)(lambda blk, h, k: blk(h, k))(block, x, key)
        x = self.final_norm(x)
        if c.tied_head:
            logits = self.embed.attend(x)  # (B, T, V)
        else:
            logits = self.head(x)
        return logits.astype(jnp.float32)


def _check_tokens(config: TransformerConfig, tokens: Any) -> None:
    shape = jnp.shape(tokens)
    if len(shape) != 2:
        raise ValueError(f"tokens must be [batch, seq] int, got shape {shape}")
    if not jnp.issubdtype(jnp.result_type(tokens), jnp.integer):
        raise ValueError(f"tokens must be an integer array, got dtype {jnp.result_type(tokens)}")
    if shape[1] > config.max_len:
        raise ValueError(f"tokens seq length {shape[1]} exceeds TransformerConfig.max_len")


# ----------------------------------------------------------------------------- functional API


def _is_key_batch(key: jax.Array) -> bool:
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.ndim > 1:
            raise ValueError(f"key must be a key or a 1-D batch of keys, got shape {key.shape}")
        return key.ndim == 1
    if key.ndim == 1 and key.shape == (2,):
        return False
    if key.ndim == 2 and key.shape[1] == 2:
        return True
    raise ValueError(f"key must be a PRNG key or a batch of keys, got shape {key.shape}")


@functools.partial(jax.jit, static_argnums=0)
def _init_params(config: TransformerConfig, key: jax.Array) -> dict:
    model = Transformer(config, rngs=nnx.Rngs(params=key))
    _, params, rest = nnx.split(model, nnx.Param, ...)
    if jax.tree.leaves(rest):
        raise ValueError(f"model holds non-Param state, not supported: {rest}")
    return nnx.to_pure_dict(params)


def init_params(config: TransformerConfig, key: jax.Array) -> dict:
    """Initial parameters as a plain nested dict ``{name: {...: array}}``.

    Args:
      config: model configuration.
      key: a PRNG key (typed or raw ``uint32[2]``), or a batch of S keys (``[S]`` typed or
        ``[S, 2]`` raw), in which case every leaf gains a leading seed axis ``[S, ...]``
        (``jax.vmap`` over keys; seed s equals ``init_params(config, key[s])``).

    Returns:
      nested dict of arrays, structure as in the module docstring; list indices are ints.
      Jitted (config static), so no per-op dispatch for large models.

    Raises:
      ValueError: for a badly shaped key.
    """
    if not isinstance(config, TransformerConfig):
        raise ValueError(f"config must be a TransformerConfig, got {type(config).__name__}")
    # Fields that do not change the parameters share one compiled initialiser.
    config = config.replace(
        remat=False, remat_policy="nothing_saveable", dropout=0.0, dtype=config.param_dtype
    )
    if _is_key_batch(key):
        return jax.vmap(lambda k: _init_params(config, k))(key)
    return _init_params(config, key)


@functools.lru_cache(maxsize=64)
def _graphdef(config: TransformerConfig) -> nnx.GraphDef:
    abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(params=0)))
    graphdef, _ = nnx.split(abstract, nnx.Param)
    return graphdef


def init(config: TransformerConfig, key: jax.Array) -> tuple[nnx.GraphDef, dict]:
    """Functional initialisation: ``(graphdef, params)``.

    ``graphdef`` is the static structure (hashable; pass it to :func:`apply`), ``params``
    a plain nested dict of arrays (nnx ``Param`` state as ``to_pure_dict()``), so it can be
    handed to optax, Orbax, ``jax.vmap`` and sharding APIs directly.

    Args:
      config: model configuration.
      key: PRNG key, or a batch of S keys for multi-seed runs (leading seed axis on every
        leaf; use ``jax.vmap(lambda p: apply(graphdef, p, tokens))(params)``).

    Returns:
      ``(graphdef, params)``.

    Raises:
      ValueError: for a badly shaped key or a non-config argument.
    """
    params = init_params(config, key)
    return _graphdef(config), params


def apply(
    graphdef: nnx.GraphDef,
    params: Mapping[str, Any],
    tokens: jax.Array,
    *,
    rng: jax.Array | None = None,
    deterministic: bool = True,
) -> jax.Array:
    """Pure forward pass: logits ``[B, T, V]`` float32 for tokens ``[B, T]`` int.

    Safe under ``jax.jit`` (graphdef static or closed over), ``jax.grad`` w.r.t. params,
    ``jax.vmap`` over a leading seed axis of params, ``jax.pmap`` and sharded ``jit``.

    Args:
      graphdef: from :func:`init`.
      params: nested dict from :func:`init` (one seed).
      tokens: int ``[B, T]``, ``T <= max_len``.
      rng: dropout key, required when ``dropout > 0`` and ``deterministic=False``.
      deterministic: disable dropout.

    Raises:
      ValueError: on bad token shape/dtype or missing dropout key.
    """
    model = nnx.merge(graphdef, params)
    return model(tokens, rng=rng, deterministic=deterministic)


def count_params(params: Any) -> int:
    """Total number of scalar parameters in a pytree (works on ``jax.eval_shape`` output)."""
    return int(sum(np.prod(x.shape, dtype=np.int64) for x in jax.tree.leaves(params)))


# ----------------------------------------------------------------------------- analysis


def _kernels(params: Mapping[str, Any], group: str, role: str) -> jax.Array | None:
    """Kernels of one role over layers ``[..., L, d_in, d_out]`` (either layout), or None.

    In the stacked layout the layer axis sits after any leading seed axes already.
    """
    if is_scanned(params):
        module = params["layers"][group].get(role)
        return None if module is None else module["kernel"]
    layers = params["layers"]
    ids = sorted(layers, key=int)
    if role not in layers[ids[0]][group]:
        return None
    return jnp.stack([layers[i][group][role]["kernel"] for i in ids], axis=-3)


def _math(kernel: jax.Array) -> jax.Array:
    """Flax kernel ``[..., d_in, d_out]`` -> matrix ``[..., d_out, d_in]``."""
    return jnp.swapaxes(kernel, -1, -2)


def vo_maps(params: Mapping[str, Any], config: TransformerConfig, *, per_head: bool = True):
    """Value-output maps of every layer, in the ``y = M x`` convention.

    Head h maps the (normalised) residual stream through ``W_O^h W_V^h``, with
    ``W_V^h = W_V[h rows]`` ``[Dh, D]`` and ``W_O^h = W_O[:, h cols]`` ``[D, Dh]``
    (W = kernel.T). The full-layer map is ``W_O W_V = Σ_h W_O^h W_V^h``. Paper A (A.3)
    measures isotropy of VO.

    Args:
      params: parameter dict from :func:`init`, either layout (a leading seed axis is
        carried through).
      config: its configuration (for the head split).
      per_head: return per-head maps (rank <= Dh each) or the per-layer sum.

    Returns:
      ``[..., n_layers, n_heads, D, D]`` if ``per_head`` else ``[..., n_layers, D, D]``.

    Raises:
      ValueError: if params is not a Transformer parameter dict.
    """
    h, dh = config.n_heads, config.head_dim
    wv = _math(_kernels(params, "attn", "v"))  # [..., L, D(out), D(in)]
    wo = _math(_kernels(params, "attn", "o"))
    if not per_head:
        return wo @ wv  # [..., L, D, D]
    lead = wv.shape[:-2]
    wv_h = wv.reshape(*lead, h, dh, wv.shape[-1])  # [..., L, H, Dh, D]
    wo_h = jnp.moveaxis(wo.reshape(*lead, wo.shape[-2], h, dh), -2, -3)  # [..., L, H, D, Dh]
    return wo_h @ wv_h  # [..., L, H, D, D]


def ffn_matrices(params: Mapping[str, Any]) -> dict[str, jax.Array]:
    """FFN matrices stacked over layers, in the ``y = W x`` convention (either layout).

    Returns:
      ``{"w_in": [..., L, F, D], "w_out": [..., L, D, F]}`` plus ``"w_gate": [..., L, F, D]``
      for SwiGLU models.

    Raises:
      ValueError: if params is not a Transformer parameter dict.
    """
    out = {r: _kernels(params, "mlp", r) for r in FFN_ROLES}
    return {r: _math(k) for r, k in out.items() if k is not None}


def hidden_matrices(params: Mapping[str, Any], *, include_vo: bool = True) -> dict[str, jax.Array]:
    """Every hidden matrix by name, for spectrum logging (either layout).

    Returns:
      ``{"layers/i/<role>": [..., d_out, d_in]}`` for the roles ``q, k, v, o, w_in,
      w_gate, w_out`` present (``W = kernel.T``), plus ``"layers/i/vo"`` = ``W_O W_V``
      ``[..., D, D]`` (not a role: the product paper A analyses) when ``include_vo``.
      Leading seed axes are carried through.

    Raises:
      ValueError: if params is not a Transformer parameter dict.
    """
    stacks = {}
    for group, roles in (("attn", ATTN_ROLES), ("mlp", FFN_ROLES)):
        for r in roles:
            k = _kernels(params, group, r)
            if k is not None:
                stacks[r] = _math(k)  # [..., L, d_out, d_in]
    if include_vo:
        stacks["vo"] = stacks["o"] @ stacks["v"]
    n = next(iter(stacks.values())).shape[-3]
    return {f"layers/{i}/{r}": m[..., i, :, :] for i in range(n) for r, m in stacks.items()}
