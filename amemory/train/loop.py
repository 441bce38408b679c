"""``train(config, workdir)``: the training loop for both model families.

Run directory (``workdir``)
  config.json      the resolved config (after command-line overrides)
  metrics.jsonl    one JSON object per line, see below
  checkpoints/     Orbax steps: params, opt_state, step, rng, data position, config, digest
  summary.json     the dict ``train`` returns (written last: its presence marks a finished run)
  run.lock         held while a run is live (``amemory.train.lock``)

metrics.jsonl records. Every record has ``"kind"`` and ``"step"`` (optimizer
steps completed, int). In multi-seed runs (``config.seeds`` non-empty) every
numeric value below is a list with one entry per seed, in ``config.seeds`` order.

``kind == "train"`` (every ``config.log_every`` steps):
  loss            mean training loss of the step's batch, nats per token (LM) / per query (memory)
  lr              learning rate of ``optimizer.name`` at this step
  adam_lr         learning rate of the Adam part at this step
  grad_norm       global L2 norm of the gradient (before clipping)
  param_norm      global L2 norm of the parameters after the step
  update_rms/<role>   RMS of the parameter update (new - old) over all entries of that role
  aux/<name>      scalars the task's loss returns beside the loss (MoE models: ce_loss, the
                  cross-entropy alone; moe_lb_loss, the load-balancing loss averaged over
                  layers; moe_lb_coef, its coefficient in ``loss``; moe_drop_fraction)
  ortho_error/<path>  orthogonality error of the Muon direction (amemory.optim.collect_diagnostics)
  tokens_per_s    training throughput since the previous train record (global tokens / wall second)
  step_time_s     mean wall seconds per step since the previous train record

``kind == "eval"`` (every ``config.eval_every`` steps and at the end):
  LM on a corpus:  loss (mean validation nats/token), loss/bucket_<b> for frequency bucket b
                   (0 = most frequent tokens), bucket_labels (token-count range of each bucket)
  biographies:     loss, fta/group_<g> first-token accuracy of group g, fta (all questions)
  memory:          loss (population loss, nats), acc (prior-weighted accuracy),
                   loss/head, loss/tail, acc/head, acc/tail, correct_prob/min, gap (Delta(W) of
                   papers.md A.2), per_class_loss and per_class_prob (lists of length K)

``kind == "spectrum"`` (every ``config.spectrum_every`` steps):
  spectrum/<role>/<metric>  isotropy metrics (amemory.analysis.spectrum.spectrum_metrics) of the
                   role's matrices, averaged over layers ("vo" is the per-layer product
                   W_O W_V); metrics: entropy, effective_rank, top10_energy, q75_25,
                   stable_rank, condition_number

``kind == "event"``: ``event`` in {"start", "resume", "compiled", "nonfinite", "end"} with
details ("start" holds the routing table: rows [path, shape, role, transform]); from
``amemory.train.guard``: "checkpoint_rejected" (checkpoint, reason), "config_changed"
(allowed, bookkeeping: {field: [old, new]}), "nonfinite" and "diverged" (healthy_checkpoint),
"stopped" (reason: SIGTERM | SIGINT | preemption, checkpoint).

Memory-task records count queries, not tokens: ``tokens_per_s`` is queries per second
(``batch_size`` per step, or K per step for the exact population loss).
"""

from __future__ import annotations

import json
import math
import pathlib
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import multihost_utils
from ml_collections import ConfigDict
from tqdm.auto import tqdm

from amemory import atomic
from amemory.analysis import spectrum as spectrum_lib
from amemory.train import checkpoint as ckpt_lib
from amemory.train import config as config_lib
from amemory.train import guard as guard_lib
from amemory.train import optimizers, parallel, tasks
from amemory.train.guard import NonFiniteLossError as NonFiniteLossError  # issue 15: moved
from amemory.train.state import TrainState

# ----------------------------------------------------------------------------- the step


def make_train_step(
    loss_fn: Callable, opt: optimizers.Optimizer, roles: Any, *, axis_name: str | None = None,
    diagnostics: bool = False,
) -> Callable:  # fmt: skip
    """One optimizer step ``(state, batch) -> (state, metrics)`` (pure; jit/pmap/vmap it).

    Args:
      loss_fn: ``(params, batch, rng) -> (loss, aux)``: mean loss (nats) and a dict of
        scalar metrics, reported as ``aux/<name>``.
      opt: resolved optimizer (transformation and learning-rate schedules).
      roles: tree of role strings, same structure as params.
      axis_name: under ``pmap``, the axis over which gradients and loss are averaged
        (``lax.pmean``); dropout keys are folded with the device index.
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
            **{f"aux/{k}": v for k, v in aux.items()},
        }
        leaves = jax.tree.leaves(updates)
        for r in role_names:
            us = [
                u.astype(jnp.float32) for u, lr_ in zip(leaves, leaf_roles, strict=True) if lr_ == r
            ]
            sq = sum(jnp.sum(jnp.square(u)) for u in us)
            metrics[f"update_rms/{r}"] = jnp.sqrt(sq / sum(u.size for u in us))
        if diagnostics:
            from amemory.optim.muon import collect_diagnostics

            metrics.update(collect_diagnostics(opt_state))
        return TrainState(state.step + 1, params, opt_state, rng), metrics

    return step


# ----------------------------------------------------------------------------- placement


class _Engine:
    """Compiles init / step / eval for one parallel mode and moves data in and out."""

    def __init__(self, place: parallel.Placement, task, opt, roles, keys, multi: bool, diag: bool):
        self.place, self.task, self.multi = place, task, multi
        mode = place.mode
        axis = "data" if mode == "pmap" else None
        step = make_train_step(task.loss, opt, roles, axis_name=axis, diagnostics=diag)
        ev = getattr(task, "eval_stats", None)

        def init_one(key):
            k_init, k_rng = jax.random.split(key)
            params = task.init_params(k_init)
            return TrainState(jnp.zeros((), jnp.int32), params, opt.tx.init(params), k_rng)

        init = jax.vmap(init_one) if multi else init_one
        # Tasks with per-seed data (seed_batched) give batches [S, ...]; else one shared batch.
        self.seed_batched = multi and getattr(task, "seed_batched", False)
        if multi:
            step = jax.vmap(step, in_axes=(0, 0 if self.seed_batched else None))
            ev = jax.vmap(ev, in_axes=(0, None)) if ev is not None else None
        self.keys = keys
        self.abstract = jax.eval_shape(init, keys)
        self.eval = None
        if mode == "single":
            dev = jax.devices()[0]
            sh = jax.sharding.SingleDeviceSharding(dev)
            self._init = jax.jit(init)
            self.step = jax.jit(step, donate_argnums=0)
            self.eval = jax.jit(ev) if ev is not None else None
            self.restore_target = jax.tree.map(
                lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), self.abstract
            )
        elif mode == "pmap":
            self._init = jax.jit(init)
            self.step = jax.pmap(step, axis_name="data", donate_argnums=0)
            if ev is not None:
                self.eval = jax.pmap(lambda p, b: jax.lax.psum(ev(p, b), "data"), axis_name="data")
            sh = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
            self.restore_target = jax.tree.map(
                lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), self.abstract
            )
        else:
            mesh = place.mesh
            rep = parallel.replicated(mesh)
            lead = 1 if multi else 0
            a = self.abstract
            self.state_sh = TrainState(
                step=jax.tree.map(lambda _: rep, a.step),
                params=parallel.state_shardings(a.params, mesh, leading_axes=lead),
                opt_state=parallel.state_shardings(a.opt_state, mesh, leading_axes=lead),
                rng=jax.tree.map(lambda _: rep, a.rng),
            )
            self.batch_sh = parallel.batch_sharding(mesh, leading_axes=int(self.seed_batched))
            self._init = jax.jit(init, out_shardings=self.state_sh)
            self.step = jax.jit(
                step,
                in_shardings=(self.state_sh, self.batch_sh),
                out_shardings=(self.state_sh, rep),
                donate_argnums=0,
            )
            if ev is not None:
                self.eval = jax.jit(
                    ev, in_shardings=(self.state_sh.params, self.batch_sh), out_shardings=rep
                )
            self.restore_target = jax.tree.map(
                lambda a_, s: jax.ShapeDtypeStruct(a_.shape, a_.dtype, sharding=s),
                self.abstract,
                self.state_sh,
            )

    def init_state(self) -> TrainState:
        state = self._init(self.keys)
        return parallel.replicate(state) if self.place.mode == "pmap" else state

    def put_batch(self, local: Any) -> Any:
        mode = self.place.mode
        if mode == "pmap":
            return parallel.split_for_pmap(local, self.place.n_local)
        if mode == "sharded":
            return parallel.global_batch(local, self.batch_sh, row_axis=int(self.seed_batched))
        return jax.device_put(local)

    def fetch(self, tree: Any) -> Any:
        """Replicated device values -> numpy (first replica under pmap)."""
        if self.place.mode == "pmap":
            return jax.tree.map(lambda x: np.asarray(x.addressable_shards[0].data[0]), tree)
        return jax.tree.map(np.asarray, jax.device_get(tree))

    def to_host(self, tree: Any) -> Any:
        """Full values of (possibly sharded / replicated) arrays as numpy, on every process."""
        if self.place.mode == "pmap":
            return self.fetch(tree)
        if jax.process_count() > 1:
            return multihost_utils.process_allgather(tree, tiled=True)
        return jax.tree.map(np.asarray, jax.device_get(tree))

    def for_checkpoint(self, state: TrainState) -> TrainState:
        return parallel.unreplicate(state) if self.place.mode == "pmap" else state

    def from_checkpoint(self, state: TrainState) -> TrainState:
        return parallel.replicate(state) if self.place.mode == "pmap" else state


# ----------------------------------------------------------------------------- logging


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.ndarray, jax.Array)):
        return _jsonable(np.asarray(x).tolist())
    if isinstance(x, (np.floating, float)):
        x = float(x)
        return x if math.isfinite(x) else None
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


class _Log:
    """metrics.jsonl writer (process 0 only); on resume drops records after the restored step."""

    def __init__(self, path: pathlib.Path, enabled: bool, keep_until: int | None):
        self.path, self.enabled = path, enabled
        if not enabled:
            return
        if keep_until is None:
            self.path.write_text("")
        elif self.path.exists():
            kept = []
            for line in self.path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a kill
                if int(rec.get("step", 0)) <= keep_until:
                    kept.append(line)
            atomic.write_text(self.path, "".join(line + "\n" for line in kept))  # issue 15
        self._f = self.path.open("a")

    def write(self, kind: str, step: int, **fields: Any) -> None:
        if not self.enabled:
            return
        rec = {"kind": kind, "step": int(step), **_jsonable(fields)}
        self._f.write(json.dumps(rec) + "\n")
        self._f.flush()

    def close(self) -> None:
        if self.enabled:
            self._f.close()


def _routes(table: list) -> str:
    """One line of the routing table: ``routing: q,k,v,o -> muon; embed,norm -> adam``."""
    by_tx: dict[str, list[str]] = {}
    for _, _, role, tx_name in table:
        roles = by_tx.setdefault(tx_name, [])
        if role not in roles:
            roles.append(role)
    return "routing: " + "; ".join(f"{','.join(r)} -> {t}" for t, r in by_tx.items())


def _per_seed(x: Any, multi: bool) -> Any:
    """numpy scalar -> float; [S] -> list (multi-seed)."""
    a = np.asarray(x)
    if multi:
        return a.tolist()
    return a.item() if a.ndim == 0 else a.tolist()


# ----------------------------------------------------------------------------- train


def train(
    config: ConfigDict, workdir: str | pathlib.Path, *, resume: bool = False,
    allow_changed: tuple[str, ...] = (),
) -> dict:  # fmt: skip
    """Train ``config`` and write the run directory ``workdir``; return the summary dict.

    Args:
      config: run ConfigDict (``experiments/configs/lm.py`` or ``memory.py``).
      workdir: run directory (created); holds config.json, metrics.jsonl, checkpoints/,
        summary.json.
      resume: continue from the newest intact checkpoint in ``workdir`` (a fresh start
        when there is none; damaged ones are moved aside with a warning). Without it a
        workdir that already has checkpoints is an error. The continuation is exact
        for the same config; a different ``steps`` also reshapes the learning-rate
        schedule (it is a function of ``steps``).
      allow_changed: config fields that may differ from the checkpoint's config on
        resume (``amemory.train.guard.check_resume``; recorded in metrics.jsonl).

    Returns:
      summary dict: workdir, task, optimizer, mode, seeds, steps, n_params,
      final_train_loss, final_eval, tokens_per_s (median), wall_s, compile_s,
      resumed_from, last_checkpoint.

    Raises:
      ValueError: bad config (names the field and allowed values), data not found,
        or a checkpoint that does not fit the model (names the leaf) -- all before
        compiling the step.
      NonFiniteLossError: the loss became NaN/inf (any seed of a multi-seed run); the
        message names the step and the newest healthy checkpoint.
      amemory.train.guard.DivergenceError: the divergence test fired (``config.divergence``).
      amemory.train.guard.RunInterrupted: SIGTERM/SIGINT/preemption; the step was saved.
      amemory.train.guard.WorkdirBusyError: another run holds ``workdir``.
      OSError: the workdir cannot be written (read-only, full disk).
    """
    return run(config, workdir, resume=resume, allow_changed=allow_changed)[0]


def run(
    config: ConfigDict, workdir: str | pathlib.Path, *, resume: bool = False,
    allow_changed: tuple[str, ...] = (),
) -> tuple[dict, TrainState]:  # fmt: skip
    """``train``, also returning the final ``TrainState`` as numpy arrays (host copy)."""
    config_lib.validate(config)  # issue 15: lock + signals + guards around the whole run
    parallel.initialize_distributed(config.parallel)
    with guard_lib.RunGuard(config, workdir, allow_changed) as g:
        return _run(config, workdir, resume=resume, g=g)


def _run(
    config: ConfigDict, workdir: str | pathlib.Path, *, resume: bool, g: guard_lib.RunGuard
) -> tuple[dict, TrainState]:
    t_start = time.perf_counter()
    config = ConfigDict(config.to_dict()) if isinstance(config, ConfigDict) else config
    config_lib.validate(config)
    parallel.initialize_distributed(config.parallel)
    place = parallel.placement(config.parallel)
    is_main = jax.process_index() == 0
    workdir = pathlib.Path(workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)

    task = tasks.build(config, place.data_shards)
    multi = bool(config.seeds)
    seeds = [int(s) for s in config.seeds] if multi else [int(config.seed)]
    keys = (
        jnp.stack([jax.random.PRNGKey(s) for s in seeds]) if multi else jax.random.PRNGKey(seeds[0])
    )
    abstract_params = jax.eval_shape(task.init_params, jax.random.PRNGKey(0))
    roles = task.roles(abstract_params)
    if task.kind == "memory":
        # The memory's one matrix W always goes to optimizer.name (muon_roles is moot).
        matrix = tuple(sorted(set(jax.tree.leaves(roles))))
        opt = optimizers.build(
            config, abstract_params, roles, matrix_roles=matrix, matrix_axes=(1, 0)
        )
    else:
        # The last two axes of every leaf are its matrix; leading axes (MoE experts
        # [E, d, f]) are batch axes, each matrix orthogonalised on its own.
        opt = optimizers.build(config, abstract_params, roles, matrix_axes=(-2, -1))
    diag = bool(config.optimizer.diagnostics) and config.optimizer.name in ("muon", "normuon")
    engine = _Engine(place, task, opt, roles, keys, multi, diag)

    ckpt = ckpt_lib.Checkpointer(workdir / "checkpoints", max_to_keep=int(config.keep_checkpoints))
    latest = ckpt.latest_step()
    if latest is not None and not resume:
        raise ValueError(
            f"workdir {workdir} already holds checkpoints (latest step {latest}); pass "
            "--resume (resume=True) to continue it, or choose another --workdir"
        )
    n_params = int(sum(np.prod(x.shape) for x in jax.tree.leaves(abstract_params)))
    if latest is not None:
        latest, restored, extra = g.restore(ckpt, engine.restore_target)  # issue 15: intact
        state = engine.from_checkpoint(restored)
        task.restore_data(extra["data_position"])
        start = int(latest)
    else:
        state = engine.init_state()
        start = 0
    log = _Log(workdir / "metrics.jsonl", is_main, start if latest is not None else None)
    g.attach(ckpt, log)  # issue 15
    if is_main:
        atomic.write_text(workdir / "config.json", config.to_json_best_effort(indent=2) + "\n")
    if latest is not None:
        log.write("event", start, event="resume", checkpoint=str(ckpt.path(latest)))
    else:
        log.write(
            "event", 0, event="start", task=task.kind, optimizer=config.optimizer.name,
            lr=optimizers.resolved_lr(config.optimizer), adam_lr=config.optimizer.adam_lr,
            mode=place.mode, seeds=seeds, n_params=n_params, devices=jax.device_count(),
            processes=jax.process_count(), routing=opt.table,
        )  # fmt: skip

    if is_main and config.progress:
        tqdm.write(f"amemory train: {task.kind}, {n_params:,} parameters, {_routes(opt.table)}")
    steps = int(config.steps)
    extra_fn = lambda: {  # noqa: E731
        "data_position": task.data_state(),
        "config": json.loads(config.to_json_best_effort()),
        "seeds": seeds,
    }
    bar = tqdm(
        total=steps, initial=start, disable=not (config.progress and is_main),
        desc=f"{task.kind}/{config.optimizer.name}", unit="step", dynamic_ncols=True,
    )  # fmt: skip
    last_loss: Any = None
    last_eval: dict = {}
    throughput: list[float] = []
    compile_s = None
    acc_time, acc_steps = 0.0, 0
    last_saved = start if latest is not None else None
    try:
        for s in range(start + 1, steps + 1):
            t0 = time.perf_counter()
            batch = engine.put_batch(task.next_batch())
            state, metrics = engine.step(state, batch)
            m = engine.fetch(metrics)
            dt = time.perf_counter() - t0
            loss = np.asarray(m["loss"])
            g.check_finite(s, loss)  # issue 15: names the newest healthy checkpoint
            if compile_s is None:
                compile_s = dt
                log.write("event", s, event="compiled", first_step_s=dt)
            else:
                acc_time += dt
                acc_steps += 1
            last_loss = _per_seed(loss, multi)
            if s % int(config.log_every) == 0 or s == steps:
                rec = {k: _per_seed(v, multi) for k, v in m.items()}
                if acc_steps:
                    tps = task.tokens_per_step * acc_steps / acc_time
                    rec["tokens_per_s"] = tps
                    rec["step_time_s"] = acc_time / acc_steps
                    throughput.append(tps)
                    bar.set_postfix(loss=np.mean(loss), tok_s=f"{tps:.0f}")
                else:
                    bar.set_postfix(loss=np.mean(loss))
                acc_time, acc_steps = 0.0, 0
                log.write("train", s, **rec)
                g.observe_log(s, m["loss"], m["grad_norm"])  # issue 15: divergence test
            if s % int(config.eval_every) == 0 or s == steps:
                last_eval = _evaluate(engine, task, state, multi)
                log.write("eval", s, **last_eval)
            every = int(config.spectrum_every)
            if every and (s % every == 0 or s == steps):
                log.write("spectrum", s, **_spectrum(engine, task, state, multi))
            every = int(config.checkpoint_every)
            if (every and s % every == 0) or s == steps:
                g.save(ckpt, s, engine.for_checkpoint(state), extra_fn())  # issue 15: verified
                last_saved = s
            bar.update(1)
            if s < steps and g.stop_requested(s):  # issue 15: SIGTERM/SIGINT -> save s, stop
                g.stop(ckpt, s, engine.for_checkpoint(state), extra_fn, saved=last_saved == s)
        ckpt.wait()
    finally:
        bar.close()
        ckpt.close()
    final_host = engine.to_host(state)
    final_step = int(np.asarray(final_host.step).ravel()[0])
    if last_loss is None or not last_eval:
        last_eval = _evaluate(engine, task, state, multi)
    summary = {
        "workdir": str(workdir),
        "task": task.kind,
        "optimizer": config.optimizer.name,
        "muon_roles": config.optimizer.muon_roles,
        "mode": place.mode,
        "seeds": seeds,
        "steps": final_step,
        "n_params": n_params,
        "final_train_loss": last_loss,
        "final_eval": last_eval,
        "tokens_per_s": float(np.median(throughput)) if throughput else None,
        "compile_s": compile_s,
        "wall_s": time.perf_counter() - t_start,
        "resumed_from": start if latest is not None else None,
        "last_checkpoint": str(ckpt.path(last_saved)) if last_saved is not None else None,
    }
    summary = _jsonable(summary)
    log.write("event", final_step, event="end", wall_s=summary["wall_s"])
    log.close()
    if is_main:
        atomic.write_json(workdir / "summary.json", summary)  # issue 15
    return summary, final_host


def _evaluate(engine: _Engine, task, state: TrainState, multi: bool) -> dict:
    if engine.eval is None:  # host-side evaluation (memory, biographies)
        params = engine.to_host(state.params)
        if not multi:
            return task.eval_host(params)
        n = len(jax.tree.leaves(params)[0])
        per = [task.eval_host(jax.tree.map(lambda x, i=i: x[i], params)) for i in range(n)]
        return {k: [p[k] for p in per] for k in per[0]}
    sums = None
    for local in task.eval_batches():
        out = engine.fetch(engine.eval(state.params, engine.put_batch(local)))
        out = jax.tree.map(lambda x: np.asarray(x, np.float64), out)
        sums = out if sums is None else jax.tree.map(np.add, sums, out)
    return task.finalize_eval(sums)


def _spectrum(engine: _Engine, task, state: TrainState, multi: bool) -> dict:
    mats = task.spectrum_matrices(engine.to_host(state.params))
    out = {}
    for role, stack in mats.items():  # stack: [L, (S,) m, n]
        for name, v in spectrum_lib.spectrum_metrics(stack).items():
            out[f"spectrum/{role}/{name}"] = _per_seed(np.nanmean(np.asarray(v), axis=0), multi)
    return out
