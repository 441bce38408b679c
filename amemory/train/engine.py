"""The compiled side of training: the step, on-device metric accumulation, placement.

:func:`make_train_step` is one optimizer step. :func:`accumulating_step` wraps it so that
the metrics of every step are reduced on the device into an accumulator (sum of the
loss and aux metrics, last value of the others, first non-finite step), which the loop
reads only at log steps: no device-to-host copy happens between them.

:class:`Engine` compiles init / step for one placement: ``jit`` over a ``Mesh`` of
:mod:`amemory.train.parallel` (every mode). Multi-seed runs ``vmap`` the step over a
leading seed axis of the state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from amemory import optim
from amemory.train import optimizers, parallel
from amemory.train.state import TrainState

OPTIMIZER_SCOPE = "optimizer_update"  # name of the update's ops in compiled HLO
LOSS_WEIGHT = "loss_weight"  # aux entry: what a task's mean loss divides by (masked tokens)


def accumulated_grad(
    loss_fn: Callable, params: Any, batch: Any, rng: jax.Array, microbatches: int = 1
) -> tuple[tuple[jax.Array, dict], Any]:
    """``((loss, aux), grads)`` of ``loss_fn`` on ``batch``, in ``microbatches`` pieces.

    With ``k = microbatches > 1`` every leaf ``[B, ...]`` of ``batch`` is split into ``k``
    microbatches ``[B / k, ...]`` (microbatch ``i`` holds rows ``i, i + k, ...``, so each
    device splits its own rows: no data moves) and ``lax.scan`` runs forward and backward
    on one at a time (only one microbatch's activations are live), microbatch ``i`` with
    key ``fold_in(rng, i)``. Gradients, loss and aux metrics are summed in float32, weighted
    by ``aux[LOSS_WEIGHT]`` (the count a masked mean divides by; else 1), and divided by the
    summed weight: the whole batch's mean, exactly; ``aux["max_logit"]`` is the maximum.
    ``k = 1`` is ``value_and_grad``. As MaxText's ``gradient_accumulation_steps``.

    Args:
      loss_fn: ``(params, batch, rng) -> (mean loss, aux)``.
      params: the parameter tree; gradients come back in its dtypes.
      batch: a tree of arrays ``[B, ...]``, ``B`` divisible by ``k``.
      rng: the step's key.
      microbatches: ``k >= 1``.

    Raises:
      ValueError: ``B`` not divisible by ``k`` (shows both).
    """
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if microbatches == 1:
        (loss, aux), grads = grad_fn(params, batch, rng)
        aux.pop(LOSS_WEIGHT, None)
        return (loss, aux), grads
    k = microbatches
    for x in jax.tree.leaves(batch):
        if x.shape[0] % k:
            raise ValueError(f"batch rows {x.shape[0]} not divisible by microbatches={k}")
    # [B, ...] -> [k, B / k, ...]: microbatch i = rows i, i + k, ...
    micro = jax.tree.map(lambda x: jnp.swapaxes(x.reshape(-1, k, *x.shape[1:]), 0, 1), batch)

    def one(mb: Any, i: jax.Array) -> dict:
        (loss, aux), g = grad_fn(params, mb, jax.random.fold_in(rng, i))
        w = jnp.asarray(aux.pop(LOSS_WEIGHT, 1.0), jnp.float32)
        top = {"max_logit": aux.pop("max_logit")} if "max_logit" in aux else {}
        out = jax.tree.map(lambda x: w * x.astype(jnp.float32), (loss, aux, g))
        return {"w": w, "sums": out, "top": top}

    def body(acc: dict, xs: tuple) -> tuple[dict, None]:
        out = one(*xs)
        top = jax.tree.map(jnp.maximum, acc["top"], out["top"])
        return {"w": acc["w"] + out["w"], "sums": jax.tree.map(jnp.add, acc["sums"], out["sums"]),
                "top": top}, None  # fmt: skip

    first = jax.tree.map(lambda x: x[0], micro)
    init = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(one, first, 0))
    init["top"] = jax.tree.map(lambda x: jnp.full_like(x, -jnp.inf), init["top"])
    acc, _ = jax.lax.scan(body, init, (micro, jnp.arange(k)))
    loss, aux, grads = jax.tree.map(lambda x: x / acc["w"], acc["sums"])
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    return (loss, aux | acc["top"]), grads


def make_train_step(
    loss_fn: Callable, opt: optimizers.Optimizer, roles: Any, *, diagnostics: bool = False,
    microbatches: int = 1, sample: Callable | None = None,
) -> Callable:  # fmt: skip
    """One optimizer step ``(state, batch) -> (state, metrics)`` (pure; jit/vmap it).

    Args:
      loss_fn: ``(params, batch, rng) -> (loss, aux)``: mean loss (nats) and a dict of
        scalar metrics (``amemory.train.tasks.Task.loss``).
      opt: resolved optimizer (transformation and learning-rate schedules).
      roles: tree of role strings, same structure as params.
      diagnostics: add ``amemory.optim.collect_diagnostics(opt_state)`` to the metrics.
      microbatches: gradient accumulation (:func:`accumulated_grad`): the optimizer runs
        once on the mean gradient of ``microbatches`` pieces of the batch.
      sample: ``rng -> batch`` for a task that draws its batch on the device
        (``MemoryTask.sample_batch``), called with the step's key when ``batch`` is None.

    Returns:
      the step function; its metrics are the scalars of a train record (docs/metrics.md;
      ``max_logit [L, H]`` also goes to ``opt.clip``: QK-Clip). The update runs under
      ``jax.named_scope(OPTIMIZER_SCOPE)``: compiled HLO names its ops.
    """
    leaf_roles = jax.tree.leaves(roles)
    role_names = sorted(set(leaf_roles))

    def step(state: TrainState, batch: Any) -> tuple[TrainState, dict]:
        rng, sub = jax.random.split(state.rng)
        if sample is not None and batch is None:
            batch = sample(sub)
        (loss, aux), grads = accumulated_grad(loss_fn, state.params, batch, sub, microbatches)
        top = aux.pop("max_logit", None)  # (L, H): attention's max logits
        with jax.named_scope(OPTIMIZER_SCOPE):
            updates, opt_state = opt.tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        if opt.clip is not None and top is not None:
            params = opt.clip(params, top)  # QK-Clip: heads whose logits exceeded tau
        metrics = {
            "loss": loss,
            "grad_norm": optax.tree.norm(grads),
            "param_norm": optax.tree.norm(params),
            "lr": opt.lr(state.step),
            "adam_lr": opt.adam_lr(state.step),
        }
        metrics.update({f"aux/{k}": v for k, v in aux.items()})
        if top is not None:
            metrics.update({f"max_logit/{i}": m for i, m in enumerate(jnp.max(top, axis=-1))})
        leaves = jax.tree.leaves(updates)
        for r in role_names:
            us = [
                u.astype(jnp.float32) for u, lr_ in zip(leaves, leaf_roles, strict=True) if lr_ == r
            ]
            sq = sum(jnp.sum(jnp.square(u)) for u in us)
            metrics[f"update_rms/{r}"] = jnp.sqrt(sq / sum(u.size for u in us))
        if diagnostics:
            from amemory.optim import collect_diagnostics

            metrics.update(collect_diagnostics(opt_state))
        return TrainState(state.step + 1, params, opt_state, rng), metrics

    return step


# Metrics averaged over a log interval; every other metric keeps its last value.
def _summed(name: str) -> bool:
    return name == "loss" or name.startswith("aux/")


def empty_accumulator(metrics: dict[str, Any]) -> dict[str, Any]:
    """Zero accumulator (numpy) for a metrics dict of (abstract) arrays.

    ``n`` steps accumulated, ``sum`` of the loss and aux metrics, ``last`` value of the
    others, ``bad_step``: the first step (1-based) whose loss, gradient norm or
    parameter norm was not finite, -1 while none was, and ``bad_loss``: that step's loss.
    """
    return {
        "n": np.zeros((), np.int32),
        "sum": {k: np.zeros(v.shape, v.dtype) for k, v in metrics.items() if _summed(k)},
        "last": {k: np.zeros(v.shape, v.dtype) for k, v in metrics.items() if not _summed(k)},
        "bad_step": np.full(metrics["loss"].shape, -1, np.int32),  # per seed in multi-seed runs
        "bad_loss": np.zeros(metrics["loss"].shape, metrics["loss"].dtype),  # loss at bad_step
    }


def accumulating_step(step: Callable) -> Callable:
    """``(state, acc, batch) -> (state, acc)``: ``step`` with its metrics folded into ``acc``."""

    def acc_step(state: TrainState, acc: dict, batch: Any) -> tuple[TrainState, dict]:
        state, m = step(state, batch)
        finite = jnp.isfinite(m["loss"]) & jnp.isfinite(m["grad_norm"])
        finite &= jnp.isfinite(m["param_norm"])
        first_bad = (acc["bad_step"] < 0) & ~finite
        acc = {
            "n": acc["n"] + 1,
            "sum": {k: acc["sum"][k] + m[k] for k in acc["sum"]},
            "last": {k: m[k] for k in acc["last"]},
            "bad_step": jnp.where(first_bad, state.step, acc["bad_step"]).astype(jnp.int32),
            "bad_loss": jnp.where(first_bad, m["loss"], acc["bad_loss"]),
        }
        return state, acc

    return acc_step


def interval_metrics(acc: dict[str, Any]) -> dict[str, np.ndarray]:
    """Host accumulator -> the train record's metrics: means of loss / aux, last of the rest."""
    n = np.maximum(np.asarray(acc["n"]), 1)
    out = {k: np.asarray(v) / n for k, v in acc["sum"].items()}
    out.update({k: np.asarray(v) for k, v in acc["last"].items()})
    return out


class Engine:
    """Compiles init and the accumulating step with one ``jit`` over ``place.mesh``.

    Args:
      place: the run's :class:`~amemory.train.parallel.Placement`.
      task: the :class:`~amemory.train.tasks.Task`.
      opt: the resolved optimizer.
      roles: role tree of one seed's parameters.
      keys: the seed key ``[2]`` or seed keys ``[S, 2]`` (multi-seed).
      multi: multi-seed run (state leaves ``[S, ...]``, step vmapped over seeds).
      diagnostics: record Muon's orthogonality errors.
      microbatches: ``config.gradient_accumulation_steps`` (:func:`accumulated_grad`).
    """

    def __init__(self, place: parallel.Placement, task, opt, roles, keys, multi: bool,
                 diagnostics: bool, microbatches: int = 1):  # fmt: skip
        self.place, self.multi, self.keys = place, multi, keys
        step = make_train_step(
            task.loss, opt, roles, diagnostics=diagnostics, microbatches=microbatches,
            sample=getattr(task, "sample_batch", None),
        )  # fmt: skip

        def init_one(key):
            k_init, k_rng = jax.random.split(key)
            params = task.init_params(k_init)
            return TrainState(jnp.zeros((), jnp.int32), params, opt.tx.init(params), k_rng)

        init = jax.vmap(init_one) if multi else init_one
        if multi:
            step = jax.vmap(step, in_axes=(0, None))  # one shared batch for every seed
        self._plain_step = step
        self.abstract = a = jax.eval_shape(init, keys)
        mesh = place.mesh
        self._rep = rep = parallel.replicated(mesh)
        lead = 1 if multi else 0
        opt_sh = parallel.state_shardings(a.opt_state, mesh, leading_axes=lead)
        self.state_sh = TrainState(
            step=jax.tree.map(lambda _: rep, a.step),
            params=parallel.state_shardings(a.params, mesh, leading_axes=lead),
            # NorMuon's moments stay with their owners
            opt_state=optim.owner_state_shardings(a.opt_state, mesh, opt_sh, leading_axes=lead),
            rng=jax.tree.map(lambda _: rep, a.rng),
        )
        self._init = jax.jit(init, out_shardings=self.state_sh)
        self._step = jax.jit(
            accumulating_step(step), out_shardings=(self.state_sh, rep), donate_argnums=(0, 1)
        )
        self.restore_target = jax.tree.map(
            lambda a_, s: jax.ShapeDtypeStruct(a_.shape, a_.dtype, sharding=s), a, self.state_sh
        )
        self.batch_sh = parallel.batch_sharding(mesh)
        self._empty_acc = None

    def step(self, state: TrainState, acc: dict, batch: Any) -> tuple[TrainState, dict]:
        """One accumulating step (``state`` and ``acc`` are donated), traced under the mesh
        so that ``ns_dtype="auto"`` follows its devices' platform."""
        with jax.sharding.set_mesh(self.place.mesh):
            return self._step(state, acc, batch)

    def lower(self, local_batch: Any) -> jax.stages.Lowered:
        """The step lowered from abstract shapes (nothing materialised): state, a zero
        accumulator and a global batch shaped like ``local_batch`` (one process's rows)."""
        sds = jax.ShapeDtypeStruct
        batch = jax.tree.map(lambda x: sds(np.shape(x), np.asarray(x).dtype), local_batch)
        acc = jax.tree.map(lambda x: sds(x.shape, x.dtype, sharding=self._rep), self._zeros(batch))
        batch = jax.tree.map(lambda x: sds(x.shape, x.dtype, sharding=self.batch_sh), batch)
        with jax.sharding.set_mesh(self.place.mesh):
            return self._step.lower(self.restore_target, acc, batch)

    def init_state(self) -> TrainState:
        """Fresh state of every seed, placed on the mesh."""
        return self._init(self.keys)

    def put_batch(self, local: Any) -> Any:
        """This process's rows of a (training or eval) batch -> arrays sharded over the mesh
        (host-to-device only; None stays None for tasks without input)."""
        if local is None:
            return None
        return parallel.global_batch(local, self.batch_sh)

    def new_accumulator(self, batch: Any) -> dict:
        """A zero accumulator on the devices (``batch``: a placed batch, for the shapes)."""
        if self._empty_acc is None:
            self._empty_acc = self._zeros(batch)
        return jax.device_put(self._empty_acc, self._rep)

    def _zeros(self, batch: Any) -> dict:
        metrics = jax.eval_shape(lambda s, b: self._plain_step(s, b)[1], self.abstract, batch)
        return empty_accumulator(metrics)

    def fetch(self, tree: Any) -> Any:
        """Replicated device values -> numpy."""
        return jax.tree.map(np.asarray, jax.device_get(tree))

    def eval_params(self, state: TrainState, seed_index: int | None) -> Any:
        """One seed's parameters as arrays on the mesh."""
        if seed_index is None:
            return state.params
        return jax.tree.map(lambda x: x[seed_index], state.params)


@dataclasses.dataclass
class Built:
    """What :func:`build` returns: the run's task, optimizer and engine, and the seeds."""

    task: Any
    opt: optimizers.Optimizer
    engine: Engine
    seeds: list[int]
    multi: bool
    n_params: int


def build(config: Any, place: parallel.Placement, task: Any = None) -> Built:
    """The one step builder: task, optimizer and :class:`Engine` of a validated ``config``
    on ``place`` (abstract shapes only: nothing is materialised or compiled).

    ``amemory train`` runs what this builds; ``amemory plan`` lowers it for a TPU topology.
    ``task`` replaces the task ``config`` describes (``amemory.train.tasks.build``).

    Raises:
      ValueError: bad config or batch (names the field), as ``tasks.build`` and
        ``optimizers.build`` do.
    """
    from amemory.train import tasks

    task = task if task is not None else tasks.build(config, place)
    multi = bool(config.seeds)
    seeds = [int(s) for s in config.seeds] if multi else [int(config.seed)]
    keys = jnp.stack([jax.random.PRNGKey(s) for s in seeds])  # [S, 2]
    abstract_params = jax.eval_shape(task.init_params, jax.random.PRNGKey(0))
    roles = task.roles(abstract_params)
    opt = optimizers.build(
        config, abstract_params, roles, muon_roles=task.muon_roles,
        matrix_axes=task.matrix_axes, mesh=place.mesh if place.mode == "sharded" else None,
        head_view=getattr(task, "head_view", None), width=getattr(task, "width", None),
    )  # fmt: skip
    info = optim.OPTIMIZERS.get(config.optimizer.name)  # None for "adam"
    diagnostics = bool(config.optimizer.diagnostics and info and info.orthogonalizes)
    k = int(config.get("gradient_accumulation_steps", 1))
    engine = Engine(place, task, opt, roles, keys if multi else keys[0], multi, diagnostics, k)
    n_params = int(sum(np.prod(x.shape) for x in jax.tree.leaves(abstract_params)))
    return Built(task, opt, engine, seeds, multi, n_params)
