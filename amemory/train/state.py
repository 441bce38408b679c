"""``TrainState``: everything on the device that one training step reads and writes (the
input position lives on the host; the checkpoint stores it beside this state)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax


class TrainState(NamedTuple):
    """Pytree carried from step to step (multi-seed: every leaf has a seed axis ``[S, ...]``)."""

    step: jax.Array  # [] int32: optimizer steps completed
    params: Any  # nested dict of arrays (model parameters)
    opt_state: Any  # optax state (NamedTuples of arrays)
    rng: jax.Array  # [2] uint32: raw PRNG key (jax.random.PRNGKey), split once per step
