"""CONTRIBUTING.md's architecture recipe, followed for a toy attention variant.

The variant (muP attention: logits scaled by ``1 / d_h`` instead of ``1 / sqrt(d_h)``,
Yang et al., arXiv 2203.03466, Sec. 3) is added the way the recipe says, touching only
the places it names: a class with ``__call__`` / ``cache_spec`` / ``extend`` registered in
``attention.ATTENTIONS``, configured through ``TransformerConfig`` fields (here with one
K/V head, ``n_kv_heads=1``: multi-query), its roles read by ``roles.role_of`` and its head
layout by ``matrices.head_view``. It then trains through ``amemory train`` with per-head
Muon, QK-Clip and spectra on, and decodes with its KV cache.
"""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
from train_helpers import lm_config

from amemory.models import attention, decode, matrices
from amemory.models import transformer as T
from amemory.models.layers import attend, causal_mask
from amemory.train import run


class MupAttention(attention.Attention):
    """Recipe step 1: the variant's class (q, k, v, o kernels: the roles it reuses)."""

    def __call__(self, x):
        b, t, _ = x.shape
        q, k, v = self._qkv(x, None)
        y, top = attend(q, *self._grouped(k, v), causal_mask(t, t), 1.0 / self.config.head_dim)
        return self.o(y.reshape(b, t, self.config.d_model)), top

    def extend(self, x, cache, pos):
        b, s, _ = x.shape
        q, k, v = self._qkv(x, pos + jnp.arange(s))
        cache = attention._write(cache, {"k": k, "v": v}, pos)
        mask = causal_mask(s, cache["k"].shape[1], pos)
        y, _ = attend(q, *self._grouped(cache["k"], cache["v"]), mask, 1.0 / self.config.head_dim)
        return self.o(y.reshape(b, s, self.config.d_model)), cache


def test_an_attention_variant_added_by_the_recipe_trains_and_decodes(corpus, tmp_path, monkeypatch):
    monkeypatch.setitem(attention.ATTENTIONS, "toy_mup", MupAttention)  # recipe step 1
    extra = {
        "model.attention": "toy_mup",  # recipe step 2: TransformerConfig fields
        "model.n_kv_heads": 1,
        "optimizer.per_head": "true",
        "optimizer.qk_clip": 3.0,
        "spectrum_every": 1,
        "spectrum_roles": "vo",
        "steps": 3,
    }
    summary, state = run(lm_config(corpus, **extra), tmp_path)
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["kind"] == "train"]
    assert len(train) == 3 and all(math.isfinite(r["loss"]) for r in train)
    assert any(r["kind"] == "spectrum" for r in recs)
    config = T.preset("tiny", attention="toy_mup", n_kv_heads=1, vocab_size=48, max_len=16)
    view = matrices.head_view(config)  # recipe step 3: the head layout per role
    assert view(("layers", 0, "attn", "k", "kernel"))[2] == 1
    assert view(("layers", 0, "attn", "q", "kernel"))[2:] == (config.n_heads, 1.0)
    graphdef, params = T.init(config, jax.random.key(0))
    assert params["layers"][0]["attn"]["k"]["kernel"].shape == (config.d_model, config.head_dim)
    tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, config.vocab_size)
    full = T.apply(graphdef, params, tokens)
    cache = decode.init_cache(config, 2, 9)
    _, cache = decode.extend(graphdef, params, tokens[:, :5], cache, 0)
    out = decode.extend(graphdef, params, tokens[:, 5:], cache, 5)[0]
    np.testing.assert_allclose(out, full[:, 5:], rtol=1e-4, atol=1e-5)


def test_grouped_kv_heads_shrink_the_cache_and_pair_vo_per_head():
    """GQA (6 query heads, 2 K/V heads): the cache is 3x smaller than MHA's, and the "vo"
    spectrum matrix equals the loop sum_h W_O^h W_V^(h // 3) (y = W x convention)."""
    config = T.preset("tiny", n_heads=6, n_kv_heads=2)
    mha = config.replace(n_kv_heads=None)
    assert 3 * decode.cache_bytes_per_token(config) == decode.cache_bytes_per_token(mha)
    _, params = T.init(config, jax.random.key(3))
    attn, dh = params["layers"][1]["attn"], config.head_dim
    wv, wo = (
        np.asarray(attn["v"]["kernel"]).T,
        np.asarray(attn["o"]["kernel"]).T,
    )  # [2dh, D], [D, 6dh]
    want = sum(
        wo[:, h * dh : (h + 1) * dh] @ wv[(h // 3) * dh : (h // 3 + 1) * dh] for h in range(6)
    )
    got = matrices.hidden_matrices(params, config=config)["layers/1/vo"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    per_head = matrices.vo_maps(params, config)[1]  # [H, D, D]
    np.testing.assert_allclose(per_head.sum(0), want, rtol=1e-5, atol=1e-6)
