"""QK-Clip (MuonClip): rescale the query/key weights of heads whose logits exceeded tau.

After the step, head ``h`` of layer ``l`` whose largest pre-softmax logit in the step's
forward pass was ``S > tau`` gets ``gamma = tau / S``, split over the weights forming the
logit so that it scales by ``gamma`` (MHA: ``gamma^0.5`` on q and k; MLA: ``gamma^0.5`` on
the no-RoPE q and k up-projections, ``gamma`` on the query RoPE part, the shared RoPE key
and V untouched). Kimi K2, arXiv 2507.20534, Sec. 2.1 (tau = 100); MaxText
``qk_clip_utils.py``. optax's ``update`` cannot see forward statistics (optax #1383), so
this is a function the trainer calls after ``apply_updates``; which leaves hold heads, and
their power of ``gamma``, come from the model (``amemory.models.matrices.head_view``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from amemory.optim._paths import path_keys

__all__ = ["qk_clip"]

# (path keys, leaf) -> (layer index, or None for a leaf stacked [L, ...]; axis that
# concatenates the heads, head-major; number of heads; power of gamma), or None.
HeadView = Callable[[tuple, Any], "tuple[int | None, int, int, float] | None"]


def qk_clip(params: Any, max_logits: jax.Array, tau: float, head_view: HeadView) -> Any:
    """Params with the Q/K weights of every head whose max logit exceeded ``tau`` rescaled.

    Args:
      params: parameters after the optimizer step.
      max_logits: ``[L, H]`` float, each layer's and head's largest pre-softmax logit in
        the forward pass of the step (``amemory.models.transformer.apply(...,
        with_aux=True)[1]["max_logit"]``).
      tau: the threshold, ``> 0``.
      head_view: the model's head layout of a leaf (see the module docstring).

    Returns params of the same structure and dtypes (leaves of power 0 or without heads,
    and heads with ``max_logit <= tau``, bit-identical); raises ``ValueError`` for ``tau <= 0``.
    """
    if not tau > 0:
        raise ValueError(f"qk_clip tau must be > 0, got {tau!r}")
    gamma = jnp.minimum(1.0, tau / jnp.maximum(max_logits.astype(jnp.float32), 1e-30))

    def clip(path, leaf):
        view = head_view(path_keys(path), leaf)
        if view is None or view[3] == 0:
            return leaf
        layer, axis, heads, power = view
        axis %= leaf.ndim
        g = (gamma if layer is None else gamma[layer]) ** power  # [(L,) H]
        split = leaf.shape[:axis] + (heads, leaf.shape[axis] // heads) + leaf.shape[axis + 1 :]
        g = g.reshape(g.shape[:-1] + (1,) * (axis - g.ndim + 1) + (heads, 1))
        g = g.reshape(g.shape + (1,) * (len(split) - g.ndim))
        out = jnp.where(g < 1, leaf.reshape(split) * g.astype(leaf.dtype), leaf.reshape(split))
        return out.reshape(leaf.shape)

    return jax.tree_util.tree_map_with_path(clip, params)
