"""Muon as an Optax gradient transformation (NorMuon / AdaMuon live in ``normuon``).

Muon (MomentUm Orthogonalized by Newton-Schulz) keeps a momentum buffer per matrix
parameter and replaces each update by (an approximation of) its polar factor, rescaled by
a shape-dependent factor (the formulas: :func:`scale_by_muon`; every option is a field of
:class:`amemory.optim.MuonOptions`). The update reads ``momentum -> orthogonalize ->
scale`` (``_muon_core``, ``_matrices``).

Matrix convention. Every leaf is seen as a matrix ``[fan_in, fan_out]`` (plus optional
batch axes), the layout of Flax ``nnx.Linear`` kernels (``y = x @ W``);
``matrix_axes=(in_axes, out_axes)`` picks the axes: ``(0, 1)`` by default for 2-D leaves,
``(1, 0)`` for a PyTorch-style ``[d_out, d_in]`` weight, ``(-2, -1)`` for stacked layers or
experts ``[L, ..., fan_in, fan_out]`` (leading axes are batch axes). Only the shape scaling
depends on which side is fan_in. A leaf that is not a matrix under this rule raises
``ValueError`` naming its path and shape: Muon never falls back to Adam; routing
(``amemory.optim.routing``) decides which leaves reach it.

Sources: Jordan (2024) https://kellerjordan.github.io/posts/muon/ ; Liu et al.,
"Muon is Scalable for LLM Training" (Moonlight), arXiv 2502.16982; optax
0.2.8 ``optax.contrib.muon``; Wang et al. 2025, arXiv 2509.26030 (sum momentum,
no Nesterov).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import optax

from amemory.optim._chain import decoupled
from amemory.optim._matrices import leaf_layouts, orthogonalize
from amemory.optim._muon_core import (
    MuonOptions,
    init_state,
    momentum,
    options_from,
    scale,
    with_options,
)
from amemory.optim.distributed import auto_sharded
from amemory.optim.presets import preset_options

__all__ = ["MuonState", "muon", "muon_direction", "scale_by_muon"]


class MuonState(NamedTuple):
    """State of :func:`scale_by_muon`."""

    count: jax.Array  # [] int32: number of updates applied so far
    mu: optax.Updates  # momentum, same tree/shapes as params, dtype mu_dtype (default param dtype)
    diagnostics: Any  # None, or {"ortho_error", "update_rms"}: trees of [] float32 (last update)


@with_options()
def scale_by_muon(**options: Any) -> optax.GradientTransformation:
    r"""Muon direction: momentum, orthogonalisation, shape scaling (no learning rate).

    Per matrix leaf ``G`` (seen as ``[batch, fan_in, fan_out]``, see module doc)::

        ema: M <- beta M + (1 - beta) G          sum: M <- beta M + G
        Nesterov (ema): U = beta M + (1 - beta) G   (Keller Jordan: lerp(G, M, beta))
        Nesterov (sum): U = G + beta M              (Moonlight)
        no Nesterov:    U = M
        bias_correction (ema only, optax.contrib.muon):
            U = beta M / (1 - beta^(t+1)) + (1 - beta) G / (1 - beta^t)   (Nesterov)
            U = M / (1 - beta^t)                                        (otherwise)
        O = LMO_norm(U)        norm="spectral": orth(U) (NS or polar), "sign": sign(U), ...
        O <- <U, O> O          nuclear_scale="matrix" (PolarGrad)
        update = O * shape_scale_factor(shape_scale, fan_in, fan_out)

    ``momentum=0`` with ``orthogonalizer="polar"`` and ``shape_scale="none"`` is the
    papers' ``W <- W - lr msgn(G)``; the same with ``norm="sign"`` is SignGD.

    Args:
      **options: any field of :class:`amemory.optim.MuonOptions` (its docstring lists
        them, their defaults and allowed values). With ``optax.inject_hyperparams``, pass
        a callable ``matrix_axes`` or a dtype object ``ns_dtype`` in ``static_args``
        (they would be taken for schedules).

    Returns a transformation with state :class:`MuonState` whose updates have the
    gradients' shapes and dtypes. Raises ``ValueError`` for a bad option (lists allowed
    values) or, at ``init`` before any compilation, a leaf that is not a matrix (names it).

    Example:
      >>> import jax.numpy as jnp, optax
      >>> tx = optax.chain(scale_by_muon(), optax.scale_by_learning_rate(0.02))
      >>> params = {"w": jnp.ones((4, 8))}
      >>> u, state = tx.update({"w": jnp.eye(4, 8)}, tx.init(params))
      >>> u["w"].shape
      (4, 8)

    References:
      Jordan (2024); Liu et al. arXiv 2502.16982; optax.contrib.muon (0.2.8);
      Wang et al. arXiv 2509.26030.
    """
    return muon_direction(MuonOptions(**options))


def muon_direction(opts: MuonOptions) -> optax.GradientTransformation:
    """:func:`scale_by_muon` from a validated :class:`MuonOptions` (state :class:`MuonState`)."""

    def init_fn(params):
        return MuonState(**init_state(params, opts)[2])  # validates every leaf

    def update_fn(updates, state, params=None):
        del params
        grads, treedef, layouts = leaf_layouts(updates, opts.matrix_axes)
        count = optax.safe_increment(state.count)
        mu, u = momentum(grads, treedef.flatten_up_to(state.mu), count, opts)
        mats = [lay.to_matrix(x) for x, lay in zip(u, layouts, strict=True)]
        o, errors, _ = orthogonalize(mats, layouts, opts)
        out, diag = scale(o, grads, layouts, opts, errors, treedef)
        return out, MuonState(count=count, mu=treedef.unflatten(mu), diagnostics=diag)

    return auto_sharded(optax.GradientTransformation(init_fn, update_fn))


@with_options(unset_defaults=True)
def muon(
    learning_rate: optax.ScalarOrSchedule,
    *,
    preset: str | None = None,
    weight_decay: Any = None,
    weight_decay_mask: Any = None,
    **options: Any,
) -> optax.GradientTransformation:
    r"""Muon optimizer: :func:`scale_by_muon`, decoupled weight decay, learning rate.

    ``theta <- theta - lr * (O + wd * theta) = theta (1 - lr wd) - lr O`` where ``O`` is
    the :func:`scale_by_muon` output (the Keller Jordan / torch / optax convention).

    Args:
      learning_rate: float or optax schedule (units: spectral-norm-ish step per
        update for ``shape_scale="none"``; see ``shape_scale_factor``).
      preset: ``None`` (the :class:`MuonOptions` defaults) or a name in
        ``amemory.optim.PRESETS``; every option passed explicitly (``None`` included)
        overrides the preset's.
      weight_decay: decoupled weight decay ``wd`` (``None``: the preset's, else 0).
      weight_decay_mask: optax mask tree/callable for the decay.
      **options: any :class:`MuonOptions` field; an option not passed takes the preset's
        value, else the field's default.

    Returns:
      ``optax.GradientTransformation`` (a ``chain``); ``optax.inject_hyperparams(muon)``
      injects ``learning_rate``, ``weight_decay`` and every numeric option passed
      (``momentum``, ``ns_eps``, ``rms_scale``).

    Raises:
      ValueError: unknown preset or option name (lists the allowed ones), or a bad value.

    Example:
      >>> import jax.numpy as jnp
      >>> tx = muon(0.02, preset="jordan", weight_decay=0.01)
      >>> state = tx.init({"w": jnp.zeros((8, 8))})
    """
    base = preset_options(preset) if preset is not None else {}
    wd = base.get("weight_decay") if weight_decay is None else weight_decay  # None: 0
    direction = muon_direction(options_from(options, base))
    return decoupled(direction, learning_rate, wd, weight_decay_mask)
