"""NorMuon as an Optax gradient transformation: Muon plus per-neuron normalisation.

NorMuon runs Muon's update path (momentum, Nesterov look-ahead, batched
orthogonalisation, shape scaling; shared with :mod:`amemory.optim.muon` through
``amemory.optim._muon_core``) and, between orthogonalisation and shape scaling,
divides every output neuron (column of the ``[fan_in, fan_out]`` matrix) by the
square root of an EMA of its mean squared entry, then restores the Frobenius norm.
Leaves, ``matrix_axes``, batching, ``ns_mesh`` and ``distributed`` behave as in
:mod:`amemory.optim.muon`. In the owner layout (``amemory.optim.distributed``) the
normalisation runs on the device that owns the whole matrix, right after its
Newton-Schulz, and the second moment is stored there (:class:`OwnerStacks`), so it adds
no collective (the paper's FSDP2 design, arXiv 2510.05491, Sec. 4).

Sources: Li et al., "NorMuon: Making Muon more efficient and scalable", arXiv
2510.05491 (the official ``normuon_update``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from amemory.optim._matrices import MatrixAxes
from amemory.optim._muon_core import MUON_OPTIONS, MuonCore, check_unit_interval, optimizer
from amemory.optim.distributed import OwnerStacks

__all__ = ["NorMuonState", "normuon", "scale_by_normuon"]


class NorMuonState(NamedTuple):
    """State of :func:`scale_by_normuon`."""

    count: jax.Array  # [] int32
    mu: optax.Updates  # momentum, same tree/shapes as params
    # per-output-neuron second moment: [*batch_shape, fan_out] float32 per leaf; in the owner
    # layout an OwnerStacks of [B_pad, fan_out] float32 per stack, split over the mesh devices
    nu: optax.Updates | OwnerStacks
    diagnostics: Any  # None, or {"ortho_error": ..., "update_rms": ...} as in MuonState


def _normalize_neurons(
    o: jax.Array, v: jax.Array, beta2: Any, eps: float
) -> tuple[jax.Array, jax.Array]:
    """NorMuon's normalisation of one stack ``o`` [b, fan_in, fan_out] with state ``v``.

    Returns ``(o', v')``: ``o'`` [b, fan_in, fan_out] (at least fp32) and ``v'`` [b, fan_out].
    """
    o = o.astype(jnp.promote_types(o.dtype, jnp.float32))
    norm = jnp.sqrt(jnp.sum(o * o, axis=(1, 2), keepdims=True))
    v_mean = jnp.mean(o * o, axis=1)  # [b, fan_out]
    v = beta2 * v.reshape(v_mean.shape) + (1.0 - beta2) * v_mean
    o2 = o / (jnp.sqrt(v)[:, None, :] + eps)
    norm2 = jnp.sqrt(jnp.sum(o2 * o2, axis=(1, 2), keepdims=True))
    return o2 * (norm / (norm2 + eps)), v


def scale_by_normuon(
    momentum: float = 0.95,
    beta2: float = 0.95,
    *,
    normuon_eps: float = 1e-10,
    momentum_form: str = "ema",
    nesterov: bool = True,
    orthogonalizer: str = "newton_schulz",
    ns_coeffs: Any = "jordan",
    ns_steps: int | None = None,
    ns_eps: float = 1e-7,
    ns_dtype: Any = None,
    ns_method: str = "auto",
    shape_scale: str = "jordan",
    rms_scale: float = 0.2,
    mu_dtype: Any = None,
    matrix_axes: MatrixAxes = None,
    batch_leaves: bool = True,
    ns_mesh: tuple[Any, Any] | None = None,
    distributed: str = "auto",
    diagnostics: bool = False,
) -> optax.GradientTransformation:
    r"""NorMuon direction: Muon followed by per-neuron second-moment normalisation.

    After ``O = orth(U)`` (as in :func:`scale_by_muon`), per matrix ``[fan_in, fan_out]``::

        v <- beta2 v + (1 - beta2) mean_{fan_in}(O * O)      # [fan_out], one per output neuron
        O' = O / (sqrt(v) + normuon_eps)                      # row-wise in PyTorch's [out, in]
        O' <- O' * ||O||_F / (||O'||_F + normuon_eps)         # keep the pre-normalisation norm
        update = O' * shape_scale_factor(shape_scale, fan_in, fan_out)

    This is the official NorMuon update (its ``normuon_update``: EMA momentum with
    Nesterov, Frobenius norm preserved, Keller's ``"jordan"`` scaling).

    Args:
      momentum: first-moment decay ``beta``.
      beta2: second-moment decay in ``[0, 1)``.
      normuon_eps: added to ``sqrt(v)`` and to the norm in the rescale.
      others: as in :func:`amemory.optim.scale_by_muon`.

    Returns:
      ``optax.GradientTransformation`` with state :class:`NorMuonState`.

    Raises:
      ValueError: as :func:`amemory.optim.scale_by_muon`, or ``beta2`` outside ``[0, 1)``.

    References:
      Li et al., "NorMuon: Making Muon more efficient and scalable", arXiv 2510.05491.
    """
    core = MuonCore.build(
        momentum=momentum, momentum_form=momentum_form, nesterov=nesterov,
        bias_correction=False, orthogonalizer=orthogonalizer, ns_coeffs=ns_coeffs,
        ns_steps=ns_steps, ns_eps=ns_eps, ns_dtype=ns_dtype, ns_method=ns_method,
        shape_scale=shape_scale, rms_scale=rms_scale, mu_dtype=mu_dtype,
        matrix_axes=matrix_axes, batch_leaves=batch_leaves, ns_mesh=ns_mesh,
        distributed=distributed, diagnostics=diagnostics,
    )  # fmt: skip
    check_unit_interval("beta2", beta2)

    def init_fn(params):
        layouts, treedef, fields = core.init(params)
        if core.layout is not None:
            nu = core.layout.init_state(layouts, batch_leaves=batch_leaves)
        else:
            nu = treedef.unflatten(
                [jnp.zeros(lay.batch_shape + (lay.fan_out,), jnp.float32) for lay in layouts]
            )
        return NorMuonState(nu=nu, **fields)

    def post(o, v, tall):  # owner layout: o [c, k, l] wide, v [c, fan_out]
        x = jnp.swapaxes(o, 1, 2) if tall else o  # [c, fan_in, fan_out]
        x, v = _normalize_neurons(x, v, beta2, normuon_eps)
        return (jnp.swapaxes(x, 1, 2) if tall else x).astype(o.dtype), v

    def update_fn(updates, state, params=None):
        del params
        if core.layout is not None:
            step = core.orthogonalize(updates, state.mu, state.count, post, state.nu)
            out, diag = core.finish(step, step.mats)
            nu = step.post_state
            return out, NorMuonState(count=step.count, mu=step.mu, nu=nu, diagnostics=diag)
        step = core.orthogonalize(updates, state.mu, state.count)
        v_leaves = step.treedef.flatten_up_to(state.nu)
        mats, new_v = [], []
        for o, v, lay in zip(step.mats, v_leaves, step.layouts, strict=True):
            o2, v = _normalize_neurons(o, v, beta2, normuon_eps)
            mats.append(o2)
            new_v.append(v.reshape(lay.batch_shape + (lay.fan_out,)))
        out, diag = core.finish(step, mats)
        new_state = NorMuonState(
            count=step.count, mu=step.mu, nu=step.treedef.unflatten(new_v), diagnostics=diag
        )
        return out, new_state

    return optax.GradientTransformation(init_fn, update_fn)


_NORMUON_OPTIONS = tuple(o for o in MUON_OPTIONS if o != "bias_correction") + (
    "beta2",
    "normuon_eps",
)


def normuon(
    learning_rate: optax.ScalarOrSchedule,
    *,
    weight_decay: float | None = None,
    weight_decay_mask: Any = None,
    **overrides: Any,
) -> optax.GradientTransformation:
    """NorMuon optimizer: :func:`scale_by_normuon`, decoupled weight decay, learning rate.

    Args:
      learning_rate: float or optax schedule.
      weight_decay: decoupled weight decay (default 0), applied as in
        :func:`amemory.optim.muon`.
      weight_decay_mask: optax mask for the decay.
      **overrides: any :func:`scale_by_normuon` option.

    Returns:
      ``optax.GradientTransformation``.

    Raises:
      ValueError: unknown option name (lists the allowed ones) or bad value.
    """
    return optimizer(
        scale_by_normuon,
        _NORMUON_OPTIONS,
        learning_rate,
        preset=None,
        weight_decay=weight_decay,
        weight_decay_mask=weight_decay_mask,
        overrides=overrides,
    )
