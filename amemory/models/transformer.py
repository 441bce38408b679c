"""A decoder-only transformer in Flax NNX whose parameter paths name their roles.

Read top to bottom: :class:`TransformerConfig` and :func:`preset`, the modules
(:class:`Block`, :class:`Transformer`; attention variants MHA / MLA live in
:mod:`amemory.models.attention`, the MLP and the mixture of experts in
:mod:`amemory.models.moe`, KV-cache decoding in :mod:`amemory.models.decode`), the functional
API used by the training loop (:func:`init`, :func:`apply`). Re-exported here: roles
(:func:`role_of`, :func:`param_roles`, from :mod:`amemory.models.roles`), analysis helpers
(:func:`vo_maps`, :func:`ffn_matrices`, :func:`hidden_matrices`, from
:mod:`amemory.models.matrices`) and scanned-layer layouts (:func:`stack_layers`,
:func:`unstack_layers`, from :mod:`amemory.models.scan`).

Design choices (Wang et al., arXiv 2509.26030, experiments; docs/peers.md, "Routing"):

* Q, K, V, O are four separate 2-D ``nnx.Linear`` kernels of shape ``[d_model, d_model]``
  (never 3-D head-split kernels), and the FFN has ``w_in``/``w_out`` (GELU) or
  ``w_in``/``w_gate``/``w_out`` (SwiGLU), so an optimizer router and a spectrum logger see
  exactly one matrix per role and layer.
* Parameter paths read as roles, e.g. ``layers/3/attn/v/kernel`` -> ``"v"``. Every leaf
  has exactly one role of ``amemory.models.roles.ROLES`` (:mod:`amemory.models.roles`);
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
    layers/i/attn/{q,o}/kernel   [D, D]        q, o    (+ bias: bias if use_bias)
    layers/i/attn/{k,v}/kernel   [D, H_kv d_h] k, v    (H_kv = n_kv_heads; D when H_kv = H)
    layers/i/attn/{q,k}_norm/scale [D/H]       norm    (qk_norm only)
    layers/i/mlp_norm/scale      [D]           norm
    layers/i/mlp/w_in/kernel     [D, F]        w_in
    layers/i/mlp/w_gate/kernel   [D, F]        w_gate  (ffn="swiglu" only)
    layers/i/mlp/w_out/kernel    [F, D]        w_out
    final_norm/scale             [D]           norm
    head/kernel                  [D, V]        head    (tied_head=False only)

With ``attention="mla"`` the attention kernels are (H heads of d_h = D/H; DeepSeek-V2)::

    layers/i/attn/q/kernel       [D, H d_h]    q       (mla.q_rank = 0), or
    layers/i/attn/q_down/kernel  [D, d_c']     q_down  and  q_up/kernel [d_c', H d_h]  q_up
    layers/i/attn/q_rope/kernel  [D or d_c', H d_R]  q_rope
    layers/i/attn/kv_down/kernel [D, d_c]      kv_down
    layers/i/attn/{k_up,v_up}/kernel [d_c, H d_h]  k_up, v_up
    layers/i/attn/k_rope/kernel  [D, d_R]      k_rope
    layers/i/attn/o/kernel       [H d_h, D]    o

With ``moe.experts = E > 0`` the FFN is a mixture of experts (width F_e = moe.d_expert)::

    layers/i/mlp/router/kernel   [D, E]        router
    layers/i/mlp/experts/w_in    [E, D, F_e]   expert_w_in  (+ w_gate: expert_w_gate)
    layers/i/mlp/experts/w_out   [E, F_e, D]   expert_w_out
    layers/i/mlp/shared          w_in, w_gate, w_out kernels: shared_w_*  (moe.shared > 0)

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
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from amemory.models.attention import ATTENTIONS, MLAConfig
from amemory.models.layers import check_ints, linear, split_batch
from amemory.models.layers import dropout as _dropout
from amemory.models.layers import norm as _norm
from amemory.models.matrices import ffn_matrices, hidden_matrices, vo_maps
from amemory.models.moe import MLP, MoE, MoEConfig
from amemory.models.roles import (
    ATTN_ROLES,
    FFN_ROLES,
    HIDDEN_ROLES,
    ROLES,
    matrix_axes,
    param_roles,
    role_of,
)
from amemory.models.scan import (
    REMAT_POLICIES,
    layer_views,
    remat,
    scan_blocks,
    stack_layers,
    stacked_modules,
    unstack_layers,
)

__all__ = [
    "ATTN_ROLES",
    "FFN_ROLES",
    "HIDDEN_ROLES",
    "PRESETS",
    "ROLES",
    "Block",
    "MLAConfig",
    "MoEConfig",
    "Transformer",
    "TransformerConfig",
    "apply",
    "count_params",
    "ffn_matrices",
    "hidden_matrices",
    "init",
    "init_params",
    "matrix_axes",
    "param_roles",
    "preset",
    "role_of",
    "stack_layers",
    "unstack_layers",
    "vo_maps",
]

_DTYPES = ("float32", "bfloat16", "float16", "float64")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Shape and options of the decoder. Frozen and hashable (usable as a static jit arg).

    Attributes:
      vocab_size: V, number of token ids.
      d_model: D, residual width; must be divisible by ``n_heads``.
      n_layers: number of blocks.
      n_heads: H; head dim ``D / H`` must be even when ``position="rope"``.
      n_kv_heads: H_kv key/value heads, dividing H (not MLA): None = H (multi-head),
        1 = multi-query (Shazeer 2019, arXiv 1911.02150), else grouped-query attention
        (Ainslie et al. 2023, arXiv 2305.13245; query head h reads K/V head
        ``h // (H / H_kv)``); k and v kernels ``[D, H_kv d_h]``, KV cache ``H / H_kv``
        times smaller. :attr:`kv_heads` is the resolved count.
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
      scan_layers: the blocks' parameters stacked ``[L, ...]`` and run by one
        ``jax.lax.scan`` (:mod:`amemory.models.scan`; the same function as ``L`` unrolled
        blocks: :func:`stack_layers` / :func:`unstack_layers` convert the parameters).
      dtype: compute dtype name (``"float32"``, ``"bfloat16"``, ...); logits are float32.
        With ``param_dtype="float32"`` this is the usual mixed-precision policy: float32
        master weights (and optimizer state), matmuls and activations in ``dtype``.
      param_dtype: parameter dtype name.
      use_bias: biases in every Linear (GPT-2 style; role ``"bias"``).
      rope_base: RoPE frequency base.
      init_std: std of the normal initialisation of kernels and embeddings; the output
        projections ``o`` and ``w_out`` use ``init_std / sqrt(2 n_layers)`` (GPT-2).
      norm_eps: epsilon of every normalisation layer.
      attention: ``"mha"`` (multi-head, q/k/v/o) or ``"mla"`` (multi-head latent attention,
        DeepSeek-V2; needs ``position="rope"``, no ``qk_norm``, no ``use_bias``); one of
        :data:`amemory.models.attention.ATTENTIONS`.
      mla: :class:`MLAConfig` widths (used when ``attention="mla"``; None fields resolve
        to DeepSeek-V2's ratios to the head width, see :attr:`mla_dims`). A dict is
        accepted.
      moe: :class:`MoEConfig`; ``moe.experts > 0`` replaces every block's MLP by a
        mixture of experts (``ffn`` chooses the experts' activation; resolved widths in
        :attr:`moe_dims`). A dict is accepted.
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
    attention: str = "mha"
    mla: MLAConfig = MLAConfig()
    moe: MoEConfig = MoEConfig()
    n_kv_heads: int | None = None

    def __post_init__(self):
        sizes = ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_len")
        check_ints(self, "TransformerConfig", dict.fromkeys(sizes, 1))
        choices = {
            "ffn": ("gelu", "swiglu"),
            "norm": ("layernorm", "rmsnorm"),
            "position": ("rope", "learned"),
            "remat_policy": REMAT_POLICIES,
            "attention": tuple(ATTENTIONS),
        }
        for name, allowed in choices.items():
            v = getattr(self, name)
            if v not in allowed:
                raise ValueError(f"TransformerConfig.{name} must be one of {allowed}, got {v!r}")
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
        kv = self.n_kv_heads
        if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1
                               or self.n_heads % kv or self.attention == "mla"):  # fmt: skip
            raise ValueError(
                f"TransformerConfig.n_kv_heads must be None or an integer dividing "
                f"n_heads={self.n_heads} (not with attention='mla'), got {kv!r}"
            )
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ValueError(f"TransformerConfig.dropout must lie in [0, 1), got {self.dropout}")
        for name in ("rope_base", "init_std", "norm_eps"):
            if not float(getattr(self, name)) > 0:
                raise ValueError(f"TransformerConfig.{name} must be > 0, got {getattr(self, name)}")
        for name, cls in (("mla", MLAConfig), ("moe", MoEConfig)):
            v = getattr(self, name)
            if isinstance(v, Mapping):
                v = cls(**v)
            if not isinstance(v, cls):
                raise ValueError(f"TransformerConfig.{name} must be a {cls.__name__}, got {v!r}")
            v.resolve(self.head_dim if name == "mla" else self.d_ff)  # validates
            object.__setattr__(self, name, v)
        if self.attention == "mla":
            for bad, why in (
                (self.position != "rope", "position='rope' (its RoPE part is decoupled)"),
                (self.qk_norm, "qk_norm=False"),
                (self.use_bias, "use_bias=False"),
            ):
                if bad:
                    raise ValueError(f"TransformerConfig: attention='mla' needs {why}")

    @property
    def head_dim(self) -> int:
        """D / H."""
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """H_kv: ``n_kv_heads``, or ``n_heads`` when None."""
        return self.n_kv_heads or self.n_heads

    @property
    def mla_dims(self) -> MLAConfig:
        """``mla`` with None widths resolved from ``head_dim`` (DeepSeek-V2 ratios)."""
        return self.mla.resolve(self.head_dim)

    @property
    def moe_dims(self) -> MoEConfig:
        """``moe`` with ``d_expert`` resolved (None -> ``d_ff``)."""
        return self.moe.resolve(self.d_ff)

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

    Presets (shapes in :data:`PRESETS`; parameter counts at the default vocabulary, closed
    form checked in tests):

    * ``tiny``: for tests. ``small``: CPU experiments, 7,342,336 parameters (5,245,184 of
      them outside the embeddings); set ``vocab_size`` from the tokenizer.
    * ``gpt2-small``: GPT-2 124M (Radford et al. 2019), 124,439,808 parameters.
    * ``nanogpt-160m``: the "160M NanoGPT" of paper A's ablation (Wang et al. 2025, A.3).
      The paper gives only the size; this is the modded-nanogpt GPT-2-small shape with an
      untied head: 2 x 38,633,472 (embed + head) + 12 x 7,079,424 + 768 = 162,220,800
      parameters. For the gated column of the ablation use ``preset("nanogpt-160m",
      ffn="swiglu", d_ff=2048)`` (same count).

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


class Block(nnx.Module):
    """Pre-norm block: ``x + attn(norm(x))`` then ``x + ffn(norm(x))``.

    ``attn`` is ``ATTENTIONS[config.attention]`` (MHA or MLA); ``mlp`` is an :class:`MLP`,
    or a :class:`MoE` when ``config.moe.experts > 0``. A call returns ``(x, aux)``:
    ``aux`` holds the attention's ``max_logit [H]`` and the MoE layer's scalars
    (load-balancing loss, dropped fraction).
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.rate = float(config.dropout)
        self.is_moe = config.moe.experts > 0
        self.attn_norm = _norm(config, config.d_model, rngs)
        self.attn = ATTENTIONS[config.attention](config, rngs=rngs)
        self.mlp_norm = _norm(config, config.d_model, rngs)
        self.mlp = MoE(config, rngs=rngs) if self.is_moe else MLP(config, rngs=rngs)

    def _ffn(self, h: jax.Array, dropless: bool = False) -> tuple[jax.Array, dict]:
        return self.mlp(h, dropless=dropless) if self.is_moe else (self.mlp(h), {})

    def __call__(self, x: jax.Array, key: jax.Array | None = None) -> tuple[jax.Array, dict]:
        k1, k2 = jax.random.split(key) if key is not None else (None, None)
        x = split_batch(x)  # (B, T, D)
        h, top = self.attn(self.attn_norm(x))
        x = x + _dropout(h, self.rate, k1)
        h, aux = self._ffn(self.mlp_norm(x))
        return split_batch(x + _dropout(h, self.rate, k2)), {**aux, "max_logit": top}

    def extend(self, x: jax.Array, cache: dict, pos: jax.Array) -> tuple[jax.Array, dict]:
        """Incremental forward of S new tokens ``x [B, S, D]`` through the KV cache.

        No dropout; the MoE never drops (dropless). Returns ``(x, cache)``.
        """
        h, cache = self.attn.extend(self.attn_norm(x), cache, pos)
        x = x + h
        return x + self._ffn(self.mlp_norm(x), dropless=True)[0], cache


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
            self.head = linear(
                config, config.d_model, config.vocab_size, config.init_std, rngs, use_bias=False
            )

    def __call__(
        self,
        tokens: jax.Array,
        *,
        rng: jax.Array | None = None,
        deterministic: bool = True,
        with_aux: bool = False,
    ) -> jax.Array | tuple[jax.Array, dict]:
        """Logits ``[B, T, V]`` float32 for tokens ``[B, T]``.

        Args:
          tokens: int ``[B, T]`` with ``T <= max_len``.
          rng: dropout key; required when ``dropout > 0`` and ``deterministic=False``.
          deterministic: disable dropout.
          with_aux: also return the blocks' auxiliary outputs: ``max_logit [L, H]`` (each
            layer's and head's largest pre-softmax logit) and, averaged over the layers,
            the MoE scalars ``moe_lb_loss``, ``moe_drop_fraction``.

        Under a mesh with ``Explicit`` axes the pass runs on Auto ones
        (``jax.sharding.auto_axes``; logits split like the tokens' rows), so that FSDP
        parameters are gathered by the partitioner as on the engine's Auto mesh.

        Raises:
          ValueError: on a bad token shape/dtype or a missing dropout key.
        """
        c = self.config
        _check_tokens(c, tokens)
        use_dropout = c.dropout > 0 and not deterministic
        if use_dropout and rng is None:
            raise ValueError("rng is required when dropout > 0 and deterministic=False")
        keys = jax.random.split(rng, c.n_layers + 1) if use_dropout else None  # (L + 1,)
        mesh = jax.sharding.get_abstract_mesh()
        explicit = () if mesh.empty else mesh.explicit_axes
        if explicit:  # the pass on Auto axes, as on the engine's mesh: FSDP by the partitioner
            graphdef, state = nnx.split(self)
            rows = jax.sharding.PartitionSpec(jax.typeof(tokens).sharding.spec[0])
            run = lambda s, t, k: nnx.merge(graphdef, s)._forward(t, k)  # noqa: E731
            out = jax.sharding.auto_axes(run, axes=explicit, out_sharding=(rows, P()))
            logits, aux = out(state, tokens, keys)
        else:
            logits, aux = self._forward(tokens, keys)
        return (logits, aux) if with_aux else logits

    def _forward(self, tokens: jax.Array, keys: jax.Array | None) -> tuple[jax.Array, dict]:
        c = self.config
        x = _dropout(self._embed(tokens, 0), c.dropout, None if keys is None else keys[0])
        layer_keys = None if keys is None else keys[1:]  # (L,)
        if c.scan_layers:  # aux: {name: [L]}
            x, aux = scan_blocks(self.layers, x, layer_keys, c.remat, c.remat_policy)
        else:
            auxes = []
            for i, block in enumerate(self.layers):
                key = None if layer_keys is None else layer_keys[i]
                x, a = remat(c.remat, c.remat_policy)(lambda blk, h, k: blk(h, k))(block, x, key)
                auxes.append(a)
            aux = {k: jnp.stack([a[k] for a in auxes]) for k in auxes[0]}
        aux = {k: v if k == "max_logit" else jnp.mean(v) for k, v in aux.items()}  # (L, H)
        return self._logits(x), aux

    def extend(self, tokens: jax.Array, cache: list, pos: jax.Array) -> tuple[jax.Array, list]:
        """Logits ``[B, S, V]`` of S new tokens at positions ``pos..pos+S-1`` and the new cache.

        ``cache`` is one dict per layer (``amemory.models.decode.init_cache``); the result
        equals rows ``pos..pos+S-1`` of the full forward pass of the whole sequence (the
        MoE dropless). Used by :mod:`amemory.models.decode`. Scanned layers are run one
        layer slice after the other (the cache is per layer).
        """
        x = self._embed(tokens, pos)
        layers = self.layers
        if self.config.scan_layers:
            layers = layer_views(self.layers, self.config.n_layers)
        new = []
        for block, layer_cache in zip(layers, cache, strict=True):
            x, layer_cache = block.extend(x, layer_cache, pos)
            new.append(layer_cache)
        return self._logits(x), new

    def _embed(self, tokens: jax.Array, pos: jax.Array | int) -> jax.Array:
        x = self.embed(tokens)  # (B, T, D)
        if self.config.position == "learned":
            x = x + self.pos_embed(pos + jnp.arange(tokens.shape[1]))[None]
        return x

    def _logits(self, x: jax.Array) -> jax.Array:
        x = self.final_norm(x)
        logits = self.embed.attend(x) if self.config.tied_head else self.head(x)  # (B, T, V)
        return logits.astype(jnp.float32)


def _check_tokens(config: TransformerConfig, tokens: Any) -> None:
    shape = jnp.shape(tokens)
    if len(shape) != 2:
        raise ValueError(f"tokens must be [batch, seq] int, got shape {shape}")
    if not jnp.issubdtype(jnp.result_type(tokens), jnp.integer):
        raise ValueError(f"tokens must be an integer array, got dtype {jnp.result_type(tokens)}")
    if shape[1] > config.max_len:
        raise ValueError(f"tokens seq length {shape[1]} exceeds TransformerConfig.max_len")


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
    with_aux: bool = False,
) -> jax.Array | tuple[jax.Array, dict]:
    """Pure forward pass: logits ``[B, T, V]`` float32 for tokens ``[B, T]`` int.

    Safe under ``jax.jit`` (graphdef static or closed over), ``jax.grad`` w.r.t. params,
    ``jax.vmap`` over a leading seed axis of params, ``jax.pmap`` and sharded ``jit``.

    Args:
      graphdef: from :func:`init`.
      params: nested dict from :func:`init` (one seed).
      tokens: int ``[B, T]``, ``T <= max_len``.
      rng: dropout key, required when ``dropout > 0`` and ``deterministic=False``.
      deterministic: disable dropout.
      with_aux: return ``(logits, aux)``: ``aux["max_logit"] [L, H]`` and the MoE layers'
        scalars averaged over layers (``moe_lb_loss``, ``moe_drop_fraction``).

    Raises:
      ValueError: on bad token shape/dtype or missing dropout key.
    """
    model = nnx.merge(graphdef, params)
    return model(tokens, rng=rng, deterministic=deterministic, with_aux=with_aux)


def count_params(params: Any) -> int:
    """Total number of scalar parameters in a pytree (works on ``jax.eval_shape`` output)."""
    return int(sum(np.prod(x.shape, dtype=np.int64) for x in jax.tree.leaves(params)))
