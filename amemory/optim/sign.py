"""Sign-based optimizers as thin compositions of Optax parts.

SignGD (Adam with ``beta1 = beta2 = eps = 0``) is the coordinate-wise sign of the
gradient; Signum adds momentum before the sign. Weight decay is decoupled: it never passes
through the sign. Sources: Bernstein et al., "signSGD: Compressed Optimisation for
Non-Convex Problems", ICML 2018 (arXiv 1802.04434); Wang et al. 2025 (arXiv 2509.26030),
Sec. 5, where SignGD is ``W <- W - lr * sign(grad L)``.
"""

from __future__ import annotations

from typing import Any

import optax

from amemory.optim._chain import decoupled
from amemory.optim._muon_core import check_unit_interval

__all__ = ["signgd", "signum"]


def signgd(
    learning_rate: optax.ScalarOrSchedule, *, weight_decay: Any = 0.0, weight_decay_mask: Any = None
) -> optax.GradientTransformation:
    """SignGD: ``theta <- theta - lr * (sign(g) + wd * theta)`` coordinate-wise (``sign(0) = 0``).

    Args:
      learning_rate: float or optax schedule (units: parameter units per step;
        every coordinate moves by exactly ``lr`` unless its gradient is 0, when ``wd = 0``).
      weight_decay: decoupled weight decay ``wd >= 0``.
      weight_decay_mask: optax mask for the decay.

    Returns:
      ``optax.GradientTransformation`` (a chain: sign, decay, learning rate).

    Example:
      >>> import jax.numpy as jnp
      >>> tx = signgd(0.1)
      >>> u, _ = tx.update({"w": jnp.array([2.0, -3.0, 0.0])}, tx.init({"w": jnp.zeros(3)}))
      >>> print(u["w"])
      [-0.1  0.1 -0. ]
    """
    return decoupled(optax.scale_by_sign(), learning_rate, weight_decay, weight_decay_mask)


def signum(
    learning_rate: optax.ScalarOrSchedule,
    beta: Any = 0.9,
    *,
    weight_decay: Any = 0.0,
    weight_decay_mask: Any = None,
) -> optax.GradientTransformation:
    """Signum: ``m <- beta m + (1 - beta) g``, ``theta <- theta - lr * (sign(m) + wd * theta)``.

    No bias correction is needed: the sign ignores positive rescaling.

    Args:
      learning_rate: float or optax schedule.
      beta: momentum decay in ``[0, 1)``; ``beta = 0`` is :func:`signgd`. May be an
        array (``optax.inject_hyperparams(signum)(learning_rate=..., beta=...)``).
      weight_decay: decoupled weight decay ``wd >= 0``.
      weight_decay_mask: optax mask for the decay.

    Returns:
      ``optax.GradientTransformation`` whose state holds the momentum (same
      tree, shapes and dtypes as the parameters).

    Raises:
      ValueError: a Python-number ``beta`` outside ``[0, 1)``.
    """
    check_unit_interval("beta", beta)
    direction = optax.chain(optax.ema(decay=beta, debias=False), optax.scale_by_sign())
    return decoupled(direction, learning_rate, weight_decay, weight_decay_mask)
