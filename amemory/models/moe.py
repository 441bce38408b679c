"""Feed-forward layers of the decoder: the dense MLP and a mixture of experts (MoE).

:class:`MLP` is ``w_out(gelu(w_in x))`` or SwiGLU ``w_out(silu(w_gate x) * w_in x)``.

:class:`MoE` (``TransformerConfig.moe.experts > 0``) replaces it in every block::

    s = softmax(x W_r)                      router  [D, E]            (float32)
    g_i = s_i if i is among the top-k of s, else 0   (token-choice top-k gating)
    y = Σ_shared FFN(x) + Σ_i g_i FFN_i(x)

as in DeepSeekMoE / DeepSeek-V2 (arXiv 2401.06066; arXiv 2405.04434, Sec. 2.2, eqs.
20-23: fine-grained routed experts, shared experts always on, gates not renormalised).
Routed experts are stacked leaves ``experts/w_in [E, D, F]`` (``w_gate`` for SwiGLU) and
``experts/w_out [E, F, D]``, so an optimizer sees one ``[D, F]`` matrix per expert on a
leading expert axis (Muon with ``matrix_axes=(-2, -1)`` orthogonalises each separately).
The ``shared`` experts are one MLP of width ``shared * d_expert`` (the sum of ``shared``
MLPs of width ``d_expert`` is exactly that MLP).

Dispatch (GShard, arXiv 2006.16668, Sec. 2.2; Switch Transformer, arXiv 2101.03961,
Sec. 2.1): each sequence is a group; expert ``i`` takes at most
``C = ceil(capacity_factor * T * k / E)`` of the group's (token, choice) pairs, claimed in
order of position then choice rank, so a token's slot depends only on earlier tokens
(the layer stays causal); pairs beyond capacity are dropped (their gate contributes 0).
``capacity_factor = 0`` is dropless (``C = T``: every expert has a slot for every token,
so the experts compute ``E / k`` times the routed FLOPs; a capacity factor of 1-1.25, as
Switch uses, computes ``cf`` times them). Tokens reach their slots by a gather and come
back by a gather weighted by their gates (``[B, E C, D]``; no one-hot matmul), so only the
experts' own matmuls cost FLOPs.

Load balance (Switch Transformer eqs. 4-6, with top-k as in DeepSeek-V2 eq. 24)::

    L_lb = E Σ_i f_i P_i,  f_i = (1 / (T k)) Σ_t Σ_j 1[choice_j(t) = i],  P_i = (1/T) Σ_t s_i(t)

per group (sequence), before capacity, averaged over groups; 1 for a perfectly uniform
router. The layer returns it (and the dropped fraction) as auxiliary outputs; the
training task adds ``lb_coef * L_lb`` to the loss.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from amemory.models.layers import check_ints, linear

__all__ = ["MLP", "MoE", "MoEConfig", "capacity"]


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    """Mixture-of-experts options (``experts = 0``: a dense MLP in every block).

    Attributes:
      experts: E, number of routed experts (0 = no MoE).
      top_k: k, routed experts per token (1 <= k <= E).
      shared: number of shared experts, always on (DeepSeekMoE); 0 = none.
      d_expert: F_e, hidden width of each expert; None = the model's ``d_ff``.
      capacity_factor: expert capacity ``C = ceil(capacity_factor * T * k / E)`` per
        sequence; 0 = dropless (``C = T``). Decoding (``MoE(..., dropless=True)``) never
        drops.
    """

    experts: int = 0
    top_k: int = 2
    shared: int = 0
    d_expert: int | None = None
    capacity_factor: float = 0.0

    def resolve(self, d_ff: int) -> MoEConfig:
        """A copy with ``d_expert`` set (None -> ``d_ff``) and every field validated.

        Raises:
          ValueError: naming the field (``TransformerConfig.moe.<field>``) and its range.
        """
        out = dataclasses.replace(self, d_expert=d_ff if self.d_expert is None else self.d_expert)
        lows = {"experts": 0, "top_k": 1, "shared": 0, "d_expert": 1}
        check_ints(out, "TransformerConfig.moe", lows)
        if out.experts and out.top_k > out.experts:
            raise ValueError(
                f"TransformerConfig.moe.top_k={out.top_k} must be <= moe.experts={out.experts}"
            )
        if not float(out.capacity_factor) >= 0:
            raise ValueError(
                f"TransformerConfig.moe.capacity_factor must be >= 0 (0 = dropless), "
                f"got {out.capacity_factor!r}"
            )
        return out


def capacity(moe: MoEConfig, group_size: int, dropless: bool = False) -> int:
    """Slots per expert in a group of ``group_size`` tokens: ``ceil(cf T k / E)``, at most T.

    ``capacity_factor == 0`` or ``dropless`` gives ``T`` (no token is ever dropped, since
    a token chooses distinct experts).
    """
    if dropless or moe.capacity_factor == 0:
        return group_size
    c = math.ceil(float(moe.capacity_factor) * group_size * moe.top_k / moe.experts)
    return max(1, min(group_size, c))


class MLP(nnx.Module):
    """FFN: ``w_out(gelu(w_in x))`` or SwiGLU ``w_out(silu(w_gate x) * w_in x)``.

    ``d_ff`` overrides the config's hidden width (shared experts use ``shared * d_expert``).
    """

    def __init__(self, config: Any, *, rngs: nnx.Rngs, d_ff: int | None = None):
        d, f, std = config.d_model, d_ff or config.d_ff, config.init_std
        self.gated = config.ffn == "swiglu"
        self.w_in = linear(config, d, f, std, rngs)
        if self.gated:
            self.w_gate = linear(config, d, f, std, rngs)
        self.w_out = linear(config, f, d, std / math.sqrt(2 * config.n_layers), rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.gated:
            h = jax.nn.silu(self.w_gate(x)) * self.w_in(x)  # (B, T, F)
        else:
            h = jax.nn.gelu(self.w_in(x))  # (B, T, F), tanh approximation as GPT-2
        return self.w_out(h)  # (B, T, D)


class Experts(nnx.Module):
    """E expert FFNs with stacked kernels ``w_in [E, D, F]`` (``w_gate``), ``w_out [E, F, D]``."""

    def __init__(self, config: Any, *, rngs: nnx.Rngs):
        m = config.moe_dims
        e, d, f, std = m.experts, config.d_model, m.d_expert, config.init_std
        self.dtype = config.dtype
        self.gated = config.ffn == "swiglu"

        def param(shape, s):
            init = nnx.initializers.normal(s)
            return nnx.Param(init(rngs.params(), shape, config.param_dtype))

        self.w_in = param((e, d, f), std)
        if self.gated:
            self.w_gate = param((e, d, f), std)
        self.w_out = param((e, f, d), std / math.sqrt(2 * config.n_layers))

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [..., E, C, D]`` (slot c of expert e) -> ``[..., E, C, D]``."""
        x = x.astype(self.dtype)
        h = jnp.einsum("...ecd,edf->...ecf", x, self.w_in[...].astype(self.dtype))
        if self.gated:
            g = jnp.einsum("...ecd,edf->...ecf", x, self.w_gate[...].astype(self.dtype))
            h = jax.nn.silu(g) * h
        else:
            h = jax.nn.gelu(h)
        return jnp.einsum("...ecf,efd->...ecd", h, self.w_out[...].astype(self.dtype))


class MoE(nnx.Module):
    """Token-choice top-k mixture of experts with shared experts; see the module docstring."""

    def __init__(self, config: Any, *, rngs: nnx.Rngs):
        m = config.moe_dims
        self.moe = m
        self.router = linear(  # routing logits in float32
            config, config.d_model, m.experts, config.init_std, rngs, use_bias=False,
            dtype=jnp.float32,
        )  # fmt: skip
        self.experts = Experts(config, rngs=rngs)
        if m.shared:
            self.shared = MLP(config, rngs=rngs, d_ff=m.shared * m.d_expert)

    def route(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Router probabilities ``[B, T, E]`` (float32), top-k gates and indices ``[B, T, k]``."""
        probs = jax.nn.softmax(self.router(x.astype(jnp.float32)), axis=-1)  # (B, T, E)
        gates, idx = jax.lax.top_k(probs, self.moe.top_k)  # (B, T, k)
        return probs, gates, idx

    def __call__(self, x: jax.Array, *, dropless: bool = False) -> tuple[jax.Array, dict]:
        """Mix the experts for ``x [B, T, D]``; each row (sequence) is a dispatch group.

        Args:
          x: ``[B, T, D]`` normalised residual stream.
          dropless: ignore ``capacity_factor`` (decoding).

        Returns:
          ``(y [B, T, D], aux)`` with ``aux = {"moe_lb_loss": L_lb, "moe_drop_fraction":
          fraction of (token, choice) pairs dropped by capacity}`` (float32 scalars).
        """
        m = self.moe
        b, t, d = x.shape
        e, k = m.experts, m.top_k
        probs, gates, idx = self.route(x)
        cap = capacity(m, t, dropless)
        choice = jax.nn.one_hot(idx, e, dtype=jnp.int32).reshape(b, t * k, e)  # (B, T k, E)
        # Slot of each (token, choice) pair in its expert's queue: pairs claim slots in
        # order of position, then choice rank.
        slot = jnp.sum((jnp.cumsum(choice, axis=1) - choice) * choice, axis=-1)  # (B, T k)
        kept = slot < cap  # (B, T k)
        flat = idx.reshape(b, t * k) * cap + slot  # (B, T k): row e C + c of the slots
        rows = jnp.arange(b)[:, None]
        token = (
            jnp.full((b, e * cap), t)
            .at[rows, jnp.where(kept, flat, e * cap)]
            .set(jnp.arange(t * k) // k, mode="drop")
        )  # (B, E C): the token in each slot, t (a zero row) where empty
        x_pad = jnp.concatenate([x, jnp.zeros((b, 1, d), x.dtype)], axis=1)  # (B, T + 1, D)
        xe = jnp.take_along_axis(x_pad, token[..., None], axis=1)  # (B, E C, D)
        ye = self.experts(xe.reshape(b, e, cap, d)).reshape(b, e * cap, d)  # (B, E C, D)
        yk = jnp.take_along_axis(ye, jnp.where(kept, flat, 0)[..., None], axis=1)  # (B, T k, D)
        w = (gates.reshape(b, t * k) * kept).astype(ye.dtype)  # dropped pairs: gate 0
        y = jnp.sum((yk * w[..., None]).reshape(b, t, k, d), axis=2)  # (B, T, D)
        if m.shared:
            y = y + self.shared(x)
        f = choice.reshape(b, t, k, e).sum(axis=(1, 2)) / (t * k)  # (B, E) before capacity
        lb = e * jnp.mean(jnp.sum(f * probs.mean(axis=1), axis=-1))
        dropped = jnp.sum(~kept) / (b * t * k)
        return y.astype(x.dtype), {"moe_lb_loss": lb, "moe_drop_fraction": dropped}
