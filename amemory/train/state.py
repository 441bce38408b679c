"""``TrainState``: everything on the device that one training step reads and writes.

The data position (how far the input pipeline has read) lives on the host; the
checkpoint stores it next to this state (see ``amemory.train.checkpoint``), so a
restored run continues with exactly the next batch.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax


class TrainState(NamedTuple):
    """Pytree carried from step to step (a NamedTuple, so Orbax and ``jax.tree`` see its fields).

    In a multi-seed run every leaf has a leading seed axis ``[S, ...]``.
    """

    step: jax.Array  # [] int32: optimizer steps completed
    params: Any  # nested dict of arrays (model parameters)
    opt_state: Any  # optax state (NamedTuples of arrays)
    rng: jax.Array  # [2] uint32: raw PRNG key (jax.random.PRNGKey), split once per step
