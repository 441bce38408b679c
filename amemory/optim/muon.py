"""Muon as an Optax gradient transformation (NorMuon lives in ``amemory.optim.normuon``).

Muon (MomentUm Orthogonalized by Newton-Schulz) keeps a momentum buffer per
matrix parameter and replaces each update by (an approximation of) its polar
factor, rescaled by a shape-dependent factor:

    M_t = beta M_{t-1} + (1 - beta) G_t     ("ema")   or   beta M_{t-1} + G_t  ("sum")
    U_t = Nesterov(G_t, M_t) or M_t
    O_t = orth(U_t)                           (Newton-Schulz or exact polar)
    update = -lr * (scale(fan_in, fan_out) * O_t + wd * theta)

Matrix convention. Every leaf is seen as a matrix ``[fan_in, fan_out]`` (plus
optional batch axes), the layout of Flax ``Dense``/``nnx.Linear`` kernels
(``y = x @ W``). ``matrix_axes=(in_axes, out_axes)`` picks the axes: the
default for 2-D leaves is ``(0, 1)``; a PyTorch-style ``[d_out, d_in]`` weight
(e.g. amemory.models.memory's ``W``) takes ``matrix_axes=(1, 0)``. Only the
shape scaling depends on which side is fan_in: orthogonalisation commutes with
transposition. All other axes of a leaf are batch axes (independent matrices).
A leaf that is not a matrix under this rule raises ``ValueError`` naming its
path and shape: Muon never falls back to Adam; routing (``amemory.optim.routing``)
decides which leaves reach it.

Speed. Inside ``update`` leaves are grouped by matrix shape (tall matrices are
transposed to wide first, so ``[256, 1024]`` and ``[1024, 256]`` share a group)
and each group is orthogonalised by ONE batched call. Wide groups with
``fan_max >= 2 fan_min`` use the Gram form of Newton-Schulz (see
``orthogonalize.newton_schulz(method="gram")``) in fp32. Under sharded ``jit``,
``ns_mesh=(mesh, axis)`` selects the owner layout of ``amemory.optim.distributed``:
every device orthogonalises a share of whole matrices (one all-to-all there and one
back per stack) instead of all-reducing inside every NS step of a sharded matrix.

Layout. This module holds the public Muon API (:class:`MuonState`,
:func:`scale_by_muon`, :func:`muon`, :func:`collect_diagnostics`) and re-exports
NorMuon (``amemory.optim.normuon``) and the option tuples / :func:`shape_scale_factor`
(``amemory.optim._muon_core``, the update path both transforms share). The
leaf-to-matrix layouts and shape grouping are in ``amemory.optim._matrices``; the
placement of orthogonalisation on a device mesh in ``amemory.optim.distributed``.

Sources: Jordan (2024) https://kellerjordan.github.io/posts/muon/ ; Liu et al.,
"Muon is Scalable for LLM Training" (Moonlight), arXiv 2502.16982; optax
0.2.8 ``optax.contrib.muon``; Wang et al. 2025, arXiv 2509.26030 (sum momentum,
no Nesterov); Li et al., "NorMuon", arXiv 2510.05491.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import optax

from amemory.optim._matrices import Axes, MatrixAxes
from amemory.optim._muon_core import (
    MOMENTUM_FORMS,
    MUON_OPTIONS,
    NS_METHODS,
    ORTHOGONALIZERS,
    SHAPE_SCALES,
    MuonCore,
    optimizer,
    shape_scale_factor,
)
from amemory.optim._paths import path_str
from amemory.optim.normuon import NorMuonState, normuon, scale_by_normuon

__all__ = [
    "MOMENTUM_FORMS",
    "NS_METHODS",
    "ORTHOGONALIZERS",
    "SHAPE_SCALES",
    "Axes",
    "MatrixAxes",
    "MuonState",
    "NorMuonState",
    "collect_diagnostics",
    "muon",
    "normuon",
    "scale_by_muon",
    "scale_by_normuon",
    "shape_scale_factor",
]


class MuonState(NamedTuple):
    """State of :func:`scale_by_muon`."""

    count: jax.Array  # [] int32: number of updates applied so far
    mu: optax.Updates  # momentum, same tree/shapes as params, dtype mu_dtype (default param dtype)
    # None, or {"ortho_error": tree of [] float32, "update_rms": tree of [] float32}: the last
    # update's NS orthogonality error and the RMS of the returned direction (before lr)
    diagnostics: Any


def scale_by_muon(
    momentum: float = 0.95,
    *,
    momentum_form: str = "ema",
    nesterov: bool = True,
    bias_correction: bool = False,
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
    r"""Muon direction: momentum, orthogonalisation, shape scaling (no learning rate).

    Per matrix leaf ``G`` (seen as ``[batch, fan_in, fan_out]``, see module doc)::

        ema: M <- beta M + (1 - beta) G          sum: M <- beta M + G
        Nesterov (ema): U = beta M + (1 - beta) G   (Keller Jordan: lerp(G, M, beta))
        Nesterov (sum): U = G + beta M              (Moonlight)
        no Nesterov:    U = M
        bias_correction (ema only, optax.contrib.muon):
            U = beta M / (1 - beta^(t+1)) + (1 - beta) G / (1 - beta^t)   (Nesterov)
            U = M / (1 - beta^t)                                        (otherwise)
        O = orth(U) * shape_scale_factor(shape_scale, fan_in, fan_out)

    ``momentum=0`` with ``orthogonalizer="polar"`` and ``shape_scale="none"`` is the
    papers' ``W <- W - lr msgn(G)``.

    Args:
      momentum: ``beta`` in ``[0, 1)`` (may be injected by ``optax.inject_hyperparams``).
      momentum_form: ``"ema"`` or ``"sum"``.
      nesterov: use the Nesterov look-ahead ``U`` above.
      bias_correction: optax.contrib.muon's Adam-style bias correction (``"ema"`` only).
      orthogonalizer: ``"newton_schulz"`` or ``"polar"`` (exact, SVD; slow but exact,
        and float64 under ``jax_enable_x64``).
      ns_coeffs: ``"jordan"``, ``"polar_express"`` or an array ``[steps, 3]``.
      ns_steps: NS steps; ``None`` means 5 (or the length of an array ``ns_coeffs``).
        Must be static (``static_args=("ns_steps",)`` under inject_hyperparams).
      ns_eps: added to the Frobenius norm before NS (1e-7 Keller/torch, 1e-8 optax).
      ns_dtype: NS compute dtype: ``None`` (momentum's dtype, at least fp32),
        ``jnp.bfloat16``, or ``"auto"`` (bf16 on GPU/TPU, fp32 on CPU).
      ns_method: ``"auto"``, ``"direct"`` or ``"gram"`` (see ``newton_schulz``).
      shape_scale: ``"none"``, ``"jordan"``, ``"rms_match"`` or ``"spectral"``.
      rms_scale: ``c`` of ``"rms_match"`` (0.2 matches AdamW's update RMS).
      mu_dtype: momentum dtype (``None``: parameter dtype).
      matrix_axes: ``None`` (every leaf must be 2-D ``[fan_in, fan_out]``), a pair
        ``(in_axes, out_axes)`` of ints or int tuples applied to every leaf, or a
        callable ``(path_keys, leaf) -> pair | None``.
      batch_leaves: orthogonalise same-shape leaves in one batched call (exactly the
        same result; disable to keep per-leaf sharding untouched).
      ns_mesh: ``(mesh, axis)`` for sharded ``jit``: the device mesh and the mesh axis
        name (or tuple of names) along which parameters are split (FSDP); other mesh
        axes replicate them. Used by the owner layout (``distributed``).
      distributed: where orthogonalisation runs on the mesh (``amemory.optim.
        distributed``): ``"owner"`` stacks same-shape matrices, hands each device a
        round-robin share of whole matrices with one ``all_to_all`` per stack (padding
        the stack to a multiple of the device count), runs Newton-Schulz with no
        collective, and returns the results with one ``all_to_all`` (plus an
        ``all_gather`` over replica axes); ``"gspmd"`` leaves it to XLA's partitioner
        (collectives inside every NS step of a sharded matrix); ``"auto"`` (default) is
        ``"owner"`` when ``ns_mesh`` is given on more than one device, else ``"gspmd"``.
        Same update either way.
      diagnostics: store each leaf's orthogonality error and update RMS (of the
        returned direction, before the learning rate) of the last update in
        ``state.diagnostics`` (read with :func:`collect_diagnostics`); the update
        itself is unchanged.

    Returns:
      ``optax.GradientTransformation`` with state :class:`MuonState`. Updates have
      the gradient's shapes and dtypes.

    Raises:
      ValueError: bad option (lists allowed values); a leaf that is not a matrix
        (names path and shape), raised by ``init`` before any compilation.

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
    core = MuonCore.build(
        momentum=momentum, momentum_form=momentum_form, nesterov=nesterov,
        bias_correction=bias_correction, orthogonalizer=orthogonalizer, ns_coeffs=ns_coeffs,
        ns_steps=ns_steps, ns_eps=ns_eps, ns_dtype=ns_dtype, ns_method=ns_method,
        shape_scale=shape_scale, rms_scale=rms_scale, mu_dtype=mu_dtype,
        matrix_axes=matrix_axes, batch_leaves=batch_leaves, ns_mesh=ns_mesh,
        distributed=distributed, diagnostics=diagnostics,
    )  # fmt: skip

    def init_fn(params):
        _, _, fields = core.init(params)  # validates every leaf
        return MuonState(**fields)

    def update_fn(updates, state, params=None):
        del params
        step = core.orthogonalize(updates, state.mu, state.count)
        out, diag = core.finish(step, step.mats)
        return out, MuonState(count=step.count, mu=step.mu, diagnostics=diag)

    return optax.GradientTransformation(init_fn, update_fn)


def muon(
    learning_rate: optax.ScalarOrSchedule,
    *,
    preset: str | None = None,
    weight_decay: float | None = None,
    weight_decay_mask: Any = None,
    **overrides: Any,
) -> optax.GradientTransformation:
    r"""Muon optimizer: :func:`scale_by_muon`, decoupled weight decay, learning rate.

    ``theta <- theta - lr * (O + wd * theta) = theta (1 - lr wd) - lr O`` where ``O`` is
    the :func:`scale_by_muon` output (the Keller Jordan / torch / optax convention).

    Args:
      learning_rate: float or optax schedule (units: spectral-norm-ish step per
        update for ``shape_scale="none"``; see ``shape_scale_factor``).
      preset: ``None`` (the :func:`scale_by_muon` defaults) or a name in
        ``amemory.optim.PRESETS`` (``"jordan"``, ``"moonlight"``, ``"torch"``,
        ``"optax"``, ``"wang2025"``); explicit options override the preset.
      weight_decay: decoupled weight decay ``wd`` (``None``: the preset's, else 0).
      weight_decay_mask: optax mask tree/callable for the decay.
      **overrides: any :func:`scale_by_muon` option.

    Returns:
      ``optax.GradientTransformation`` (a ``chain``); works with
      ``optax.inject_hyperparams(muon)(learning_rate=...)``, which injects
      ``learning_rate`` (and ``weight_decay`` when given); options passed through
      ``**overrides`` stay static. To inject ``momentum`` or ``rms_scale``, wrap
      :func:`scale_by_muon` instead: ``optax.inject_hyperparams(scale_by_muon)(momentum=0.9)``.

    Raises:
      ValueError: unknown preset or option name (lists the allowed ones), or a
        bad option value.

    Example:
      >>> import jax.numpy as jnp
      >>> tx = muon(0.02, preset="jordan", weight_decay=0.01)
      >>> state = tx.init({"w": jnp.zeros((8, 8))})
    """
    return optimizer(
        scale_by_muon,
        MUON_OPTIONS,
        learning_rate,
        preset=preset,
        weight_decay=weight_decay,
        weight_decay_mask=weight_decay_mask,
        overrides=overrides,
    )


# --------------------------------------------------------------------------- diagnostics


def collect_diagnostics(opt_state: Any) -> dict[str, jax.Array]:
    """Flatten the diagnostics stored in every Muon/NorMuon state inside ``opt_state``.

    Walks any nesting (``chain``, ``partition``/``routed``, ``inject_hyperparams``)
    and returns ``{"ortho_error/<leaf path>": [] float32, "update_rms/<leaf path>": ...}``
    for every matrix leaf whose transform was built with ``diagnostics=True``:
    the orthogonality error (``orthogonalize.orthogonality_error``, averaged over
    batch axes) of the last update before shape scaling, and the RMS of the
    transform's output (before learning rate and weight decay). Empty dict when
    none is enabled. Update RMS per role of the final updates is left to the
    training loop (it sees them).
    """
    out: dict[str, jax.Array] = {}

    def is_state(x):
        return isinstance(x, MuonState | NorMuonState)

    for _, node in jax.tree_util.tree_flatten_with_path(opt_state, is_leaf=is_state)[0]:
        if not is_state(node) or node.diagnostics is None:
            continue
        for name, tree in node.diagnostics.items():
            for path, value in jax.tree_util.tree_flatten_with_path(tree)[0]:
                out[f"{name}/{path_str(path)}"] = value
    return out
