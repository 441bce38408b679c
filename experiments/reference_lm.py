"""A plain optax + flax training loop for the corpus LM: the reference beside the engine.

The same model, initialisation per seed and batches (the engine's data order) as
``amemory.train.train``, with nothing of the engine's optimizer or loop: the optimizer is
written directly in optax and the loop is a ``jax.jit`` of ``jax.vmap`` over seeds, read
top to bottom. ``steps_ratio`` checks that the engine's Adam matches this Adam within seed
noise and reads the steps-to-Adam ratio of ``optax.contrib.muon`` (the peer
implementation); ``normuon`` measures the per-output-neuron norms of each step's update
(NorMuon's premise, Li et al., arXiv 2510.05491, Sec. 3).

Kinds of optimizer (:data:`KINDS`): ``adam`` (``optax.adam`` / ``optax.adamw`` on every
parameter), ``optax_muon`` (``optax.contrib.muon``), ``muon`` and ``normuon``
(``amemory.optim.muon`` / ``normuon``), the last three on the hidden matrices with
``optax.adam`` on the rest. Only the corpus LM task is supported.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

KINDS = ("adam", "optax_muon", "muon", "normuon")
HIDDEN = ("q", "k", "v", "o", "w_in", "w_gate", "w_out")


def schedule(cfg: Any, peak: float) -> optax.Schedule:
    """Linear warmup from 0 to ``peak``, cosine decay to ``peak * final_fraction`` at the end;
    ``ValueError`` if ``cfg.schedule.name`` is not ``"cosine"`` (the experiments' schedule)."""
    if cfg.schedule.name != "cosine":
        raise ValueError(f"reference_lm supports schedule.name='cosine', got {cfg.schedule.name!r}")
    return optax.warmup_cosine_decay_schedule(
        0.0, peak, int(cfg.schedule.warmup_steps), int(cfg.steps),
        end_value=peak * float(cfg.schedule.final_fraction),
    )  # fmt: skip


def make_tx(cfg: Any, kind: str, labels: Any) -> optax.GradientTransformation:
    """The optimizer of ``kind`` (:data:`KINDS`) written directly in optax, from ``cfg.optimizer``
    and the schedule; ``labels`` is a params-shaped tree of ``"hidden"`` / ``"rest"``.
    ``ValueError`` for an unknown ``kind``."""
    o = cfg.optimizer
    wd = float(o.weight_decay)
    betas = {"b1": float(o.b1), "b2": float(o.b2), "eps": float(o.eps)}
    adam_lr = schedule(cfg, float(o.adam_lr))
    adam = (
        optax.adamw(adam_lr, **betas, weight_decay=wd) if wd > 0 else optax.adam(adam_lr, **betas)
    )
    if kind == "adam":
        return adam
    lr = schedule(cfg, float(o.lr))
    if kind == "optax_muon":
        matrix = optax.contrib.muon(
            lr, ns_steps=int(o.ns_steps), beta=float(o.momentum), weight_decay=wd,
            nesterov=bool(o.nesterov),
        )  # fmt: skip
    elif kind in ("muon", "normuon"):
        from amemory import optim

        make = optim.muon if kind == "muon" else optim.normuon
        matrix = make(
            lr, momentum=float(o.momentum), nesterov=bool(o.nesterov),
            ns_steps=int(o.ns_steps), weight_decay=wd,
        )  # fmt: skip
    else:
        raise ValueError(f"reference_lm kind must be one of {KINDS}, got {kind!r}")
    return optax.partition({"hidden": matrix, "rest": adam}, labels)


def neuron_norm_cv(update: jax.Array) -> jax.Array:
    """Coefficient of variation ``std(n) / mean(n)`` (population std) of the per-output-neuron
    norms ``n_j = ||update[:, j]||_2`` of ``update`` ``[fan_in, fan_out]`` (Flax kernel layout);
    a scalar, NaN for an all-zero update (the first step of a warmup from 0)."""
    n = jnp.sqrt(jnp.sum(update.astype(jnp.float32) ** 2, axis=0))  # (fan_out,)
    mean = jnp.mean(n)
    return jnp.where(mean > 0, jnp.std(n) / jnp.where(mean > 0, mean, 1.0), jnp.nan)


def run(cfg: Any, kind: str, seeds: tuple[int, ...], *, log_every: int = 10) -> dict[str, Any]:
    """Train ``cfg``'s model with the optimizer ``kind`` on every seed at once.

    ``cfg`` is an LM run config (``experiments/configs/lm.py``) on the corpus; ``cfg.seed``
    fixes the data order, ``seeds`` the initialisations (as the engine's runs);
    ``log_every`` is the steps between records of the update statistics.

    Returns:
      dict with ``eval_steps [n]``, ``val_loss [n, S]`` (nats/token, every
      ``cfg.eval_every`` steps and at the end), ``train_loss [steps, S]``,
      ``cv_steps [m]`` and ``neuron_cv`` {role: [m, S]} (mean over layers of
      :func:`neuron_norm_cv` of the update of that role's matrices), ``wall_s``.

    Raises:
      ValueError: for an unknown kind, no seeds, a non-corpus task or a non-cosine schedule.
    """
    from amemory.data import batching
    from amemory.data.corpus import prepare_corpus
    from amemory.models import transformer
    from amemory.train.tasks import model_config

    if kind not in KINDS:
        raise ValueError(f"reference_lm kind must be one of {KINDS}, got {kind!r}")
    if not seeds:
        raise ValueError("reference_lm.run needs at least one seed")
    if cfg.task != "lm" or cfg.data.kind != "corpus":
        raise ValueError("reference_lm trains the corpus LM only (task='lm', data.kind='corpus')")
    t0 = time.perf_counter()
    d = cfg.data
    data = prepare_corpus(d.corpus, tokenizer=d.tokenizer, vocab_size=int(d.vocab_size))
    mc = model_config(cfg, data.vocab_size)
    # The engine's initialisation key of seed s: the first half of split(PRNGKey(s))
    # (the second seeds its dropout stream), so both start from the same weights.
    keys = jnp.stack([jax.random.split(jax.random.PRNGKey(int(s)))[0] for s in seeds])
    graphdef, params = transformer.init(mc, keys)  # leaves [S, ...]
    one = jax.tree.map(lambda x: x[0], params)
    roles = transformer.param_roles(one)
    labels = jax.tree.map(lambda r: "hidden" if r in HIDDEN else "rest", roles)
    tx = make_tx(cfg, kind, labels)
    opt_state = jax.vmap(tx.init)(params)
    hidden_paths = [pr for pr in jax.tree_util.tree_flatten_with_path(roles)[0] if pr[1] in HIDDEN]

    def loss_fn(p, batch):
        logits = transformer.apply(graphdef, p, batch[:, :-1])  # (B, T, V)
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

    def step(p, s, batch):
        loss, g = jax.value_and_grad(loss_fn)(p, batch)
        u, s = tx.update(g, s, p)
        flat = dict(jax.tree_util.tree_flatten_with_path(u)[0])
        cv = {}
        for path, role in hidden_paths:
            cv.setdefault(role, []).append(neuron_norm_cv(flat[path]))
        cv = {r: jnp.mean(jnp.stack(v)) for r, v in cv.items()}
        return optax.apply_updates(p, u), s, loss, cv

    train_step = jax.jit(jax.vmap(step, in_axes=(0, 0, None)))
    eval_fn = jax.jit(jax.vmap(loss_fn, in_axes=(0, None)))
    val = list(batching.eval_batches(data.val_tokens, int(d.batch_size), int(d.seq_len),
                                     max_batches=int(d.eval_batches)))  # fmt: skip
    batches = iter(
        batching.token_loader(data.train_tokens, int(d.batch_size), int(d.seq_len), int(cfg.seed))
    )
    steps, every = int(cfg.steps), int(cfg.eval_every)
    eval_steps, val_loss, train_loss, cv_steps, cv_rows = [], [], [], [], []
    for t in range(1, steps + 1):
        params, opt_state, loss, cv = train_step(params, opt_state, jnp.asarray(next(batches)))
        train_loss.append(np.asarray(loss))
        if t % log_every == 0:
            cv_steps.append(t)
            cv_rows.append({r: np.asarray(v) for r, v in cv.items()})
        if t % every == 0 or t == steps:
            losses = np.mean([np.asarray(eval_fn(params, jnp.asarray(b))) for b in val], axis=0)
            eval_steps.append(t)
            val_loss.append(losses)
    return {
        "kind": kind,
        "seeds": list(seeds),
        "eval_steps": np.asarray(eval_steps, float),
        "val_loss": np.asarray(val_loss, float),  # (n, S)
        "train_loss": np.asarray(train_loss, float),  # (steps, S)
        "cv_steps": np.asarray(cv_steps, float),
        "neuron_cv": {r: np.stack([row[r] for row in cv_rows]) for r in (cv_rows or [{}])[0]},
        "wall_s": time.perf_counter() - t0,
    }


def cached_run(cfg: Any, kind: str, seeds: tuple[int, ...], cache_dir: Any) -> dict[str, Any]:
    """The JSON form of :func:`run`'s dict, stored in ``cache_dir`` and reused for the same
    (config, kind, seeds) and code (this file and ``amemory/``)."""
    import pathlib

    from experiments import common

    code = common.source_hash([__file__], common.amemory_version())
    key = common.config_hash(
        {"cfg": cfg.to_dict(), "kind": kind, "seeds": list(seeds), "code": code}
    )
    path = pathlib.Path(cache_dir) / f"reference-{kind}-{key}.json"
    if path.exists():
        return common.load_json(path)
    out = common.to_jsonable(run(cfg, kind, tuple(seeds)))
    common.save_json(path, out)
    return out
