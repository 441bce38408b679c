"""The one way amemory turns a direction into an optimizer: decoupled weight decay, then lr.

Every optimizer of :mod:`amemory.optim` applies ``theta <- theta - lr * (u + wd * theta)``
with ``u`` its ``scale_by_*`` direction: the decay is added to the direction, never to the
gradient, and multiplied by the learning rate, as optax.contrib.muon, torch.optim.Muon and
Keller Jordan's reference do. Source: Loshchilov & Hutter, arXiv 1711.05101 (AdamW).
"""

from __future__ import annotations

from typing import Any

import jax
import optax

__all__ = ["decoupled", "sgd", "weight_decay"]


def weight_decay(wd: Any, mask: Any = None) -> optax.GradientTransformation:
    """``optax.add_decayed_weights`` that keeps the update dtypes, and that accepts
    ``params=None`` when ``wd`` is the constant 0 (a direction alone needs no params)."""
    inner = optax.add_decayed_weights(wd, mask)

    def update_fn(updates, state, params=None):
        if params is None and isinstance(wd, int | float) and wd == 0:
            return updates, state
        out, state = inner.update(updates, state, params)
        out = jax.tree.map(lambda o, u: o.astype(u.dtype), out, updates)
        return out, state

    return optax.GradientTransformation(inner.init, update_fn)


def decoupled(
    direction: optax.GradientTransformation | tuple[optax.GradientTransformation, ...],
    learning_rate: optax.ScalarOrSchedule,
    wd: Any = 0.0,
    weight_decay_mask: Any = None,
) -> optax.GradientTransformation:
    """``chain(direction, add wd * theta, scale by -lr)``: ``theta <- theta - lr (u + wd theta)``.

    Args:
      direction: a transform whose output ``u`` is the update direction, or a tuple of
        transforms chained in place (their states stay flat in the chain's tuple).
      learning_rate: float or optax schedule.
      wd: the weight decay, ``>= 0`` (float, array, or schedule; ``None``: 0).
      weight_decay_mask: optax mask (tree or callable) of the leaves that decay.

    Returns an ``optax.chain`` with state ``(direction state(s)..., weight-decay state,
    learning-rate state)``; raises ``ValueError`` for a negative Python-number ``wd``.
    """
    wd = 0.0 if wd is None else wd
    if isinstance(wd, int | float) and not wd >= 0:
        raise ValueError(f"weight_decay must be >= 0, got {wd!r}")
    single = isinstance(direction, optax.GradientTransformation)  # a NamedTuple itself
    directions = (direction,) if single else tuple(direction)
    return optax.chain(
        *directions,
        weight_decay(wd, weight_decay_mask),
        optax.scale_by_learning_rate(learning_rate),
    )


def sgd(
    learning_rate: optax.ScalarOrSchedule,
    *,
    momentum: Any = 0.9,
    nesterov: bool = False,
    weight_decay: Any = 0.0,
    weight_decay_mask: Any = None,
) -> optax.GradientTransformation:
    """Heavy-ball SGD with decoupled decay: ``m <- momentum m + g``, ``u = m`` (Nesterov:
    ``u = g + momentum m``), ``theta <- theta - lr (u + wd theta)``; ``optax.sgd``'s direction.
    Raises ``ValueError`` for a negative Python-number ``weight_decay``."""
    direction = optax.trace(momentum, nesterov) if momentum != 0 else optax.identity()
    return decoupled(direction, learning_rate, weight_decay, weight_decay_mask)
