"""The compiled side of training: the step, on-device metric accumulation, placement.

:func:`make_train_step` is one optimizer step. :func:`accumulating_step` wraps it so that
the metrics of every step are reduced on the device into an accumulator (sum of the
loss and aux metrics, last value of the others, first non-finite step), which the loop
reads only at log steps: no device-to-host copy happens between them.

:class:`Engine` compiles init / step for one placement. There are two paths: ``pmap``
(state replicated with a leading device axis, batches split per device, gradients
averaged with ``lax.pmean``), and ``jit`` over a ``Mesh`` (``single`` = one-device mesh,
``sharded`` = FSDP layout from :mod:`amemory.train.parallel`). Multi-seed runs ``vmap``
the step over a leading seed axis of the state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from amemory import optim
from amemory.train import optimizers, parallel
from amemory.train.state import TrainState


def make_train_step(
    loss_fn: Callable, opt: optimizers.Optimizer, roles: Any, *, axis_name: str | None = None,
    diagnostics: bool = False,
) -> Callable:  # fmt: skip
    """One optimizer step ``(state, batch) -> (state, metrics)`` (pure; jit/pmap/vmap it).

    Args:
      loss_fn: ``(params, batch, rng) -> (loss, aux)``: mean loss (nats) and a dict of
        scalar metrics (``amemory.train.tasks.Task.loss``).
      opt: resolved optimizer (transformation and learning-rate schedules).
      roles: tree of role strings, same structure as params.
      axis_name: under ``pmap``, the axis over which gradients, loss and aux are averaged
        (``lax.pmean``); dropout / sampling keys are folded with the device index.
      diagnostics: add ``amemory.optim.collect_diagnostics(opt_state)`` to the metrics.

    Returns:
      the step function; metrics are scalars: loss, grad_norm, param_norm, lr, adam_lr,
      update_rms/<role>, aux/<name>, and ortho_error/<path> when ``diagnostics``.
    """
    leaf_roles = jax.tree.leaves(roles)
    role_names = sorted(set(leaf_roles))

    def step(state: TrainState, batch: Any) -> tuple[TrainState, dict]:
        rng, sub = jax.random.split(state.rng)
        if axis_name is not None:
            sub = jax.random.fold_in(sub, jax.lax.axis_index(axis_name))
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch, sub)
        if axis_name is not None:
            loss, aux, grads = jax.lax.pmean((loss, aux, grads), axis_name)
        updates, opt_state = opt.tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {
            "loss": loss,
            "grad_norm": optax.tree.norm(grads),
            "param_norm": optax.tree.norm(params),
            "lr": opt.lr(state.step),
            "adam_lr": opt.adam_lr(state.step),
        }
        metrics.update({f"aux/{k}": v for k, v in aux.items()})
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
    others, and ``bad_step``: the first step (1-based) whose loss, gradient norm or
    parameter norm was not finite, -1 while none was.
    """
    return {
        "n": np.zeros((), np.int32),
        "sum": {k: np.zeros(v.shape, v.dtype) for k, v in metrics.items() if _summed(k)},
        "last": {k: np.zeros(v.shape, v.dtype) for k, v in metrics.items() if not _summed(k)},
        "bad_step": np.full(metrics["loss"].shape, -1, np.int32),  # per seed in multi-seed runs
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
    """Compiles init and the accumulating step for one placement; moves data in and out.

    Args:
      place: the run's :class:`~amemory.train.parallel.Placement`.
      task: the :class:`~amemory.train.tasks.Task`.
      opt: the resolved optimizer.
      roles: role tree of one seed's parameters.
      keys: the seed key ``[2]`` or seed keys ``[S, 2]`` (multi-seed).
      multi: multi-seed run (state leaves ``[S, ...]``, step vmapped over seeds).
      diagnostics: record Muon's orthogonality errors.
    """

    def __init__(self, place: parallel.Placement, task, opt, roles, keys, multi: bool,
                 diagnostics: bool):  # fmt: skip
        self.place, self.multi, self.keys = place, multi, keys
        self.pmap = place.mode == "pmap"
        step = make_train_step(
            task.loss, opt, roles, axis_name="data" if self.pmap else None, diagnostics=diagnostics
        )

        def init_one(key):
            k_init, k_rng = jax.random.split(key)
            params = task.init_params(k_init)
            return TrainState(jnp.zeros((), jnp.int32), params, opt.tx.init(params), k_rng)

        init = jax.vmap(init_one) if multi else init_one
        if multi:
            step = jax.vmap(step, in_axes=(0, None))  # one shared batch for every seed
        self._plain_step = step
        acc_step = accumulating_step(step)
        self.abstract = jax.eval_shape(init, keys)
        mesh = place.mesh
        rep = parallel.replicated(mesh)
        if self.pmap:
            self._init = jax.jit(init)
            self.step = jax.pmap(acc_step, axis_name="data", donate_argnums=(0, 1))
            dev = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
            self.restore_target = jax.tree.map(
                lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=dev), self.abstract
            )
        else:
            lead = 1 if multi else 0
            a = self.abstract
            self.state_sh = TrainState(
                step=jax.tree.map(lambda _: rep, a.step),
                params=parallel.state_shardings(a.params, mesh, leading_axes=lead),
                opt_state=optim.owner_state_shardings(  # NorMuon's moments stay with owners
                    a.opt_state,
                    mesh,
                    parallel.state_shardings(a.opt_state, mesh, leading_axes=lead),
                    leading_axes=lead,
                ),
                rng=jax.tree.map(lambda _: rep, a.rng),
            )
            self._init = jax.jit(init, out_shardings=self.state_sh)
            self.step = jax.jit(acc_step, out_shardings=(self.state_sh, rep), donate_argnums=(0, 1))
            self.restore_target = jax.tree.map(
                lambda a_, s: jax.ShapeDtypeStruct(a_.shape, a_.dtype, sharding=s),
                self.abstract,
                self.state_sh,
            )
        self.batch_sh = parallel.batch_sharding(mesh)  # eval batches (and train in mesh mode)
        self._rep = rep
        self._empty_acc = None

    # -- state ------------------------------------------------------------------------

    def init_state(self) -> TrainState:
        """Fresh state of every seed, placed (replicated per device under pmap)."""
        state = self._init(self.keys)
        return parallel.replicate(state) if self.pmap else state

    def for_checkpoint(self, state: TrainState) -> TrainState:
        """The state as saved (one copy: the first device's under pmap)."""
        return parallel.unreplicate(state) if self.pmap else state

    def from_checkpoint(self, state: TrainState) -> TrainState:
        """A restored state placed for the step (replicated per device under pmap)."""
        return parallel.replicate(state) if self.pmap else state

    # -- data ---------------------------------------------------------------------------

    def put_batch(self, local: Any) -> Any:
        """This process's rows of a training batch -> device arrays with the step's sharding
        (host-to-device only; None stays None for tasks without input)."""
        if local is None:
            return None
        if self.pmap:
            return parallel.put_for_pmap(local)
        return parallel.global_batch(local, self.batch_sh)

    def new_accumulator(self, batch: Any) -> dict:
        """A zero accumulator on the devices (``batch``: a placed batch, for the shapes)."""
        if self._empty_acc is None:
            self._empty_acc = empty_accumulator(self._metric_shapes(batch))
        if self.pmap:
            return parallel.replicate(self._empty_acc)
        return jax.device_put(self._empty_acc, self._rep)

    def _metric_shapes(self, batch: Any) -> dict:
        metrics = lambda s, b: self._plain_step(s, b)[1]  # noqa: E731
        if not self.pmap:
            return jax.eval_shape(metrics, self.abstract, batch)
        # Per-device shapes: trace the step over a named axis of size 1 (axis_index, pmean).
        sds = jax.ShapeDtypeStruct
        state1 = jax.tree.map(lambda a: sds((1, *a.shape), a.dtype), self.abstract)
        batch1 = jax.tree.map(lambda x: sds((1, *x.shape[1:]), x.dtype), batch)
        m = jax.eval_shape(jax.vmap(metrics, axis_name="data"), state1, batch1)
        return jax.tree.map(lambda x: sds(x.shape[1:], x.dtype), m)

    def fetch(self, tree: Any) -> Any:
        """Replicated device values -> numpy (the first device's copy under pmap)."""
        if self.pmap:
            return jax.tree.map(lambda x: np.asarray(x.addressable_shards[0].data[0]), tree)
        return jax.tree.map(np.asarray, jax.device_get(tree))

    def to_host(self, tree: Any) -> Any:
        """Full values as numpy on every process (one replica under pmap)."""
        return self.fetch(tree) if self.pmap else parallel.to_host(tree)

    def host_params(self, state: TrainState) -> Any:
        """Every seed's parameters as numpy (for spectra)."""
        return self.to_host(state.params)

    # -- evaluation -----------------------------------------------------------------------

    def eval_params(self, state: TrainState, seed_index: int | None) -> Any:
        """One seed's parameters as arrays on the mesh (replicated per device under pmap)."""
        params = parallel.pmap_to_mesh(state.params, self.place.mesh) if self.pmap else state.params
        if seed_index is None:
            return params
        return jax.tree.map(lambda x: x[seed_index], params)

    def put_eval(self, local: Any) -> Any:
        """This process's rows of a global eval batch -> arrays sharded over the mesh."""
        return parallel.global_batch(local, self.batch_sh)
