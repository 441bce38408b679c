"""The one-layer associative memory as a training task (``amemory.train.tasks.Task``)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from amemory.data import frequencies, memory_tasks
from amemory.models import memory
from amemory.train import parallel

#: ``config.memory.embeddings`` values (``amemory.models.memory`` builders).
EMBEDDINGS = ("decoupled", "coupled_rotation", "random_orthonormal", "gaussian", "coherent")
#: ``config.prior.kind`` values (``amemory.data.frequencies`` priors).
PRIORS = ("two_level", "power_law", "hierarchical")


class MemoryTask:
    """One-layer associative memory ``softmax(Et^T W E_k)`` (``amemory.models.memory``).

    Parameters ``{"W": [d_out, d_in]}``, ``W_0 = 0`` for every seed (docs/science.md, memory
    model); ``W`` is trained by ``optimizer.name`` whatever ``optimizer.muon_roles`` says, as the
    matrix ``[d_out, d_in]`` (``matrix_axes=(1, 0)``). ``batch_size = 0``: the exact
    population loss (no data); ``batch_size = B``: ``B`` (query, answer) pairs per step,
    sampled on the device (``memory_tasks.make_sampler``) from the step's key, so each
    seed of a multi-seed run draws its own pairs and a resumed run draws the same ones
    (the key is part of the checkpointed state). Evaluation is exact (population quantities).
    """

    kind = "memory"
    muon_roles = ("w_out",)

    def __init__(self, config: Any, place: parallel.Placement):
        mc, pc = config.memory, config.prior
        K = int(mc.K)
        d = int(mc.d) if mc.d is not None else K
        key = jax.random.PRNGKey(int(mc.embedding_seed))
        emb = mc.embeddings
        if emb not in EMBEDDINGS:
            raise ValueError(f"config.memory.embeddings={emb!r}; allowed values: {EMBEDDINGS}")
        if emb in ("decoupled", "coupled_rotation") and d != K:
            raise ValueError(f"config.memory.d={d} must equal memory.K={K} for embeddings={emb!r}")
        if emb == "coupled_rotation" and K % 3:
            raise ValueError(f"config.memory.K={K} must be divisible by 3 for coupled_rotation")
        if emb in ("decoupled", "coupled_rotation"):
            E, Et = getattr(memory, emb)(K)
        elif emb == "coherent":
            E, Et = memory.coherent(K, d, float(mc.coherence), key)
        else:
            E, Et = getattr(memory, emb)(K, d, key)
        self.E, self.Et, self.K, self.d = jnp.asarray(E), jnp.asarray(Et), K, d
        if pc.kind == "two_level":
            self.prior = frequencies.two_level(K, float(pc.alpha), float(pc.beta))
            self.head = np.arange(K) < frequencies.two_level_split(K, float(pc.beta))
        else:
            if pc.kind == "power_law":
                self.prior = frequencies.power_law(K, float(pc.exponent))
            elif pc.kind == "hierarchical":
                groups = int(pc.groups)
                if groups < 1 or K % groups:
                    raise ValueError(f"config.prior.groups={groups} must divide memory.K={K}")
                self.prior = frequencies.hierarchical(groups, K // groups, float(pc.exponent))
            else:
                raise ValueError(f"config.prior.kind={pc.kind!r}; allowed values: {PRIORS}")
            n_head = max(1, int(round(float(pc.head_fraction) * K)))
            order = np.argsort(-self.prior, kind="stable")
            self.head = np.zeros(K, bool)
            self.head[order[:n_head]] = True
        self.prior_j = jnp.asarray(self.prior, jnp.float32)
        self.noise = float(config.noise)
        self.batch_size = int(config.batch_size)
        self._sample = None
        k = int(config.get("gradient_accumulation_steps", 1))
        if self.batch_size:
            parallel.check_batch(self.batch_size, place.data_shards, "batch_size", k)
            self._sample = memory_tasks.make_sampler(self.prior, self.batch_size, self.noise)
        elif k > 1:
            raise ValueError(
                f"config.gradient_accumulation_steps={k} needs sampled pairs (config.batch_size "
                "> 0); batch_size=0 trains on the exact population loss"
            )
        self._eval_fn = None
        self.tokens_per_step = self.batch_size if self.batch_size else K
        self.width = d  # what optimizer.base_width scales by
        self.spectrum_roles = ("W",)

    def init_params(self, key: jax.Array) -> Any:
        del key  # W_0 = 0 (docs/science.md, memory model)
        return {"W": jnp.zeros((self.d, self.d), jnp.float32)}

    def roles(self, params: Any) -> Any:
        # A role from amemory.models.roles.ROLES, so the optim routing resolves it: W [d_out, d_in]
        # maps a key embedding into the space the output embeddings Et read, the place of an
        # FFN output matrix. Metrics: update_rms/w_out; the spectrum stays "spectrum/W".
        return jax.tree.map(lambda _: "w_out", params)

    def matrix_axes(self, path: Any, leaf: Any) -> tuple[int, int]:
        del path, leaf
        return (1, 0)  # W is [d_out, d_in]: fan_in is axis 1

    def checkpoint_meta(self) -> dict[str, Any]:
        return {}

    def sample_batch(self, rng: jax.Array) -> tuple[jax.Array, jax.Array] | None:
        """The step's ``(queries [B], answers [B])`` drawn on the device from the step's key
        (None for the population loss); the engine calls it, then splits the pairs into
        microbatches under gradient accumulation."""
        return None if self._sample is None else self._sample(rng)

    def loss(self, params, batch, rng):
        del rng  # the pairs come from sample_batch
        if batch is None:
            loss = memory.population_loss(params["W"], self.E, self.Et, self.prior_j, self.noise)
        else:
            q, a = batch  # (B,), (B,)
            loss = memory.sampled_loss(params["W"], self.E, self.Et, q, a)
        return loss, {}

    def train_input(self) -> None:
        return None

    def spectrum_matrices(self, params: Any) -> dict[str, np.ndarray]:
        return {"W": np.asarray(params["W"])[None]}

    def evaluate(self, params: Any, put_batch: Any = None) -> dict:
        """Exact per-class metrics of one seed's memory ``params["W"] [d, d]``."""
        del put_batch
        if self._eval_fn is None:

            def arrays(W):
                logits = memory.logits(W, self.E, self.Et)  # (K, K): row k = query k
                return (
                    memory.per_class_loss(W, self.E, self.Et, self.noise),  # (K,)
                    jnp.argmax(logits, axis=-1) == jnp.arange(self.K),  # (K,)
                    memory.correct_probabilities(W, self.E, self.Et),  # (K,)
                )

            self._eval_fn = jax.jit(arrays)
        W = jax.device_put(parallel.to_host(params)["W"], jax.local_devices()[0])
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
