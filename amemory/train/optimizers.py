"""Resolve ``config.optimizer`` and ``config.schedule`` into one Optax transformation.

The one place where optimizer names become objects (big_vision style), so sweeps need no
code edits. The matrix part, ``optimizer.name`` (a name of ``amemory.optim.OPTIMIZERS``) at
``optimizer.lr``, trains the roles of ``optimizer.muon_roles``; ``optax.adamw`` at
``optimizer.adam_lr`` every other parameter (everything for ``name="adam"``). Both rates
follow one schedule shape (a multiplier in [0, 1]); weight decay is decoupled in both
halves: ``theta <- theta - lr * (u + weight_decay * theta)``, ``u`` the direction.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import optax

from amemory import optim

MATRIX = "matrix"
ADAM = "adam"


def names() -> tuple[str, ...]:
    """Every ``config.optimizer.name``: "adam" (everything Adam) and, read at each call,
    the names of ``amemory.optim.OPTIMIZERS``."""
    return (ADAM, *optim.OPTIMIZERS)


def _constant(sc: Any, steps: int, warm: int) -> optax.Schedule:
    return optax.constant_schedule(1.0)


def _cosine(sc: Any, steps: int, warm: int) -> optax.Schedule:
    return optax.cosine_decay_schedule(1.0, max(steps - warm, 1), alpha=float(sc.final_fraction))


def _linear(sc: Any, steps: int, warm: int) -> optax.Schedule:
    return optax.linear_schedule(1.0, float(sc.final_fraction), max(steps - warm, 1))


def _wsd(sc: Any, steps: int, warm: int) -> optax.Schedule:
    decay_steps = max(int(round(float(sc.decay_fraction) * steps)), 1)
    decay = optax.linear_schedule(1.0, float(sc.final_fraction), decay_steps)
    stable = max(steps - warm - decay_steps, 0)
    return optax.join_schedules([optax.constant_schedule(1.0), decay], [stable])


#: ``config.schedule.name`` -> the multiplier after warmup (constant: 1; cosine / linear:
#: decay to ``final_fraction`` at ``steps``; wsd: constant, then linear decay to
#: ``final_fraction`` over the last ``decay_fraction * steps`` steps).
SCHEDULES = {"constant": _constant, "cosine": _cosine, "linear": _linear, "wsd": _wsd}


def resolved_lr(ocfg: Any) -> float:
    """``optimizer.lr``, or the optimizer's ``default_lr`` when it is None (adam: adam_lr)."""
    if ocfg.lr is not None:
        return float(ocfg.lr)
    if ocfg.name == ADAM:
        return float(ocfg.adam_lr)
    return optim.OPTIMIZERS[ocfg.name].default_lr


def multiplier(sched_cfg: Any, steps: int) -> optax.Schedule:
    """Learning-rate multiplier ``step -> [0, 1]``: a linear warmup of
    ``warmup_steps``, then :data:`SCHEDULES` ``[config.schedule.name]``.

    Raises:
      ValueError: unknown schedule name (lists the allowed ones).
    """
    if sched_cfg.name not in SCHEDULES:
        raise ValueError(
            f"config.schedule.name={sched_cfg.name!r}; allowed values: {tuple(SCHEDULES)}"
        )
    warm = min(int(sched_cfg.warmup_steps), max(steps - 1, 0))
    main = SCHEDULES[sched_cfg.name](sched_cfg, steps, warm)
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
    table: list  # rows [path, shape, role, transform, "batch x (fan_in, fan_out)" or ""]
    layout: list  # orthogonalisation groups: amemory.optim.describe_layout rows ([] otherwise)
    clip: Any = None  # (params, max_logit [L, H]) -> params: QK-Clip after the step, or None


def _matrix_tx(ocfg: Any, lr: optax.Schedule, matrix_axes: Any, ns_mesh: Any):
    """``OPTIMIZERS[name].factory(lr, weight_decay=..., **options)``; each option of the
    entry is read from the config field ``<name>_<option>`` if it exists, else ``<option>``;
    a preset's own options are not overridden by the config's."""
    entry = optim.OPTIMIZERS[ocfg.name]
    kw = {}
    for opt in entry.options:
        field = f"{ocfg.name}_{opt}" if f"{ocfg.name}_{opt}" in ocfg else opt
        if field in ocfg:
            kw[opt] = ocfg[field]
    if kw.get("preset") is not None:
        kw = {k: v for k, v in kw.items() if k not in optim.PRESETS[kw["preset"]]}
    if entry.orthogonalizes:
        kw.update(matrix_axes=matrix_axes, ns_mesh=ns_mesh, diagnostics=bool(ocfg.diagnostics))
    try:
        return entry.factory(lr, weight_decay=float(ocfg.weight_decay), **kw)
    except ValueError as e:  # MuonOptions and the factories validate; name the config group
        raise ValueError(f"config.optimizer ({ocfg.name}): {e}") from None


def build(
    config: Any,
    params: Any,
    roles: Any,
    *,
    muon_roles: tuple[str, ...] | None = None,
    matrix_axes: Any = None,
    mesh: jax.sharding.Mesh | None = None,
    head_view: Any = None,
) -> Optimizer:
    """Build the run's optimizer for ``params`` (one seed, no leading seed axis).

    Routing is resolved by ``amemory.optim.routing_table`` with the rules
    ``{<muon roles>: matrix part, "rest": Adam}``; its rule per leaf becomes the label
    tree of ``optax.partition({"matrix": ..., "adam": ...}, labels)`` (the state keeps
    that tree, so checkpoints stay compatible). When every leaf lands in one part, ``tx``
    is that part alone (no partition state).

    Args:
      config: the run ConfigDict (reads ``optimizer``, ``schedule``, ``steps``).
      params: parameter tree (arrays or ShapeDtypeStructs).
      roles: same-structure tree of role strings (``amemory.models.roles.ROLES``).
      muon_roles: roles trained by ``optimizer.name``; None parses
        ``optimizer.muon_roles`` (ignored for "adam").
      matrix_axes: passed to the orthogonalising optimizers (``amemory.optim``'s
        ``matrix_axes``: a pair, or a callable ``(path, leaf) -> axes | None``).
      mesh: the ``("data", "fsdp")`` mesh of sharded mode (owner layout,
        ``ns_mesh=(mesh, "fsdp")``); None on one device / pmap.
      head_view: the model's head layout (``amemory.models.matrices.head_view``), which
        ``optimizer.qk_clip > 0`` needs (``amemory.optim.qk_clip``).

    Returns:
      an :class:`Optimizer`.

    Raises:
      ValueError: unknown optimizer or role spec, a role outside the vocabulary (names
        the leaf), a leaf routed to an orthogonalising optimizer that is not a matrix
        (names the leaf), or options rejected by ``amemory.optim``.
    """
    from amemory.models.roles import role_of  # the role vocabulary

    ocfg = config.optimizer
    if ocfg.name not in names():
        raise ValueError(f"config.optimizer.name={ocfg.name!r}; allowed values: {names()}")
    mult = multiplier(config.schedule, int(config.steps))
    lr_peak, adam_peak = resolved_lr(ocfg), float(ocfg.adam_lr)

    def adam_lr(step):
        return adam_peak * mult(step)

    def lr(step):
        return lr_peak * mult(step)

    if ocfg.name == ADAM:
        chosen: tuple[str, ...] = ()
    elif muon_roles is not None:
        chosen = tuple(muon_roles)
    else:
        chosen = optim.parse_roles(ocfg.muon_roles, role_of, "optimizer.muon_roles")
    spec = "+".join(chosen) or "none"  # "none": the matrix rule claims no role
    by_path = {optim.path_str(p): r for p, r in jax.tree_util.tree_flatten_with_path(roles)[0]}
    part = {spec: MATRIX, optim.REST: ADAM}
    role_fn = optim.Roles(lambda path: by_path[optim.path_str(path)], role_of.roles, {})
    rows = optim.routing_table(params, part, role_fn)
    orth = ocfg.name != ADAM and optim.OPTIMIZERS[ocfg.name].orthogonalizes
    table = []
    for r, (path, leaf) in zip(rows, jax.tree_util.tree_flatten_with_path(params)[0], strict=True):
        cell = ""
        if part[r.transform] == MATRIX and orth:
            try:
                lay = optim.matrix_layout(leaf, matrix_axes, path)
            except ValueError:
                raise ValueError(
                    f"config.optimizer.muon_roles={ocfg.muon_roles!r} routes {r.path} "
                    f"(role {r.role!r}, shape {r.shape}) to {ocfg.name}, which needs matrices "
                    "(2-D, or stacks of them); leave embed/head/norm/bias roles to Adam"
                ) from None
            cell = f"{lay.batch} x ({lay.fan_in}, {lay.fan_out})"
        name = ocfg.name if part[r.transform] == MATRIX else ADAM
        table.append([r.path, list(r.shape), r.role, name, cell])
    labels = jax.tree.unflatten(jax.tree.structure(params), [part[r.transform] for r in rows])
    adam = optax.adamw(
        adam_lr, b1=float(ocfg.b1), b2=float(ocfg.b2), eps=float(ocfg.eps),
        weight_decay=float(ocfg.weight_decay),
    )  # fmt: skip
    used = {part[r.transform] for r in rows}
    ns_mesh = (mesh, "fsdp") if mesh is not None else None
    layout = []
    if MATRIX in used and orth:
        mats = jax.tree.map(lambda x, lab: x if lab == MATRIX else None, params, labels)
        normalizes = optim.OPTIMIZERS[ocfg.name].normalizes
        layout = optim.describe_layout(
            mats, ns_mesh=ns_mesh, matrix_axes=matrix_axes, by_orientation=normalizes
        )
    if used == {ADAM}:
        tx, lr_sched = adam, adam_lr
    elif used == {MATRIX}:
        tx, lr_sched = _matrix_tx(ocfg, lr, matrix_axes, ns_mesh), lr
    else:
        matrix = _matrix_tx(ocfg, lr, matrix_axes, ns_mesh)
        tx, lr_sched = optax.partition({MATRIX: matrix, ADAM: adam}, labels), lr
    if float(ocfg.grad_clip) > 0:
        tx = optax.chain(optax.clip_by_global_norm(float(ocfg.grad_clip)), tx)
    clip, tau = None, float(ocfg.get("qk_clip", 0.0))
    if tau > 0:
        if head_view is None:
            raise ValueError(f"config.optimizer.qk_clip={tau} needs attention heads (an LM task)")
        clip = functools.partial(optim.qk_clip, tau=tau, head_view=head_view)
    return Optimizer(tx, lr_sched, adam_lr, labels, table, layout, clip)
