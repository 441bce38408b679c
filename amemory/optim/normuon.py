"""Muon plus a second moment of the orthogonalised direction: NorMuon and AdaMuon.

Both run Muon's update path and, between the direction ``O`` and the shape scaling,
divide ``O`` by the square root of an EMA of its squares, then fix its Frobenius norm:
NorMuon per output neuron (Li et al., arXiv 2510.05491), AdaMuon per entry, on ``sign(U)``
(Si et al., arXiv 2507.11005). In the owner layout (``amemory.optim.distributed``) this
runs, and the second moment lives, on the device that owns the whole matrix: no
collective (the NorMuon paper's FSDP2 design, Sec. 4).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from amemory.optim._chain import decoupled
from amemory.optim._matrices import leaf_layouts, orthogonalize
from amemory.optim._muon_core import (
    MuonOptions,
    check_unit_interval,
    init_state,
    momentum,
    scale,
    with_options,
)
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
    # per-output-neuron second moment, [*batch_shape, fan_out] per leaf, float32 (float64
    # for float64 parameters); in the owner layout an OwnerStacks of [B_pad, fan_out]
    nu: optax.Updates | OwnerStacks
    diagnostics: Any  # None, or {"ortho_error": ..., "update_rms": ...} as in MuonState


class AdaMuonState(NamedTuple):
    """State of :func:`scale_by_adamuon`."""

    count: jax.Array  # [] int32
    mu: optax.Updates  # momentum, same tree/shapes as params
    # per-entry second moment, [*batch_shape, fan_in, fan_out] per leaf, float32 (float64
    # for float64 parameters); in the owner layout an OwnerStacks of [B_pad, k, l] (wide)
    nu: optax.Updates | OwnerStacks
    diagnostics: Any  # None, or {"ortho_error": ..., "update_rms": ...} as in MuonState


def _abs2(o: jax.Array) -> jax.Array:
    return jnp.real(o * jnp.conj(o)) if jnp.iscomplexobj(o) else jnp.square(o)


def _frobenius(o: jax.Array) -> jax.Array:
    return jnp.sqrt(jnp.sum(_abs2(o), axis=(1, 2), keepdims=True))


def _per_neuron(beta2: Any, eps: Any):
    """NorMuon's normalisation ``(o [b, fan_in, fan_out], v, tall) -> (o', v' [b, fan_out])``
    (a wide owner-layout stack of tall matrices, ``tall``, is transposed around it)."""

    def normalize(o, v, tall):
        x = jnp.swapaxes(o, 1, 2) if tall else o
        x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
        v2 = beta2 * v.reshape(x.shape[0], -1).astype(x.dtype) + (1 - beta2) * jnp.mean(
            _abs2(x), axis=1
        )
        x2 = x / (jnp.sqrt(v2)[:, None, :] + eps)
        x2 = x2 * (_frobenius(x) / (_frobenius(x2) + eps))  # keep ||O||_F
        return (jnp.swapaxes(x2, 1, 2) if tall else x2).astype(o.dtype), v2.astype(v.dtype)

    return normalize


def _per_entry(beta2: Any, eps: Any):
    """AdaMuon's normalisation ``(o [b, p, q], v, tall) -> (o', v' [b, p, q])`` (any
    orientation: it is entrywise, then sets ``||o'||_F = sqrt(min(p, q))``)."""

    def normalize(o, v, tall):
        del tall
        x = o.astype(jnp.promote_types(o.dtype, jnp.float32))
        v2 = beta2 * v.reshape(x.shape).astype(x.dtype) + (1 - beta2) * _abs2(x)
        x2 = x / (jnp.sqrt(v2) + eps)
        x2 = x2 * (jnp.sqrt(float(min(x.shape[1:]))) / (_frobenius(x2) + eps))
        return x2.astype(o.dtype), v2.astype(v.dtype)

    return normalize


def _moment_transform(opts: MuonOptions, beta2: Any, normalize, nu_shape, owner_shape, state_cls):
    """The update of NorMuon / AdaMuon: Muon's steps with ``normalize`` between the
    orthogonalisation and the shape scaling; the second moment has ``nu_shape(layout)``
    per leaf, or ``owner_shape(group)`` per stack in the owner layout."""
    check_unit_interval("beta2", beta2)

    def init_fn(params):
        layouts, treedef, fields = init_state(params, opts)
        leaves = treedef.flatten_up_to(params)
        if opts.layout is not None:  # the second moment lives with each matrix's owner
            dtype = jnp.result_type(jnp.float32, *[x.dtype for x in leaves])
            nu = opts.layout.init_state(
                layouts, batch_leaves=opts.batch_leaves, shape=owner_shape, dtype=dtype
            )
        else:
            nu = treedef.unflatten(
                [
                    jnp.zeros(nu_shape(lay), jnp.promote_types(x.dtype, jnp.float32))
                    for lay, x in zip(layouts, leaves, strict=True)
                ]
            )
        return state_cls(nu=nu, **fields)

    def update_fn(updates, state, params=None):
        del params
        grads, treedef, layouts = leaf_layouts(updates, opts.matrix_axes)
        count = optax.safe_increment(state.count)
        mu, u = momentum(grads, treedef.flatten_up_to(state.mu), count, opts)
        mats = [lay.to_matrix(x) for x, lay in zip(u, layouts, strict=True)]
        if opts.layout is not None:  # OwnerStacks in, OwnerStacks out
            o, errors, nu = orthogonalize(mats, layouts, opts, normalize, state.nu)
        else:
            old = treedef.flatten_up_to(state.nu)
            o, errors, nu = orthogonalize(mats, layouts, opts, normalize, old)
            nu = treedef.unflatten([v.reshape(w.shape) for v, w in zip(nu, old, strict=True)])
        out, diag = scale(o, grads, layouts, opts, errors, treedef)
        return out, state_cls(count=count, mu=treedef.unflatten(mu), nu=nu, diagnostics=diag)

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
    return _moment_transform(
        MuonOptions(**options), beta2, _per_neuron(beta2, normuon_eps),
        lambda lay: lay.batch_shape + (lay.fan_out,), lambda g: (g.width,), NorMuonState,
    )  # fmt: skip


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
    """NorMuon optimizer: ``theta <- theta - lr * (O' + wd * theta)``, ``O'`` the
    :func:`scale_by_normuon` output (``beta2``, ``normuon_eps``, ``**options``: as there).

    Args:
      learning_rate: float or optax schedule.
      weight_decay: decoupled weight decay (``None``: 0).
      weight_decay_mask: optax mask for the decay.

    Returns:
      ``optax.GradientTransformation``.

    Raises:
      ValueError: unknown option name (lists the allowed ones) or bad value.
    """
    direction = scale_by_normuon(beta2=beta2, normuon_eps=normuon_eps, **options)
    return decoupled(direction, learning_rate, weight_decay, weight_decay_mask)


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

    so the update has RMS ``rms_scale = 0.2``: the official update (github.com/Chongjie-Si/
    AdaMuon, ``gpt2/models/optimizers/adamuon.py``: EMA momentum 0.95 with Nesterov, ``V``
    decayed with the momentum coefficient and not bias-corrected).

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
    return _moment_transform(
        opts, b2, _per_entry(b2, adamuon_eps),
        lambda lay: lay.batch_shape + (lay.fan_in, lay.fan_out), lambda g: (g.rows, g.cols),
        AdaMuonState,
    )  # fmt: skip


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
    """AdaMuon optimizer: ``theta <- theta - lr * (O' + wd * theta)`` (the official
    ``p (1 - lr wd) - lr O'``), ``O'`` the :func:`scale_by_adamuon` output (``beta2``,
    ``adamuon_eps``, ``**options``: as there). The update RMS is ``rms_scale``: use Adam-like
    learning rates. Other arguments, return value and errors as :func:`normuon`.
    """
    direction = scale_by_adamuon(beta2=beta2, adamuon_eps=adamuon_eps, **options)
    return decoupled(direction, learning_rate, weight_decay, weight_decay_mask)
