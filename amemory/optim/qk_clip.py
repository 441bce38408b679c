"""QK-Clip (MuonClip): rescale the query/key weights of heads whose logits exceeded tau.

After the optimizer step, every attention head ``h`` of layer ``l`` whose largest
pre-softmax logit in the step's forward pass was ``S_max > tau`` gets
``gamma = tau / S_max`` (else 1), split over the weights that form the logit so that the
logit itself scales by ``gamma``: the query and key kernels of multi-head attention get
``gamma^0.5`` each (Megatron's ``alpha = 0.5``); multi-head latent attention's no-RoPE
query and key up-projections get ``gamma^0.5`` each, the query RoPE projection
``gamma``, and the RoPE key (shared by the heads) and the values are untouched. Source:
Kimi Team, "Kimi K2", arXiv 2507.20534, Sec. 2.1 (tau = 100); MaxText
``qk_clip_utils.py`` (the MLA rule).

optax's ``update(grads, state, params)`` cannot see forward statistics (optax #1383), so
this is a plain function the trainer calls with them after ``apply_updates``. It knows
roles (this package's vocabulary) and nothing of a model: where the heads of a leaf
lie comes from the model side (``head_view``), e.g.
``amemory.models.matrices.head_view``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from amemory.optim._paths import path_keys

__all__ = ["QK_CLIP_EXPONENTS", "qk_clip"]

#: role -> power of ``gamma`` its heads are multiplied by (roles not listed: untouched).
QK_CLIP_EXPONENTS = {"q": 0.5, "k": 0.5, "q_up": 0.5, "k_up": 0.5, "q_rope": 1.0}

# (path keys, leaf) -> (layer index, or None for a leaf stacked [L, ...]; axis that
# concatenates the heads, head-major; number of heads), or None: a leaf without heads.
HeadView = Callable[[tuple, Any], "tuple[int | None, int, int] | None"]


def qk_clip(params: Any, max_logits: jax.Array, tau: float, roles: Any, head_view: HeadView) -> Any:
    """Params with the Q/K weights of every head whose max logit exceeded ``tau`` rescaled.

    Args:
      params: parameters after the optimizer step.
      max_logits: ``[L, H]`` float, each layer's and head's largest pre-softmax logit in
        the forward pass of the step (``amemory.models.transformer.apply(...,
        with_aux=True)[1]["max_logit"]``).
      tau: the threshold, ``> 0``.
      roles: tree of role strings, same structure as ``params``.
      head_view: the model's head layout of a leaf (see the module docstring).

    Returns:
      params of the same structure and dtypes; leaves of roles outside
      :data:`QK_CLIP_EXPONENTS`, and every head with ``max_logit <= tau``, bit-identical.

    Raises:
      ValueError: ``tau <= 0``.
    """
    if not tau > 0:
        raise ValueError(f"qk_clip tau must be > 0, got {tau!r}")
    gamma = jnp.minimum(1.0, tau / jnp.maximum(max_logits.astype(jnp.float32), 1e-30))

    def clip(path, leaf, role):
        view = head_view(path_keys(path), leaf) if role in QK_CLIP_EXPONENTS else None
        if view is None:
            return leaf
        layer, axis, heads = view
        axis %= leaf.ndim
        g = (gamma if layer is None else gamma[layer]) ** QK_CLIP_EXPONENTS[role]  # [(L,) H]
        split = leaf.shape[:axis] + (heads, leaf.shape[axis] // heads) + leaf.shape[axis + 1 :]
        g = g.reshape(g.shape[:-1] + (1,) * (axis - g.ndim + 1) + (heads, 1))
        g = g.reshape(g.shape + (1,) * (len(split) - g.ndim))
        out = jnp.where(g < 1, leaf.reshape(split) * g.astype(leaf.dtype), leaf.reshape(split))
        return out.reshape(leaf.shape)

    return jax.tree_util.tree_map_with_path(clip, params, roles)
