"""What the training loop trains: model + data + loss + evaluation, per ``config.task``.

A task adapts one model family and its data to the loop's needs:

  init_params(key) -> params          one seed's parameters (key: raw ``[2] uint32``)
  roles(params) -> tree of str        role of every leaf (routing, update RMS)
  loss(params, batch, rng) -> (scalar, aux)  mean training loss of the batch (nats) and a
                                      dict of scalar metrics (logged as ``aux/<name>``)
  next_batch() -> numpy tree          this process's rows of the next global batch
  data_state() / restore_data(list)   input position, saved in checkpoints
  eval_stats(params, batch) -> dict   summable sums for one eval batch (jax, any mode)
  eval_batches() -> iterator          this process's rows of every eval batch
  finalize_eval(sums, params_host)    metrics dict from summed stats (host)
  spectrum_matrices(params_host)      {name: [..., m, n]} matrices for isotropy metrics
  tokens_per_step                     global tokens (LM) or queries (memory) per step

Tasks: ``LMTask`` (transformer on a tokenized corpus: per-frequency-bucket
validation loss), ``BiographyTask`` (transformer on synthetic biographies:
first-token accuracy per group), ``MemoryTask`` (one-layer associative memory on
a synthetic prior: per-class loss / accuracy, head / tail, gap).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from amemory.train.config import parse_roles


def check_batch(batch_size: int, data_shards: int, field: str) -> None:
    """Raise ValueError unless ``batch_size`` splits evenly over the data shards."""
    if batch_size % data_shards:
        raise ValueError(
            f"config.{field}={batch_size} must be divisible by the {data_shards} data shards "
            "(devices) of this parallel mode"
        )


# ----------------------------------------------------------------------------- language model


def model_config(config: Any, vocab_size: int, max_len: int | None = None):
    """``TransformerConfig`` from ``config.model`` (preset + non-None overrides).

    ``max_len`` defaults to ``config.data.seq_len``.
    """
    from amemory.models import transformer

    m = config.model
    over = {
        k: m[k]
        for k in ("d_model", "n_layers", "n_heads", "d_ff", "ffn", "norm", "position", "qk_norm",
                  "tied_head")
        if m[k] is not None
    }  # fmt: skip
    moe = m.moe
    return transformer.preset(
        m.preset,
        vocab_size=int(vocab_size),
        max_len=int(max_len if max_len is not None else config.data.seq_len),
        dropout=float(m.dropout),
        remat=bool(m.remat),
        dtype=m.dtype,
        param_dtype=m.param_dtype,
        attention=m.attention,
        mla=transformer.MLAConfig(
            kv_rank=m.mla.kv_rank, rope_dim=m.mla.rope_dim, q_rank=int(m.mla.q_rank)
        ),
        moe=transformer.MoEConfig(
            experts=int(moe.experts),
            top_k=int(moe.top_k),
            shared=int(moe.shared),
            d_expert=moe.d_expert,
            capacity_factor=float(moe.capacity_factor),
        ),
        **over,
    )


def _lm_loss(graphdef, params, tokens, targets, mask, rng, dropout: bool, lb_coef: float):
    """``(loss, aux)``: mean cross-entropy (nats per target token), plus ``lb_coef`` times
    the MoE load-balancing loss for MoE models (then aux holds ``ce_loss``,
    ``moe_lb_loss``, ``moe_lb_coef`` and ``moe_drop_fraction``; ``{}`` for dense models)."""
    from amemory.models import transformer

    logits, aux = transformer.apply(
        graphdef,
        params,
        tokens,
        rng=rng if dropout else None,
        deterministic=not dropout,
        with_aux=True,
    )  # (B, T, V)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)  # (B, T)
    if mask is None:
        ce = ce.mean()
    else:
        mask = mask.astype(ce.dtype)
        ce = (ce * mask).sum() / jnp.maximum(mask.sum(), 1.0)
    if "moe_lb_loss" not in aux:
        return ce, {}
    loss = ce + lb_coef * aux["moe_lb_loss"]
    return loss, {"ce_loss": ce, "moe_lb_coef": jnp.float32(lb_coef), **aux}


class _Transformer:
    """Shared transformer pieces of LMTask and BiographyTask."""

    def _setup_model(self, config: Any, vocab_size: int, max_len: int | None = None) -> None:
        from amemory.models import transformer

        self.model_config = model_config(config, vocab_size, max_len)
        self.graphdef = transformer._graphdef(self.model_config)
        self.dropout = float(config.model.dropout) > 0
        self.lb_coef = float(config.model.moe.lb_coef)
        self.spectrum_roles = parse_roles(config.spectrum_roles, "spectrum_roles")

    def init_params(self, key: jax.Array) -> Any:
        from amemory.models import transformer

        return transformer.init_params(self.model_config, key)

    def roles(self, params: Any) -> Any:
        from amemory.models import transformer

        return transformer.param_roles(params)

    def spectrum_matrices(self, params: Any) -> dict[str, np.ndarray]:
        """``{role: [n, ..., d_out, d_in]}`` for the requested roles (+ "vo", the value-output
        product); ``n`` runs over layers, and over layers x experts for routed experts."""
        from amemory.models import transformer

        want = set(self.spectrum_roles)
        with_vo = "o" in want and bool({"v", "v_up"} & want)
        mats = transformer.hidden_matrices(params, include_vo=with_vo)
        out: dict[str, list] = {}
        for name, m in mats.items():
            role = name.rsplit("/", 1)[-1]
            if role in want or role == "vo":
                m = np.asarray(m)
                stacked = role.startswith("expert_")  # [..., E, d_out, d_in]
                out.setdefault(role, []).extend(np.moveaxis(m, -3, 0) if stacked else [m])
        return {r: np.stack(v) for r, v in out.items()}


class LMTask(_Transformer):
    """Next-token language modelling on a tokenized corpus (``amemory.data.corpus``).

    Batches are int32 ``[B_local, T + 1]`` windows; the loss is the mean
    cross-entropy in nats per token. Evaluation: validation loss overall and per
    token-frequency bucket of the target token (buckets from training counts,
    ``corpus.frequency_buckets``; bucket 0 = most frequent).
    """

    kind = "lm"

    def __init__(self, config: Any, data_shards: int):
        from amemory.data import corpus as C

        d = config.data
        check_batch(int(d.batch_size), data_shards, "data.batch_size")
        self.data = C.prepare_corpus(d.corpus, tokenizer=d.tokenizer, vocab_size=int(d.vocab_size))
        self._setup_model(config, self.data.vocab_size)
        pi, pc = jax.process_index(), jax.process_count()
        self.batcher = C.Batcher(
            self.data.train_tokens, int(d.batch_size), int(d.seq_len), int(config.seed), pi, pc
        )
        self.batch_size, self.seq_len = int(d.batch_size), int(d.seq_len)
        self.eval_n = int(d.eval_batches)
        ids, labels = C.frequency_buckets(self.data.counts, int(d.n_buckets))
        self.bucket_ids = jnp.asarray(ids, jnp.int32)  # (V,)
        self.bucket_labels = list(labels)
        self.tokens_per_step = self.batch_size * self.seq_len
        # Fail now (before compiling) if the validation split cannot fill one batch.
        next(C.eval_batches(self.data.val_tokens, self.batch_size, self.seq_len, max_batches=1))

    def loss(self, params, batch, rng):
        return _lm_loss(
            self.graphdef, params, batch[:, :-1], batch[:, 1:], None, rng, self.dropout,
            self.lb_coef,
        )  # fmt: skip

    def next_batch(self) -> np.ndarray:
        return self.batcher.next()

    def data_state(self) -> list[int]:
        return [int(x) for x in self.batcher.state()]

    def restore_data(self, state: list[int]) -> None:
        self.batcher.restore(np.asarray(state, np.int64))

    def eval_batches(self) -> Iterator[np.ndarray]:
        from amemory.data import corpus as C

        return C.eval_batches(
            self.data.val_tokens,
            self.batch_size,
            self.seq_len,
            max_batches=self.eval_n,
            process_index=jax.process_index(),
            process_count=jax.process_count(),
        )

    def eval_stats(self, params, batch) -> dict[str, jax.Array]:
        from amemory.models import transformer

        tokens, targets = batch[:, :-1], batch[:, 1:]
        logits = transformer.apply(self.graphdef, params, tokens)  # (B, T, V)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)  # (B, T)
        b = self.bucket_ids[targets].ravel()
        n = len(self.bucket_labels)
        return {
            "loss_sum": jax.ops.segment_sum(ce.ravel(), b, num_segments=n),  # (n,)
            "count": jax.ops.segment_sum(jnp.ones_like(ce.ravel()), b, num_segments=n),
        }

    def finalize_eval(self, sums: dict[str, np.ndarray], params_host: Any = None) -> dict:
        ls, ct = np.asarray(sums["loss_sum"], np.float64), np.asarray(sums["count"], np.float64)
        out: dict[str, Any] = {"loss": ls.sum(-1) / np.maximum(ct.sum(-1), 1)}
        for i in range(len(self.bucket_labels)):
            out[f"loss/bucket_{i}"] = np.where(
                ct[..., i] > 0, ls[..., i] / np.maximum(ct[..., i], 1), np.nan
            )
            out[f"tokens/bucket_{i}"] = ct[..., i]
        out["bucket_labels"] = self.bucket_labels
        return out


# ----------------------------------------------------------------------------- memory


class MemoryTask:
    """One-layer associative memory ``softmax(Et^T W E_k)`` (``amemory.models.memory``).

    Parameters ``{"W": [d, d]}``, ``W_0 = 0`` for every seed (papers.md A.1).
    ``batch_size = 0``: the exact population loss (the batch is a placeholder);
    ``batch_size = B``: ``B`` (query, answer) pairs per step from
    ``memory_tasks.sample_pairs`` with key ``fold_in(PRNGKey(seed), draw)``. In a
    multi-seed run with sampling, each seed draws its own pairs (``seed_batched``:
    batches are ``[S, B]``), since with ``W_0 = 0`` the samples are the only randomness.
    Evaluation is exact (population quantities from W).
    """

    kind = "memory"

    def __init__(self, config: Any, data_shards: int):
        from amemory.data import frequencies as F
        from amemory.models import memory as M

        mc, pc = config.memory, config.prior
        K = int(mc.K)
        d = int(mc.d) if mc.d is not None else K
        key = jax.random.PRNGKey(int(mc.embedding_seed))
        emb = mc.embeddings
        if emb in ("decoupled", "coupled_rotation") and d != K:
            raise ValueError(f"config.memory.d={d} must equal memory.K={K} for embeddings={emb!r}")
        if emb == "decoupled":
            E, Et = M.decoupled(K)
        elif emb == "coupled_rotation":
            if K % 3:
                raise ValueError(f"config.memory.K={K} must be divisible by 3 for coupled_rotation")
            E, Et = M.coupled_rotation(K)
        elif emb == "random_orthonormal":
            E, Et = M.random_orthonormal(K, d, key)
        elif emb == "gaussian":
            E, Et = M.gaussian(K, d, key)
        elif emb == "coherent":
            E, Et = M.coherent(K, d, float(mc.coherence), key)
        else:
            raise ValueError(
                f"config.memory.embeddings={emb!r}; allowed values: ('decoupled', "
                "'coupled_rotation', 'random_orthonormal', 'gaussian', 'coherent')"
            )
        self.E, self.Et, self.K, self.d = jnp.asarray(E), jnp.asarray(Et), K, d
        if pc.kind == "two_level":
            self.prior = F.two_level(K, float(pc.alpha), float(pc.beta))
            head = F.two_level_split(K, float(pc.beta))
            self.head = np.arange(K) < head
        else:
            if pc.kind == "power_law":
                self.prior = F.power_law(K, float(pc.exponent))
            elif pc.kind == "hierarchical":
                M_ = int(pc.groups)
                if M_ < 1 or K % M_:
                    raise ValueError(f"config.prior.groups={M_} must divide memory.K={K}")
                self.prior = F.hierarchical(M_, K // M_, float(pc.exponent))
            else:
                raise ValueError(
                    f"config.prior.kind={pc.kind!r}; allowed: ('two_level', 'power_law', "
                    "'hierarchical')"
                )
            n_head = max(1, int(round(float(pc.head_fraction) * K)))
            order = np.argsort(-self.prior, kind="stable")
            self.head = np.zeros(K, bool)
            self.head[order[:n_head]] = True
        self.prior_j = jnp.asarray(self.prior, jnp.float32)
        self.noise = float(config.noise)
        self.batch_size = int(config.batch_size)
        self.seed = int(config.seed)
        self.seeds = [int(s) for s in config.seeds] if config.seeds else [self.seed]
        self.seed_batched = bool(config.seeds) and self.batch_size > 0
        self.data_shards = data_shards
        if self.batch_size:
            check_batch(self.batch_size, data_shards, "batch_size")
        self._draws = 0
        self._eval_fn = None
        self.tokens_per_step = self.batch_size if self.batch_size else K
        self.spectrum_roles = ("W",)

    def init_params(self, key: jax.Array) -> Any:
        del key  # W_0 = 0 (papers.md A.1)
        return {"W": jnp.zeros((self.d, self.d), jnp.float32)}

    def roles(self, params: Any) -> Any:
        # A role from amemory.optim.ROLES, so the optim routing resolves it: W [d_out, d_in]
        # maps a key embedding into the space the output embeddings Et read, the place of an
        # FFN output matrix. Metrics: update_rms/w_out; the spectrum stays "spectrum/W".
        return jax.tree.map(lambda _: "w_out", params)

    def loss(self, params, batch, rng):
        from amemory.models import memory as M

        if self.batch_size == 0:
            return M.population_loss(params["W"], self.E, self.Et, self.prior_j, self.noise), {}
        return M.sampled_loss(params["W"], self.E, self.Et, batch["q"], batch["a"]), {}

    def next_batch(self) -> Any:
        from amemory.data import memory_tasks

        n, i = jax.process_count(), jax.process_index()
        if self.batch_size == 0:
            rows = self.data_shards // n
            self._draws += 1
            return {"q": np.zeros((rows,), np.int32), "a": np.zeros((rows,), np.int32)}
        per = self.batch_size // n
        sl = slice(i * per, (i + 1) * per)
        out = []
        for seed in self.seeds if self.seed_batched else [self.seed]:
            key = jax.random.fold_in(jax.random.PRNGKey(seed), self._draws)
            q, a = memory_tasks.sample_pairs(key, self.prior, self.batch_size, self.noise)
            out.append({"q": np.asarray(q)[sl], "a": np.asarray(a)[sl]})
        self._draws += 1
        if not self.seed_batched:
            return out[0]
        return {k: np.stack([o[k] for o in out]) for k in ("q", "a")}  # (S, B_local)

    def data_state(self) -> list[int]:
        return [self._draws]

    def restore_data(self, state: list[int]) -> None:
        self._draws = int(state[0])

    def spectrum_matrices(self, params: Any) -> dict[str, np.ndarray]:
        return {"W": np.asarray(params["W"])[None]}

    def eval_host(self, params: Any) -> dict:
        """Exact per-class metrics of one seed's memory ``params["W"] [d, d]`` (host)."""
        from amemory.models import memory as M

        if self._eval_fn is None:

            def arrays(W):
                logits = M.logits(W, self.E, self.Et)  # (K, K): row k = query k
                return (
                    M.per_class_loss(W, self.E, self.Et, self.noise),  # (K,)
                    jnp.argmax(logits, axis=-1) == jnp.arange(self.K),  # (K,)
                    M.correct_probabilities(W, self.E, self.Et),  # (K,)
                )

            self._eval_fn = jax.jit(arrays)
        W = jnp.asarray(params["W"])
        per_loss, correct, probs = (np.asarray(x, np.float64) for x in self._eval_fn(W))
        p, h = self.prior, self.head
        t = ~h

        def wmean(x, mask):
            return float((p[mask] * x[mask]).sum() / p[mask].sum()) if mask.any() else float("nan")

        return {
            "loss": float(p @ per_loss),
            "acc": float(p @ correct),
            "loss/head": wmean(per_loss, h),
            "loss/tail": wmean(per_loss, t),
            "acc/head": float(correct[h].mean()) if h.any() else float("nan"),
            "acc/tail": float(correct[t].mean()) if t.any() else float("nan"),
            "correct_prob/min": float(probs.min()),
            "gap": float(probs.max() - probs.min()),
            "per_class_loss": per_loss.tolist(),
            "per_class_prob": probs.tolist(),
        }


def build(config: Any, data_shards: int):
    """The task for ``config`` (``task`` and ``data.kind``). Loads data; compiles nothing.

    Raises:
      ValueError: for bad data/model settings (names the field).
    """
    if config.task == "memory":
        return MemoryTask(config, data_shards)
    if config.data.kind == "biographies":
        return BiographyTask(config, data_shards)
    return LMTask(config, data_shards)


class BiographyTask(_Transformer):
    """Transformer on synthetic biographies (``amemory.data.biographies``, papers.md A.3).

    Batches are ``{"tokens": int32 [B_local, T], "mask": float32 [B_local, T]}`` rows;
    the loss is the masked mean cross-entropy (nats per target token). Evaluation:
    first-token accuracy (FTA) per group g = 0..m on a per-group subset of the QA
    of all individuals (``data.biographies.eval_per_group`` items per group).
    """

    kind = "biographies"

    def __init__(self, config: Any, data_shards: int):
        from amemory.data import biographies as B

        d = config.data
        check_batch(int(d.batch_size), data_shards, "data.batch_size")
        bc = d.biographies
        self.data = B.make_biographies(B.BiographyConfig(m=int(bc.m), seed=int(bc.seed)))
        self.eval_set = self.data.eval.per_group(int(bc.eval_per_group), seed=int(bc.seed))
        T = self.data.seq_len
        max_len = max(T - 1, int(self.eval_set.prompts.shape[1]))
        self._setup_model(config, self.data.vocab_size, max_len=max_len)
        self.batcher = self.data.batcher(
            int(d.batch_size), int(config.seed), jax.process_index(), jax.process_count()
        )
        self.tokens_per_step = int(d.batch_size) * (T - 1)
        self._logits = None

    def loss(self, params, batch, rng):
        tok, mask = batch["tokens"], batch["mask"]
        return _lm_loss(
            self.graphdef, params, tok[:, :-1], tok[:, 1:], mask[:, 1:], rng, self.dropout,
            self.lb_coef,
        )  # fmt: skip

    def next_batch(self) -> dict[str, np.ndarray]:
        tokens, mask = self.batcher.next()
        return {"tokens": tokens, "mask": mask}

    def data_state(self) -> list[int]:
        return [int(x) for x in self.batcher.state()]

    def restore_data(self, state: list[int]) -> None:
        self.batcher.restore(np.asarray(state, np.int64))

    def eval_host(self, params: Any) -> dict:
        """FTA per group (and over all evaluated questions) of one seed's params (host)."""
        from amemory.data import biographies as B
        from amemory.models import transformer

        if self._logits is None:
            self._logits = jax.jit(lambda p, x: transformer.apply(self.graphdef, p, x))
        p = jax.device_put(params)
        preds = B.first_token_predictions(lambda x: self._logits(p, x), self.eval_set)
        per_group = B.first_token_accuracy(preds, self.eval_set)
        out: dict[str, Any] = {"fta": float(np.mean(preds == self.eval_set.answer_first))}
        out.update({f"fta/group_{g}": v for g, v in per_group.items()})
        return out
