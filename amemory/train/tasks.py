"""What the training loop trains: model + data + loss + evaluation, behind one interface.

:class:`Task` (a ``typing.Protocol``) is everything the loop needs from a model family;
the loop never asks which task it runs. :func:`build` picks :class:`LMTask` (a tokenized
corpus), :class:`BiographyTask` (synthetic biographies, arXiv 2509.26030) or
:class:`~amemory.train.memory_task.MemoryTask` (the one-layer associative memory) from
``config.task`` / ``config.data.kind``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax

from amemory.models.roles import role_of
from amemory.optim.routing import parse_roles
from amemory.train import parallel
from amemory.train.engine import LOSS_WEIGHT


class Task(Protocol):
    """The interface between a model family and the training loop.

    Attributes:
      kind: name written to records and the summary (``"lm"``, ``"biographies"``, ...).
      tokens_per_step: global tokens (LM) or queries (memory) consumed per step.
      muon_roles: roles trained by ``optimizer.name``; None = ``optimizer.muon_roles``.

    Optional: ``width`` (the model width ``optimizer.base_width`` scales by),
    ``sample_batch(rng) -> batch`` (a batch drawn on the device when ``train_input`` is
    None), ``head_view`` (QK-Clip).
    """

    kind: str
    tokens_per_step: int
    muon_roles: tuple[str, ...] | None

    def init_params(self, key: jax.Array) -> Any:
        """One seed's parameters from a raw key ``[2] uint32`` (traceable; no host work)."""
        ...

    def roles(self, params: Any) -> Any:
        """Same-structure tree of role strings (``amemory.models.roles.ROLES``)."""
        ...

    def matrix_axes(self, path: Any, leaf: Any) -> tuple[Any, Any] | None:
        """``(fan_in_axes, fan_out_axes)`` of a leaf routed to Muon (other axes: batch), or
        None when the leaf is not a matrix (``amemory.optim``'s callable ``matrix_axes``)."""
        ...

    def loss(self, params: Any, batch: Any, rng: jax.Array) -> tuple[jax.Array, dict]:
        """``(mean loss in nats, aux)`` of one step (or microbatch); ``aux`` maps names to
        scalar metrics (averaged over the log interval like the loss, written as
        ``aux/<name>``), and holds ``engine.LOSS_WEIGHT`` where the mean divides by a
        count that varies between batches (masked tokens)."""
        ...

    def train_input(self) -> Iterator[Any] | None:
        """This process's training batches (numpy trees; rows ``[B / P, ...]``) from an
        iterator with ``get_state() -> bytes`` / ``set_state(bytes)`` (a Grain
        ``DataLoaderIterator``), or None when the loss makes its own data on the device."""
        ...

    def evaluate(self, params: Any, put_batch: Callable[[Any], Any]) -> dict[str, Any]:
        """Evaluation metrics (host values) of one seed's ``params`` (device arrays, any
        sharding); ``put_batch`` places this process's rows of a global eval batch."""
        ...

    def spectrum_matrices(self, params: Any) -> dict[str, np.ndarray]:
        """``{name: [..., m, n]}`` matrices for isotropy metrics, from host ``params``."""
        ...

    def checkpoint_meta(self) -> dict[str, Any]:
        """Config fields that fix the parameter layout, stored in checkpoints and compared
        on resume (a mismatch is a ValueError naming the field)."""
        ...


#: ``config.task`` values: "lm" (LMTask, or BiographyTask for ``data.kind="biographies"``),
#: "memory" (MemoryTask).
TASKS = ("lm", "memory")


def build(config: Any, place: parallel.Placement) -> Task:
    """The task for ``config`` (``task`` and ``data.kind``). Loads data; compiles nothing.

    Raises:
      ValueError: for bad data/model settings (names the field).
    """
    if config.task == "memory":
        from amemory.train.memory_task import MemoryTask

        return MemoryTask(config, place)
    if config.data.kind == "biographies":
        return BiographyTask(config, place)
    return LMTask(config, place)


def model_config(config: Any, vocab_size: int, max_len: int | None = None):
    """``TransformerConfig`` from ``config.model``, translated once: the preset, then every
    field that is not None (``mla`` / ``moe`` as ``MLAConfig`` / ``MoEConfig``;
    ``moe.lb_coef`` is the loss's; ``vocab_size`` at least the data's). ``max_len``
    defaults to ``config.data.seq_len``.

    Raises:
      ValueError: a field ``TransformerConfig`` rejects, re-raised naming ``config.model``.
    """
    from amemory.models import transformer

    m = config.model.to_dict()
    mla, moe, vocab = m.pop("mla"), m.pop("moe"), m.pop("vocab_size", None)
    if vocab is not None and vocab < vocab_size:
        raise ValueError(f"config.model.vocab_size={vocab} must be None or >= {vocab_size}")
    moe.pop("lb_coef", None)
    over = {k: v for k, v in m.items() if v is not None and k != "preset"}
    max_len = int(max_len if max_len is not None else config.data.seq_len)
    try:
        return transformer.preset(
            m["preset"], vocab_size=int(vocab or vocab_size), max_len=max_len,
            mla=transformer.MLAConfig(**mla), moe=transformer.MoEConfig(**moe), **over,
        )  # fmt: skip
    except (TypeError, ValueError) as e:
        raise ValueError(f"config.model: {e}") from None


def _lm_loss(graphdef, params, tokens, targets, mask, rng, dropout: bool, lb_coef: float):
    """``(loss, aux)``: mean cross-entropy (nats per target token), plus ``lb_coef`` times
    the MoE load-balancing loss for MoE models (then aux holds ``ce_loss``,
    ``moe_lb_loss``, ``moe_lb_coef`` and ``moe_drop_fraction``), and always the attention's
    ``max_logit [L, H]``."""
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
    # the count a masked mean divides by, so that microbatches are weighted by it
    weight = {} if mask is None else {LOSS_WEIGHT: mask.sum()}
    if "moe_lb_loss" not in aux:
        return ce, {"max_logit": aux["max_logit"], **weight}
    loss = ce + lb_coef * aux["moe_lb_loss"]
    return loss, {"ce_loss": ce, "moe_lb_coef": jnp.float32(lb_coef), **aux, **weight}


class _Transformer:
    """Shared transformer pieces of LMTask and BiographyTask."""

    muon_roles = None  # config.optimizer.muon_roles

    def _setup_model(self, config: Any, vocab_size: int, max_len: int | None = None) -> None:
        from amemory.models import transformer

        self.model_config = model_config(config, vocab_size, max_len)
        self.graphdef = transformer._graphdef(self.model_config)
        self.dropout = float(config.model.dropout) > 0
        self.lb_coef = float(config.model.moe.lb_coef)
        self.per_head = ()  # roles orthogonalised per head
        if config.optimizer.get("per_head", False):
            spec = config.optimizer.get("per_head_roles", "all")
            self.per_head = parse_roles(spec, role_of, "optimizer.per_head_roles")
        mc = self.model_config
        if float(config.optimizer.get("qk_clip", 0.0)) > 0 and (mc.qk_norm or mc.use_bias):
            raise ValueError("config.optimizer.qk_clip needs model.qk_norm and use_bias off")
        self.spectrum_roles = parse_roles(config.spectrum_roles, role_of, "spectrum_roles")
        self.width = mc.d_model  # what optimizer.base_width scales by
        self.head_scale = 1.0  # muP (Tensor Programs V, Table 3): output init var 1/fan_in^2
        if config.optimizer.get("parametrization", "sp") == "mup":
            from amemory.train.optimizers import width_ratio

            if mc.tied_head:
                raise ValueError(
                    "config.optimizer.parametrization='mup' scales the head apart from the "
                    "embedding: set model.tied_head=false"
                )
            self.head_scale = width_ratio(config.optimizer, self.width) ** 0.5

    def init_params(self, key: jax.Array) -> Any:
        from amemory.models import transformer

        params = transformer.init_params(self.model_config, key)
        if self.head_scale == 1.0:
            return params
        roles = transformer.param_roles(params)
        return jax.tree.map(lambda p, r: p * self.head_scale if r == "head" else p, params, roles)

    def roles(self, params: Any) -> Any:
        from amemory.models import transformer

        return transformer.param_roles(params)

    def matrix_axes(self, path: Any, leaf: Any) -> Any:
        """Per layer and expert (``roles.matrix_axes``), per head with ``optimizer.per_head``."""
        from amemory.models import matrices, roles

        per_head = self.per_head and matrices.per_head_axes(self.model_config, self.per_head)
        return (per_head or roles.matrix_axes)(path, leaf)

    @property
    def head_view(self) -> Any:
        """The model's head layout, for QK-Clip (``amemory.models.matrices.head_view``)."""
        from amemory.models.matrices import head_view

        return head_view(self.model_config)

    def checkpoint_meta(self) -> dict[str, Any]:
        return {"model.scan_layers": bool(self.model_config.scan_layers)}

    def train_input(self) -> Iterator[Any]:
        return iter(self.loader)  # Grain: windows (LMTask) or {"tokens", "mask"} rows

    def spectrum_matrices(self, params: Any) -> dict[str, np.ndarray]:
        """``{role: [n, ..., d_out, d_in]}`` for the requested roles (+ "vo", the value-output
        product); ``n`` runs over layers, and over layers x experts for routed experts."""
        from amemory.models import transformer

        want = set(self.spectrum_roles)
        with_vo = "o" in want and bool({"v", "v_up"} & want)
        mats = transformer.hidden_matrices(params, include_vo=with_vo, config=self.model_config)
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

    Batches are int32 ``[B / P, T + 1]`` windows from a Grain loader
    (``amemory.data.batching.token_loader``); the loss is the mean cross-entropy in nats
    per token. Evaluation: validation loss overall and per token-frequency bucket of the
    target token (buckets from training counts, ``Corpus.buckets``; bucket 0 =
    most frequent), summed on the device over ``data.eval_batches`` batches.
    """

    kind = "lm"

    def __init__(self, config: Any, place: parallel.Placement):
        from amemory.data import batching
        from amemory.data import corpus as C

        d = config.data
        k = int(config.get("gradient_accumulation_steps", 1))
        parallel.check_batch(int(d.batch_size), place.data_shards, "data.batch_size", k)
        self.data = C.prepare_corpus(d.corpus, tokenizer=d.tokenizer, vocab_size=int(d.vocab_size))
        self._setup_model(config, self.data.vocab_size)
        self.batch_size, self.seq_len = int(d.batch_size), int(d.seq_len)
        self.eval_batch_size = self._eval_size(int(d.get("eval_batch_size", 0)), place.data_shards)
        self.loader = batching.token_loader(
            self.data.train_tokens, self.batch_size, self.seq_len, int(config.seed)
        )
        self.eval_n = int(d.eval_batches)
        ids, labels = self.data.buckets(int(d.n_buckets))
        self.bucket_ids = np.asarray(ids, np.int32)  # (V,)
        self.bucket_labels = list(labels)
        self.tokens_per_step = self.batch_size * self.seq_len
        # Fail now (before compiling) if the validation split cannot fill one batch.
        next(self._eval_batches(max_batches=1))
        self._stats = jax.jit(self._eval_stats)

    def _eval_size(self, asked: int, shards: int) -> int:
        """``data.eval_batch_size``, or for 0 the training batch size clipped to the windows
        the validation split holds (a multiple of the data shards; a note says so)."""
        if asked:
            parallel.check_batch(asked, shards, "data.eval_batch_size")
            return asked
        windows = (int(self.data.val_tokens.shape[0]) - 1) // self.seq_len
        size = min(self.batch_size, windows // shards * shards)
        if 0 < size < self.batch_size and jax.process_index() == 0:
            sys.stderr.write(
                f"amemory: note: data.eval_batch_size={size}: the validation split holds "
                f"{windows} windows of {self.seq_len + 1} tokens (< data.batch_size)\n"
            )
        return size or self.batch_size  # 0: no batch fits; eval_batches says so

    def loss(self, params, batch, rng):
        tokens, targets = batch[:, :-1], batch[:, 1:]  # (B, T)
        return _lm_loss(
            self.graphdef, params, tokens, targets, None, rng, self.dropout, self.lb_coef
        )

    def _eval_batches(self, max_batches: int | None = None) -> Iterator[np.ndarray]:
        from amemory.data import batching

        return batching.eval_batches(
            self.data.val_tokens, self.eval_batch_size, self.seq_len,
            max_batches=max_batches or self.eval_n,
            process_index=jax.process_index(), process_count=jax.process_count(),
        )  # fmt: skip

    def _eval_stats(self, params, batch, sums):
        from amemory.models import transformer

        tokens, targets = batch[:, :-1], batch[:, 1:]
        logits = transformer.apply(self.graphdef, params, tokens)  # (B, T, V)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)  # (B, T)
        b = jnp.asarray(self.bucket_ids)[targets].ravel()
        n = len(self.bucket_labels)
        return {
            "loss_sum": sums["loss_sum"] + jax.ops.segment_sum(ce.ravel(), b, num_segments=n),
            "count": sums["count"] + jax.ops.segment_sum(jnp.ones_like(ce.ravel()), b, n),
        }

    def evaluate(self, params, put_batch) -> dict[str, Any]:
        n = len(self.bucket_labels)
        sums = {"loss_sum": jnp.zeros(n), "count": jnp.zeros(n)}  # summed on the device
        for local in self._eval_batches():
            sums = self._stats(params, put_batch(local), sums)
        sums = parallel.to_host(sums)
        ls, ct = np.asarray(sums["loss_sum"], np.float64), np.asarray(sums["count"], np.float64)
        out: dict[str, Any] = {"loss": float(ls.sum() / max(ct.sum(), 1))}
        for i in range(n):
            out[f"loss/bucket_{i}"] = float(ls[i] / ct[i]) if ct[i] > 0 else float("nan")
            out[f"tokens/bucket_{i}"] = float(ct[i])
        out["bucket_labels"] = self.bucket_labels
        return out


class BiographyTask(_Transformer):
    """Transformer on synthetic biographies (``amemory.data.biographies``; arXiv 2509.26030).

    Batches are ``{"tokens": int32 [B / P, T], "mask": float32 [B / P, T]}`` rows from a
    Grain loader; the loss is the masked mean cross-entropy (nats per target token).
    Evaluation: first-token accuracy (FTA) per group g = 0..m on a per-group subset of the
    QA of all individuals (``data.biographies.eval_per_group`` items per group).
    """

    kind = "biographies"

    def __init__(self, config: Any, place: parallel.Placement):
        from amemory.data import biographies as B
        from amemory.models import transformer

        d = config.data
        k = int(config.get("gradient_accumulation_steps", 1))
        parallel.check_batch(int(d.batch_size), place.data_shards, "data.batch_size", k)
        bc = d.biographies
        zipf = float(bc.get("zipf", 1.0))  # absent in older configs: the paper's law
        self.data = B.make_biographies(B.BiographyConfig(m=int(bc.m), seed=int(bc.seed), zipf=zipf))
        self.eval_set = self.data.eval.per_group(int(bc.eval_per_group), seed=int(bc.seed))
        T = self.data.seq_len
        max_len = max(T - 1, int(self.eval_set.prompts.shape[1]))
        self._setup_model(config, self.data.vocab_size, max_len=max_len)
        self.loader = self.data.loader(int(d.batch_size), int(config.seed))
        self.tokens_per_step = int(d.batch_size) * (T - 1)
        self._logits = jax.jit(functools.partial(transformer.apply, self.graphdef))

    def loss(self, params, batch, rng):
        tok, mask = batch["tokens"], batch["mask"]  # (B, T)
        return _lm_loss(
            self.graphdef, params, tok[:, :-1], tok[:, 1:], mask[:, 1:], rng, self.dropout,
            self.lb_coef,
        )  # fmt: skip

    def evaluate(self, params, put_batch) -> dict[str, Any]:
        """FTA per group (and over all evaluated questions) of one seed's params (host)."""
        from amemory.data import biography_eval as B

        del put_batch  # every process answers every question with its full copy
        p = jax.device_put(parallel.to_host(params), jax.local_devices()[0])
        preds = B.first_token_predictions(lambda x: self._logits(p, x), self.eval_set)
        per_group = B.first_token_accuracy(preds, self.eval_set)
        out: dict[str, Any] = {"fta": float(np.mean(preds == self.eval_set.answer_first))}
        out.update({f"fta/group_{g}": v for g, v in per_group.items()})
        return out
