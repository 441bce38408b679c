"""Muon plus a second moment of the orthogonalised direction: NorMuon and AdaMuon.

Both run Muon's update path (momentum, Nesterov look-ahead, batched orthogonalisation,
shape scaling; the options and steps of ``amemory.optim._muon_core``) and, between the
direction ``O`` and the shape scaling, divide ``O`` by the square root of an EMA of its
squares, then fix its Frobenius norm:

- NorMuon: one second moment per output neuron (column of ``[fan_in, fan_out]``), the
  Frobenius norm of ``O`` restored (Li et al., arXiv 2510.05491).
- AdaMuon: one second moment per entry, ``sign(U)`` orthogonalised instead of ``U``, the
  Frobenius norm set to ``sqrt(min(fan_in, fan_out))`` (that of a semi-orthogonal
  matrix) and then ``shape_scale="rms_match"``, so the update RMS is ``rms_scale`` = 0.2
  as Adam's (Si et al., arXiv 2507.11005).

Leaves, ``matrix_axes``, batching, ``ns_mesh`` and ``distributed`` behave as in
:mod:`amemory.optim.muon`. In the owner layout (``amemory.optim.distributed``) the
normalisation runs on the device that owns the whole matrix, right after its
Newton-Schulz, and the second moment is stored there (:class:`OwnerStacks`), so it adds
no collective (the paper's FSDP2 design, arXiv 2510.05491, Sec. 4).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from amemory.optim._chain import decoupled
from amemory.optim._muon_core import MuonOptions, check_unit_interval, with_options
from amemory.optim.distributed import OwnerStacks, auto_sharded

__all__ = [
    "AdaMuonState",
    "NorMuonState",
    "adamuon",
    "normuon",
    "scale_by_adamuon",
    "scale_by_normuon",
]


class NorMuonState(NamedTuple):
    """State of :func:`scale_by_normuon`."""

    count: jax.Array  # [] int32
    mu: optax.Updates  # momentum, same tree/shapes as params
    # per-output-neuron second moment, [*batch_shape, fan_out] per leaf, dtype float32
    # (float64 for float64 parameters); in the owner layout (amemory.optim.distributed) an
    # OwnerStacks of [B_pad, fan_out] per stack, split over the mesh devices
    nu: optax.Updates | OwnerStacks
    diagnostics: Any  # None, or {"ortho_error": ..., "update_rms": ...} as in MuonState


class AdaMuonState(NamedTuple):
    """State of :func:`scale_by_adamuon`."""

    count: jax.Array  # [] int32
    mu: optax.Updates  # momentum, same tree/shapes as params
    # per-entry second moment, [*batch_shape, fan_in, fan_out] per leaf (the leaf's
    # matrix layout), dtype float32 (float64 for float64 parameters); in the owner layout
    # an OwnerStacks of [B_pad, k, l] (wide orientation) per stack
    nu: optax.Updates | OwnerStacks
    diagnostics: Any  # None, or {"ortho_error": ..., "update_rms": ...} as in MuonState


def _abs2(o: jax.Array) -> jax.Array:
    return jnp.real(o * jnp.conj(o)) if jnp.iscomplexobj(o) else jnp.square(o)


def _frobenius(o: jax.Array) -> jax.Array:
    return jnp.sqrt(jnp.sum(_abs2(o), axis=(1, 2), keepdims=True))


def _normalize(
    o: jax.Array, v: jax.Array, beta2: Any, eps: Any, per_neuron: bool
) -> tuple[jax.Array, jax.Array]:
    """Second-moment normalisation of one stack ``o [b, fan_in, fan_out]`` with state ``v``.

    Returns ``(o', v')`` with ``o'`` ``[b, fan_in, fan_out]`` (at least fp32) and ``v'``
    ``[b, fan_out]`` (``per_neuron``) or ``[b, fan_in, fan_out]``. NorMuon (per neuron)
    restores ``||o||_F``; AdaMuon (per entry) sets it to ``sqrt(min(fan_in, fan_out))``.
    """
    o = o.astype(jnp.promote_types(o.dtype, jnp.float32))
    sq = _abs2(o)
    fresh = jnp.mean(sq, axis=1) if per_neuron else sq
    v = beta2 * v.reshape(fresh.shape).astype(sq.dtype) + (1.0 - beta2) * fresh
    scale = jnp.sqrt(v)[:, None, :] if per_neuron else jnp.sqrt(v)
    o2 = o / (scale + eps)
    target = _frobenius(o) if per_neuron else jnp.sqrt(float(min(o.shape[1:])))
    return o2 * (target / (_frobenius(o2) + eps)), v


def _moment_transform(opts: MuonOptions, beta2: Any, eps: Any, per_neuron: bool, state_cls):
    check_unit_interval("beta2", beta2)

    def nu_shape(lay):
        return lay.batch_shape + ((lay.fan_out,) if per_neuron else (lay.fan_in, lay.fan_out))

    def init_fn(params):
        layouts, treedef, fields = opts.init_fields(params)
        leaves = treedef.flatten_up_to(params)
        if opts.layout is not None:  # the second moment lives with each matrix's owner
            dtype = jnp.result_type(jnp.float32, *[x.dtype for x in leaves])
            shape = (lambda g: (g.width,)) if per_neuron else (lambda g: (g.k, g.l))
            nu = opts.layout.init_state(
                layouts, batch_leaves=opts.batch_leaves, shape=shape, dtype=dtype
            )
            return state_cls(nu=nu, **fields)
        nu = treedef.unflatten(
            [
                jnp.zeros(nu_shape(lay), jnp.promote_types(x.dtype, jnp.float32))
                for lay, x in zip(layouts, leaves, strict=True)
            ]
        )
        return state_cls(nu=nu, **fields)

    def post(o, v, tall):  # owner layout: o [c, k, l] wide (k <= l), v its owner state rows
        if not per_neuron:  # per entry: the orientation does not matter
            o2, v2 = _normalize(o, v, beta2, eps, False)
            return o2.astype(o.dtype), v2.astype(v.dtype)
        x = jnp.swapaxes(o, 1, 2) if tall else o  # [c, fan_in, fan_out]
        x, v2 = _normalize(x, v, beta2, eps, True)
        return (jnp.swapaxes(x, 1, 2) if tall else x).astype(o.dtype), v2.astype(v.dtype)

    def update_fn(updates, state, params=None):
        del params
        if opts.layout is not None:
            step = opts.direction(updates, state.mu, state.count, post, state.nu)
            out, diag = opts.finish(step, step.mats)
            return out, state_cls(
                count=step.count, mu=step.mu, nu=step.post_state, diagnostics=diag
            )
        step = opts.direction(updates, state.mu, state.count)
        v_leaves = step.treedef.flatten_up_to(state.nu)
        mats, new_v = [], []
        for o, v, lay in zip(step.mats, v_leaves, step.layouts, strict=True):
            o2, v2 = _normalize(o, v, beta2, eps, per_neuron)
            mats.append(o2)
            new_v.append(v2.reshape(nu_shape(lay)).astype(v.dtype))
        out, diag = opts.finish(step, mats)
        new_state = state_cls(
            count=step.count, mu=step.mu, nu=step.treedef.unflatten(new_v), diagnostics=diag
        )
        return out, new_state

    return auto_sharded(optax.GradientTransformation(init_fn, update_fn))


@with_options()
def scale_by_normuon(
    *, beta2: Any = 0.95, normuon_eps: Any = 1e-10, **options: Any
) -> optax.GradientTransformation:
    r"""NorMuon direction: Muon followed by per-neuron second-moment normalisation.

    After ``O`` (as in :func:`amemory.optim.scale_by_muon`), per matrix ``[fan_in, fan_out]``::

        v <- beta2 v + (1 - beta2) mean_{fan_in}(O * O)      # [fan_out], one per output neuron
        O' = O / (sqrt(v) + normuon_eps)                      # row-wise in PyTorch's [out, in]
        O' <- O' * ||O||_F / (||O'||_F + normuon_eps)         # keep the pre-normalisation norm
        update = O' * shape_scale_factor(shape_scale, fan_in, fan_out)

    This is the official NorMuon update (its ``normuon_update``: EMA momentum with
    Nesterov, Frobenius norm preserved, Keller's ``"jordan"`` scaling).

    Args:
      beta2: second-moment decay in ``[0, 1)`` (may be injected).
      normuon_eps: added to ``sqrt(v)`` and to the norm in the rescale.
      **options: every :class:`amemory.optim.MuonOptions` field, as in ``scale_by_muon``.

    Returns:
      ``optax.GradientTransformation`` with state :class:`NorMuonState`.

    Raises:
      ValueError: as :func:`amemory.optim.scale_by_muon`, or ``beta2`` outside ``[0, 1)``.

    References:
      Li et al., "NorMuon: Making Muon more efficient and scalable", arXiv 2510.05491.
    """
    return _moment_transform(MuonOptions(**options), beta2, normuon_eps, True, NorMuonState)


@with_options()
def normuon(
    learning_rate: optax.ScalarOrSchedule,
    *,
    beta2: Any = 0.95,
    normuon_eps: Any = 1e-10,
    weight_decay: Any = None,
    weight_decay_mask: Any = None,
    **options: Any,
) -> optax.GradientTransformation:
    """NorMuon optimizer: :func:`scale_by_normuon`, decoupled weight decay, learning rate.

    ``theta <- theta - lr * (O' + wd * theta)`` with ``O'`` the :func:`scale_by_normuon`
    output.

    Args:
      learning_rate: float or optax schedule.
      beta2: second-moment decay in ``[0, 1)``.
      normuon_eps: see :func:`scale_by_normuon`.
      weight_decay: decoupled weight decay (``None``: 0).
      weight_decay_mask: optax mask for the decay.
      **options: any :class:`amemory.optim.MuonOptions` field.

    Returns:
      ``optax.GradientTransformation``.

    Raises:
      ValueError: unknown option name (lists the allowed ones) or bad value.
    """
    direction = scale_by_normuon(beta2=beta2, normuon_eps=normuon_eps, **options)
    return decoupled(
        direction, learning_rate, 0.0 if weight_decay is None else weight_decay, weight_decay_mask
    )


_ADAMUON_DEFAULTS = {"presign": True, "shape_scale": "rms_match"}


@with_options(defaults=_ADAMUON_DEFAULTS)
def scale_by_adamuon(
    *, beta2: Any = None, adamuon_eps: Any = 1e-8, **options: Any
) -> optax.GradientTransformation:
    r"""AdaMuon direction: Muon on ``sign(U)``, per-entry second moment, RMS-aligned scale.

    Per matrix ``[fan_in, fan_out]`` (``U`` the Nesterov momentum of ``scale_by_muon``)::

        O = orth(sign(U))                                   # presign=True
        V <- beta2 V + (1 - beta2) O * O                    # per entry
        O' = O / (sqrt(V) + eps)
        O' <- O' * sqrt(min(fan_in, fan_out)) / (||O'||_F + eps)
        update = O' * rms_scale * sqrt(max(fan_in, fan_out))   # shape_scale="rms_match"

    so ``update = 0.2 sqrt(fan_in fan_out) O' / ||O'||_F`` has RMS ``rms_scale = 0.2``,
    the official update (github.com/Chongjie-Si/AdaMuon, ``gpt2/models/optimizers/
    adamuon.py``: EMA momentum 0.95 with Nesterov, ``V`` decayed with the momentum
    coefficient, no bias correction of ``V``; the first release applied no sign).

    Args:
      beta2: decay of ``V`` in ``[0, 1)``; ``None`` uses ``momentum`` (the official code).
      adamuon_eps: added to ``sqrt(V)`` and to the norm in the rescale.
      **options: every :class:`amemory.optim.MuonOptions` field; defaults differ from
        Muon's in ``presign=True`` and ``shape_scale="rms_match"``.

    Returns:
      ``optax.GradientTransformation`` with state :class:`AdaMuonState`.

    Raises:
      ValueError: as :func:`amemory.optim.scale_by_muon`, or ``beta2`` outside ``[0, 1)``.

    References:
      Si, Zhang, Shen, "AdaMuon: Adaptive Muon Optimizer", arXiv 2507.11005, Algorithm 1.
    """
    opts = MuonOptions(**options)
    b2 = opts.momentum if beta2 is None else beta2
    return _moment_transform(opts, b2, adamuon_eps, False, AdaMuonState)


@with_options(defaults=_ADAMUON_DEFAULTS)
def adamuon(
    learning_rate: optax.ScalarOrSchedule,
    *,
    beta2: Any = None,
    adamuon_eps: Any = 1e-8,
    weight_decay: Any = None,
    weight_decay_mask: Any = None,
    **options: Any,
) -> optax.GradientTransformation:
    """AdaMuon optimizer: :func:`scale_by_adamuon`, decoupled weight decay, learning rate.

    ``theta <- theta - lr * (O' + wd * theta)`` (the official ``p (1 - lr wd) - lr O'``).

    Args:
      learning_rate: float or optax schedule (the update RMS is ``rms_scale``: use
        Adam-like learning rates).
      beta2: decay of the second moment (``None``: ``momentum``).
      adamuon_eps: see :func:`scale_by_adamuon`.
      weight_decay: decoupled weight decay (``None``: 0).
      weight_decay_mask: optax mask for the decay.
      **options: any :class:`amemory.optim.MuonOptions` field.

    Returns:
      ``optax.GradientTransformation``.

    Raises:
      ValueError: unknown option name (lists the allowed ones) or bad value.
    """
    direction = scale_by_adamuon(beta2=beta2, adamuon_eps=adamuon_eps, **options)
    return decoupled(
        direction, learning_rate, 0.0 if weight_decay is None else weight_decay, weight_decay_mask
    )
