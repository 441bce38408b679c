"""Sign-based optimizers as thin compositions of Optax parts.

SignGD is Adam with ``beta1 = beta2 = 0`` (and ``eps = 0``): the update is the
coordinate-wise sign of the gradient. Signum adds momentum before the sign.

Sources: Bernstein et al., "signSGD: Compressed Optimisation for Non-Convex
Problems", ICML 2018 (arXiv 1802.04434); Wang et al. 2025 (arXiv 2509.26030),
Sec. 5, where SignGD is ``W <- W - lr * sign(grad L)``.
"""

from __future__ import annotations

import optax

__all__ = ["signgd", "signum"]


def signgd(learning_rate: optax.ScalarOrSchedule) -> optax.GradientTransformation:
    """SignGD: ``theta <- theta - lr * sign(g)`` coordinate-wise (``sign(0) = 0``).

    Args:
      learning_rate: float or optax schedule (units: parameter units per step;
        every coordinate moves by exactly ``lr`` unless its gradient is 0).

    Returns:
      ``optax.GradientTransformation`` (stateless apart from the schedule count).

    Example:
      >>> import jax.numpy as jnp
      >>> tx = signgd(0.1)
      >>> u, _ = tx.update({"w": jnp.array([2.0, -3.0, 0.0])}, tx.init({"w": jnp.zeros(3)}))
      >>> print(u["w"])
      [-0.1  0.1 -0. ]
    """
    return optax.chain(optax.scale_by_sign(), optax.scale_by_learning_rate(learning_rate))


def signum(
    learning_rate: optax.ScalarOrSchedule, beta: float = 0.9
) -> optax.GradientTransformation:
    """Signum: ``m <- beta m + (1 - beta) g``, ``theta <- theta - lr * sign(m)``.

    No bias correction is needed: the sign ignores positive rescaling.

    Args:
      learning_rate: float or optax schedule.
      beta: momentum decay in ``[0, 1)``; ``beta = 0`` is :func:`signgd`.

    Returns:
      ``optax.GradientTransformation`` whose state holds the momentum (same
      tree, shapes and dtypes as the parameters).

    Raises:
      ValueError: ``beta`` outside ``[0, 1)``.
    """
    if not 0.0 <= float(beta) < 1.0:
        raise ValueError(f"beta must be in [0, 1), got {beta!r}")
    return optax.chain(
        optax.ema(decay=beta, debias=False),
        optax.scale_by_sign(),
        optax.scale_by_learning_rate(learning_rate),
    )
