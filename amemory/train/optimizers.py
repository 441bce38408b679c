"""Resolve ``config.optimizer`` and ``config.schedule`` into one Optax transformation.

The one place where optimizer names become objects (big_vision style), so sweeps need no
code edits. The matrix part, ``optimizer.name`` (a name of ``amemory.optim.OPTIMIZERS``) at
``optimizer.lr``, trains the roles of ``optimizer.muon_roles``; ``optax.adamw`` at
``optimizer.adam_lr`` every other parameter (everything for ``name="adam"``). Both rates
follow one schedule shape (a multiplier ``s(t)`` in [0, 1]).

Weight decay (nanoGPT, MaxText and Levanter's rule): only matrices decay (the task's
``matrix_axes``; embeddings only with ``optimizer.decay_embeddings``), ``optimizer.name``'s
by ``optimizer.weight_decay``, the Adam half's by ``optimizer.adam_weight_decay`` (Levanter
PR #1147). :data:`DECAY_SCALINGS`: "lr", ``theta <- theta - lr (u + wd theta)`` (Loshchilov
& Hutter, arXiv 1711.05101), or "independent", ``theta <- theta - lr u - s(t) wd r theta``,
``r = base_width / width`` (Qiu et al., arXiv 2512.05620, weight-decay section: decay as
1/width; github.com/charliezchen/scaling-matrix-preconditioning ``train.py``: ``wdxD / D``).
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
#: ``config.optimizer.weight_decay_scaling`` values (see the module docstring).
DECAY_SCALINGS = ("lr", "independent")
#: ``config.optimizer.parametrization`` values: "sp" (standard); "mup", muP for Adam (Yang
#: et al., Tensor Programs V, arXiv 2203.03466, Table 3): Adam's rate on hidden and output
#: matrices ``adam_lr * r`` (Adam LR 1/fan_in), on embeddings, norms and biases ``adam_lr``,
#: head init std x ``sqrt(r)`` (variance 1/fan_in^2). Muon's: ``shape_scale="spectral"``.
PARAMETRIZATIONS = ("sp", "mup")


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
    table: list  # rows [path, shape, role, transform, "batch x (fan_in, fan_out)" or "", wd]
    layout: list  # orthogonalisation groups: amemory.optim.describe_layout rows ([] otherwise)
    clip: Any = None  # (params, max_logit [L, H]) -> params: QK-Clip after the step, or None


def width_ratio(ocfg: Any, width: int | None) -> float:
    """``r = optimizer.base_width / width`` (1 when ``base_width`` is 0).

    Raises:
      ValueError: ``base_width > 0`` for a task without a width (names the field).
    """
    base = int(ocfg.get("base_width", 0))
    if not base:
        return 1.0
    if not width:
        raise ValueError(f"config.optimizer.base_width={base} needs a task with a model width")
    return base / width


def _scaled_decay(mult: dict[str, float], coef: dict[str, float]) -> optax.GradientTransformation:
    """Stateless ``u <- mult (u + coef theta)`` per leaf (dicts keyed by ``optim.path_str``);
    its state is ``optax.add_decayed_weights``'s, so ``optax.adamw``'s checkpoints fit."""

    def update_fn(updates, state, params=None):
        def one(path, u, p):
            key = optim.path_str(path)
            u = u + coef[key] * p if coef[key] else u
            return (u * mult[key]).astype(u.dtype) if mult[key] != 1 else u

        if params is None and any(coef.values()):
            raise ValueError("weight decay needs the params: pass them to update")
        params = updates if params is None else params  # read only where coef != 0
        return jax.tree_util.tree_map_with_path(one, updates, params), state

    return optax.GradientTransformation(lambda _: optax.EmptyState(), update_fn)


def _matrix_tx(ocfg: Any, lr: optax.Schedule, matrix_axes: Any, ns_mesh: Any, wd: float,
               mask: Any):  # fmt: skip
    """``OPTIMIZERS[name].factory(lr, weight_decay=wd, **options)`` (``weight_decay_mask=mask``
    where some of its leaves do not decay); each option of the entry is read from the config
    field ``<name>_<option>`` if it exists, else ``<option>``; a preset's own options are not
    overridden by the config's."""
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
    if wd and mask is not None:
        kw["weight_decay_mask"] = mask
    try:
        return entry.factory(lr, weight_decay=wd, **kw)
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
    width: int | None = None,
) -> Optimizer:
    """Build the run's optimizer for ``params`` (one seed, no leading seed axis).

    Routing is resolved by ``amemory.optim.routing_table`` with the rules
    ``{<muon roles>: matrix part, "rest": Adam}``; its rule per leaf becomes the label
    tree of ``optax.partition({"matrix": ..., "adam": ...}, labels)`` (the state keeps
    that tree, so checkpoints stay compatible). When every leaf lands in one part, ``tx``
    is that part alone (no partition state). Adam is ``optax.adamw``'s chain with per-leaf
    rates and decay; which leaves decay, and how, follows the module docstring.

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
      width: the model's width (``d_model``), which ``optimizer.base_width > 0`` scales
        by (:func:`width_ratio`).

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
    ratio = width_ratio(ocfg, width)
    mup = ocfg.get("parametrization", "sp") == "mup"
    independent = ocfg.get("weight_decay_scaling", "lr") == "independent"
    table, rate, coef = [], {}, {}  # per leaf: Adam-rate multiplier, coefficient of theta
    for r, (path, leaf) in zip(rows, jax.tree_util.tree_flatten_with_path(params)[0], strict=True):
        matrix = part[r.transform] == MATRIX
        try:
            lay = optim.matrix_layout(leaf, matrix_axes, path)
        except ValueError:
            lay = None
            if matrix and orth:
                raise ValueError(
                    f"config.optimizer.muon_roles={ocfg.muon_roles!r} routes {r.path} "
                    f"(role {r.role!r}, shape {r.shape}) to {ocfg.name}, which needs matrices "
                    "(2-D, or stacks of them); leave embed/head/norm/bias roles to Adam"
                ) from None
        cell = f"{lay.batch} x ({lay.fan_in}, {lay.fan_out})" if matrix and orth else ""
        own = matrix or ocfg.name == ADAM  # optimizer.name's leaf
        wd = float(ocfg.weight_decay if own else ocfg.get("adam_weight_decay", 0.0))
        hidden = lay is not None and r.role != "embed"  # muP: hidden and output matrices
        if lay is None or (r.role == "embed" and not ocfg.get("decay_embeddings", False)):
            wd = 0.0  # matrices decay; norm scales, biases and embeddings do not
        rate[r.path] = ratio if mup and hidden and not matrix else 1.0
        wd *= ratio if independent else 1.0
        peak = lr_peak if matrix else adam_peak  # independent: lr(t) (u + wd / peak theta)
        coef[r.path] = wd / (peak * rate[r.path]) if independent else wd
        name = ocfg.name if matrix else ADAM
        table.append([r.path, list(r.shape), r.role, name, cell, wd])
    labels = jax.tree.unflatten(jax.tree.structure(params), [part[r.transform] for r in rows])
    adam = optax.chain(
        optax.scale_by_adam(b1=float(ocfg.b1), b2=float(ocfg.b2), eps=float(ocfg.eps)),
        _scaled_decay(rate, coef),  # optax.adamw's chain, per-leaf rates and decay
        optax.scale_by_learning_rate(adam_lr),
    )
    # the matrix part: one coefficient, and a mask where some of its leaves do not decay
    m_coef = [coef[r.path] for r in rows if part[r.transform] == MATRIX]
    m_wd = max(m_coef, default=0.0)
    m_mask = None
    if min(m_coef, default=m_wd) != m_wd:

        def m_mask(tree):
            return jax.tree_util.tree_map_with_path(lambda p, _: coef[optim.path_str(p)] > 0, tree)

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
        tx, lr_sched = _matrix_tx(ocfg, lr, matrix_axes, ns_mesh, m_wd, m_mask), lr
    else:
        matrix = _matrix_tx(ocfg, lr, matrix_axes, ns_mesh, m_wd, m_mask)
        tx, lr_sched = optax.partition({MATRIX: matrix, ADAM: adam}, labels), lr
    if float(ocfg.grad_clip) > 0:
        tx = optax.chain(optax.clip_by_global_norm(float(ocfg.grad_clip)), tx)
    clip, tau = None, float(ocfg.get("qk_clip", 0.0))
    if tau > 0:
        if head_view is None:
            raise ValueError(f"config.optimizer.qk_clip={tau} needs attention heads (an LM task)")
        clip = functools.partial(optim.qk_clip, tau=tau, head_view=head_view)
    return Optimizer(tx, lr_sched, adam_lr, labels, table, layout, clip)
