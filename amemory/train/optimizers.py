"""Resolve ``config.optimizer`` and ``config.schedule`` into one Optax transformation.

The one place where optimizer names become objects (big_vision style), so sweeps
need no code edits. Two halves:

  matrix part   ``optimizer.name`` (a name of :data:`MATRIX_PARTS`: amemory.optim's
                ``OPTIMIZERS`` plus optax's SGD) with learning rate ``optimizer.lr``, on the
                roles of ``optimizer.muon_roles``;
  Adam part     ``optax.adamw`` with ``optimizer.adam_lr`` on every other parameter.

``optimizer.name == "adam"`` trains everything with the Adam part. The split is
``optax.partition`` over labels resolved by ``amemory.optim.routing`` (the same role
specs, role check and table as ``optim.routed``); the resolved table
(path, shape, role, transform) is returned for logging. Both learning rates follow
the same schedule shape (a multiplier in [0, 1]).

Weight decay is decoupled in both halves and for every name:
``theta <- theta - lr * (u + weight_decay * theta)`` with ``u`` the optimizer's direction
(orthogonalised momentum, sign, SGD momentum, Adam's ratio); it is never added to the
gradient before the sign or the orthogonalisation.
On a device mesh (``parallel.mode="sharded"``) Muon, NorMuon and AdaMuon get
``ns_mesh=(mesh, "fsdp")``, hence the owner layout of ``amemory.optim.distributed``
(whole matrices per device, no collective inside Newton-Schulz); ``Optimizer.layout``
lists the layout of every orthogonalisation group for the start event.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import optax

from amemory import optim
from amemory.train.config import parse_roles

MATRIX = "matrix"
ADAM = "adam"


def _muon_options(
    ocfg: Any, matrix_axes: Any, ns_mesh: Any, *, shape_scale: bool = True
) -> dict[str, Any]:
    kw = dict(matrix_axes=matrix_axes, ns_mesh=ns_mesh, diagnostics=bool(ocfg.diagnostics))
    kw.update(
        momentum=float(ocfg.momentum),
        nesterov=bool(ocfg.nesterov),
        orthogonalizer=ocfg.orthogonalizer,
        ns_steps=int(ocfg.ns_steps),
        ns_dtype=ocfg.get("ns_dtype", None),
    )
    if shape_scale:
        kw["shape_scale"] = ocfg.shape_scale
    return kw


def _muon(ocfg, lr, matrix_axes, ns_mesh):
    if ocfg.preset is not None:
        # A preset defines momentum, Nesterov, orthogonalizer and shape scale as its peer
        # does; the config's own fields for them apply only without one.
        kw = dict(matrix_axes=matrix_axes, ns_mesh=ns_mesh, diagnostics=bool(ocfg.diagnostics))
        return optim.muon(lr, preset=ocfg.preset, weight_decay=float(ocfg.weight_decay), **kw)
    kw = _muon_options(ocfg, matrix_axes, ns_mesh)
    return optim.muon(lr, weight_decay=float(ocfg.weight_decay), **kw)


def _normuon(ocfg, lr, matrix_axes, ns_mesh):
    kw = _muon_options(ocfg, matrix_axes, ns_mesh)
    return optim.normuon(lr, weight_decay=float(ocfg.weight_decay), **kw)


def _adamuon(ocfg, lr, matrix_axes, ns_mesh):  # AdaMuon keeps its own RMS-matched shape scale
    kw = _muon_options(ocfg, matrix_axes, ns_mesh, shape_scale=False)
    return optim.adamuon(lr, weight_decay=float(ocfg.weight_decay), **kw)


def _signgd(ocfg, lr, matrix_axes, ns_mesh):
    return optim.signgd(lr, weight_decay=float(ocfg.weight_decay))


def _signum(ocfg, lr, matrix_axes, ns_mesh):
    return optim.signum(lr, beta=float(ocfg.signum_beta), weight_decay=float(ocfg.weight_decay))


def _muonh(ocfg, lr, matrix_axes, ns_mesh):
    kw = _muon_options(ocfg, matrix_axes, ns_mesh)
    return optim.muonh(lr, weight_decay=float(ocfg.weight_decay), **kw)


def _adamh(ocfg, lr, matrix_axes, ns_mesh):
    b = dict(b1=float(ocfg.b1), b2=float(ocfg.b2), eps=float(ocfg.eps))
    return optim.adamh(lr, weight_decay=float(ocfg.weight_decay), matrix_axes=matrix_axes, **b)


def _sgd(ocfg, lr, matrix_axes, ns_mesh):
    """Heavy-ball SGD ``m <- momentum m + g`` (Nesterov: ``u = g + momentum m``), as
    ``optax.sgd``, with the decay decoupled: ``theta <- theta - lr (u + wd theta)``."""
    m = float(ocfg.momentum)
    direction = optax.trace(decay=m, nesterov=bool(ocfg.nesterov)) if m > 0 else optax.identity()
    return optim.decoupled(direction, lr, float(ocfg.weight_decay))


#: name -> (builder ``(optimizer config, lr schedule, matrix_axes, ns_mesh) -> transform``,
#: default peak learning rate). The matrix-part names: every optimizer of
#: ``amemory.optim.OPTIMIZERS`` and optax's SGD. Default learning rates: Muon Keller
#: Jordan's 0.02 (with shape_scale "jordan"); AdaMuon an Adam-like step (its update RMS is
#: 0.2, as Adam's); SignGD/Signum an Adam-like per-entry step; SGD a heavy-ball step for a
#: pre-norm transformer. Starting points, not tuned optima.
MATRIX_PARTS: dict[str, tuple[Callable[..., optax.GradientTransformation], float]] = {
    "muon": (_muon, 0.02),
    "normuon": (_normuon, 0.02),
    "adamuon": (_adamuon, 3e-3),
    "signgd": (_signgd, 1e-3),
    "signum": (_signum, 1e-3),
    "sgd": (_sgd, 0.05),
    "muonh": (_muonh, 0.05),  # Hyperball: the fraction of each matrix's norm per step
    "adamh": (_adamh, 0.05),
}
#: The matrix parts that orthogonalise (matrix leaves only; owner layout on a mesh).
MUON_LIKE = ("muon", "normuon", "adamuon", "muonh")
#: Every ``config.optimizer.name``: "adam" (everything Adam) and the matrix parts.
NAMES: tuple[str, ...] = (ADAM, *MATRIX_PARTS)
#: Peak learning rate of the matrix part when ``optimizer.lr`` is None.
DEFAULT_LR = {name: lr for name, (_, lr) in MATRIX_PARTS.items()}


def resolved_lr(ocfg: Any) -> float:
    """``optimizer.lr``, or ``DEFAULT_LR[optimizer.name]`` when it is None (adam: adam_lr)."""
    if ocfg.lr is not None:
        return float(ocfg.lr)
    if ocfg.name == "adam":
        return float(ocfg.adam_lr)
    return DEFAULT_LR[ocfg.name]


def multiplier(sched_cfg: Any, steps: int) -> optax.Schedule:
    """Learning-rate multiplier ``step -> [0, 1]`` from ``config.schedule``.

    constant: 1 after a linear warmup; cosine: warmup then cosine decay to
    ``final_fraction`` at ``steps``; linear: warmup then linear decay to
    ``final_fraction``; wsd: warmup, constant, then linear decay to
    ``final_fraction`` over the last ``decay_fraction * steps`` steps.

    Raises:
      ValueError: unknown schedule name (lists the allowed ones).
    """
    name, warm = sched_cfg.name, int(sched_cfg.warmup_steps)
    final = float(sched_cfg.final_fraction)
    warm = min(warm, max(steps - 1, 0))
    if name == "constant":
        main = optax.constant_schedule(1.0)
        decay_steps = None
    elif name == "cosine":
        main = optax.cosine_decay_schedule(1.0, max(steps - warm, 1), alpha=final)
    elif name == "linear":
        main = optax.linear_schedule(1.0, final, max(steps - warm, 1))
    elif name == "wsd":
        decay_steps = max(int(round(float(sched_cfg.decay_fraction) * steps)), 1)
        stable = max(steps - warm - decay_steps, 0)
        main = optax.join_schedules(
            [optax.constant_schedule(1.0), optax.linear_schedule(1.0, final, decay_steps)],
            [stable],
        )
    else:
        raise ValueError(
            f"config.schedule.name={name!r}; allowed values: "
            "('constant', 'cosine', 'linear', 'wsd')"
        )
    if warm == 0:
        return main
    return optax.join_schedules([optax.linear_schedule(0.0, 1.0, warm), main], [warm])


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """A resolved optimizer: the transformation, its schedules and the routing table."""

    tx: optax.GradientTransformation
    lr: optax.Schedule  # matrix-part learning rate at a step (the Adam one for name="adam")
    adam_lr: optax.Schedule  # Adam-part learning rate at a step
    labels: Any  # same tree as params: "matrix" | "adam"
    table: list  # rows [path, shape, role, transform]
    layout: list  # Muon/NorMuon groups: amemory.optim.describe_layout rows ([] otherwise)
    clip: Any = None  # (params, max_logit [L, H]) -> params: QK-Clip after the step, or None


def _matrix_tx(
    ocfg: Any, lr: optax.Schedule, matrix_axes: Any, ns_mesh: Any
) -> optax.GradientTransformation:
    if ocfg.name not in MATRIX_PARTS:
        raise ValueError(f"config.optimizer.name={ocfg.name!r}; allowed values: {NAMES}")
    return MATRIX_PARTS[ocfg.name][0](ocfg, lr, matrix_axes, ns_mesh)


def _role_fn(roles: Any):
    """``role_fn(path, leaf)`` for ``amemory.optim.routing`` that reads a precomputed role tree."""
    by_path = {optim.path_str(p): r for p, r in jax.tree_util.tree_flatten_with_path(roles)[0]}

    def role_fn(path, leaf):
        del leaf
        return by_path[optim.path_str(path)]

    return role_fn


def build(
    config: Any,
    params: Any,
    roles: Any,
    *,
    matrix_roles: tuple[str, ...] | None = None,
    matrix_axes: Any = None,
    mesh: jax.sharding.Mesh | None = None,
    head_view: Any = None,
) -> Optimizer:
    """Build the run's optimizer for ``params`` (one seed, no leading seed axis).

    Routing is resolved by ``amemory.optim.routing_table`` with the rules
    ``{<matrix roles>: matrix part, "rest": Adam}`` and a ``role_fn`` reading ``roles``
    (unclaimed or unknown roles raise there); its rule per leaf becomes the label tree
    of ``optax.partition({"matrix": ..., "adam": ...}, labels)``, the same partition
    ``amemory.optim.routed`` builds, keyed "matrix"/"adam" so the optimizer state keeps
    the same tree (and checkpoints stay compatible). When every leaf lands in one part,
    ``tx`` is that part alone (no partition state).

    Args:
      config: the run ConfigDict (reads ``optimizer``, ``schedule``, ``steps``).
      params: parameter tree (arrays or ShapeDtypeStructs).
      roles: same-structure tree of role strings from ``amemory.optim.ROLES``.
      matrix_roles: roles trained by ``optimizer.name``; None parses
        ``optimizer.muon_roles`` (ignored for "adam").
      matrix_axes: passed to Muon/NorMuon (e.g. ``(1, 0)`` for ``[d_out, d_in]`` weights,
        or a callable ``(path, leaf) -> axes | None``; None from it marks a non-matrix).
      mesh: the ``("data", "fsdp")`` mesh of sharded mode: Muon/NorMuon then orthogonalise
        in the owner layout (``ns_mesh=(mesh, "fsdp")``); None on one device / pmap.
      head_view: the model's head layout (``amemory.models.matrices.head_view``), which
        ``optimizer.qk_clip > 0`` needs (``amemory.optim.qk_clip``).

    Returns:
      an :class:`Optimizer`.

    Raises:
      ValueError: unknown optimizer, unknown role spec, a role outside
        ``amemory.optim.ROLES`` (names the leaf), a Muon-routed leaf that is not 2-D
        (names the leaf), or options rejected by ``amemory.optim``.
    """
    ocfg = config.optimizer
    mult = multiplier(config.schedule, int(config.steps))
    lr_peak, adam_peak = resolved_lr(ocfg), float(ocfg.adam_lr)

    def adam_lr(step):
        return adam_peak * mult(step)

    def lr(step):
        return lr_peak * mult(step)

    if ocfg.name == "adam":
        chosen: tuple[str, ...] = ()
    elif matrix_roles is not None:
        chosen = tuple(matrix_roles)
    else:
        chosen = parse_roles(ocfg.muon_roles, "optimizer.muon_roles")
    spec = "+".join(chosen) or "none"  # "none": the matrix rule claims no role
    role_fn = _role_fn(roles)
    part = {spec: MATRIX, optim.REST: ADAM}
    rows = optim.routing_table(params, part, role_fn)
    names = {MATRIX: ocfg.name, ADAM: ADAM}
    table = [[r.path, list(r.shape), r.role, names[part[r.transform]]] for r in rows]
    for r in rows:
        if part[r.transform] == MATRIX and ocfg.name in MUON_LIKE:
            axes = matrix_axes
            if callable(matrix_axes):
                axes = matrix_axes(tuple(r.path.split("/")), jax.ShapeDtypeStruct(r.shape, "f4"))
            if len(r.shape) != 2 if matrix_axes is None else (axes is None or len(r.shape) < 2):
                raise ValueError(
                    f"config.optimizer.muon_roles={ocfg.muon_roles!r} routes {r.path} "
                    f"(role {r.role!r}, shape {r.shape}) to {ocfg.name}, which needs matrices "
                    "(2-D, or stacks of them); leave embed/head/norm/bias roles to Adam"
                )
    labels = jax.tree.unflatten(jax.tree.structure(params), [part[r.transform] for r in rows])
    adam = optax.adamw(
        adam_lr,
        b1=float(ocfg.b1),
        b2=float(ocfg.b2),
        eps=float(ocfg.eps),
        weight_decay=float(ocfg.weight_decay),
    )
    used = {part[r.transform] for r in rows}
    ns_mesh = (mesh, "fsdp") if mesh is not None else None
    layout = []
    if MATRIX in used and ocfg.name in MUON_LIKE:
        mats = jax.tree.map(lambda x, lab: x if lab == MATRIX else None, params, labels)
        layout = optim.describe_layout(
            mats, ns_mesh=ns_mesh, matrix_axes=matrix_axes, by_orientation=ocfg.name != "muon"
        )
    if used == {ADAM}:
        tx = adam
        lr_sched = adam_lr
    elif used == {MATRIX}:
        tx = _matrix_tx(ocfg, lr, matrix_axes, ns_mesh)
        lr_sched = lr
    else:
        tx = optax.partition(
            {MATRIX: _matrix_tx(ocfg, lr, matrix_axes, ns_mesh), ADAM: adam}, labels
        )
        lr_sched = lr
    if float(ocfg.grad_clip) > 0:
        tx = optax.chain(optax.clip_by_global_norm(float(ocfg.grad_clip)), tx)
    clip, tau = None, float(ocfg.get("qk_clip", 0.0))
    if tau > 0:
        if head_view is None:
            raise ValueError(f"config.optimizer.qk_clip={tau} needs attention heads (an LM task)")
        clip = functools.partial(optim.qk_clip, tau=tau, roles=roles, head_view=head_view)
    return Optimizer(tx, lr_sched, adam_lr, labels, table, layout, clip)
