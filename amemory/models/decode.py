"""Autoregressive decoding with a KV cache, and sampling.

The cache is a list with one dict of arrays per layer, shaped by the attention kind's
``cache_spec`` (:mod:`amemory.models.attention`: MHA keys and values ``[B, L, H_kv, d_h]``,
MLA the latent ``c_kv [B, L, d_c]`` and RoPE key ``[B, L, d_R]``; DeepSeek-V2, arXiv
2405.04434, Sec. 2.1.2). :func:`extend` runs S new tokens through the model at positions
``pos..pos+S-1``; its logits equal those rows of the full forward pass
(``transformer.apply``) of the whole sequence, with the MoE dropless.

:func:`generate` prefills the prompt in one ``extend`` and then decodes one token per
step inside ``jax.lax.scan`` (one compiled program). Sampling: greedy argmax at
``temperature = 0``, else a draw from ``softmax(logits / temperature)`` restricted to the
``top_k`` largest logits when ``top_k > 0`` (Fan et al. 2018, arXiv 1805.04833).

Example::

    >>> config = transformer.preset("tiny")
    >>> graphdef, params = transformer.init(config, jax.random.key(0))
    >>> prompt = jnp.zeros((2, 3), jnp.int32)
    >>> out = generate(graphdef, params, prompt, 5, key=jax.random.key(1), temperature=0.0)
    >>> out.shape  # prompt and 5 new tokens
    (2, 8)
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from amemory.models.attention import ATTENTIONS


def _check_config(config: Any) -> None:
    from amemory.models.transformer import TransformerConfig

    if not isinstance(config, TransformerConfig):
        raise ValueError(f"config must be a TransformerConfig, got {type(config).__name__}")


def init_cache(config: Any, batch: int, length: int) -> list[dict[str, jax.Array]]:
    """Zero KV cache for ``batch`` (B) sequences of up to ``length`` (L: prompt + new)
    tokens of a ``TransformerConfig``, in the compute dtype.

    Returns a list (one per layer) of dicts of zero arrays shaped by ``cache_spec``; raises
    ``ValueError`` for a non-positive ``batch`` or ``length``, or a non-config.
    """
    _check_config(config)
    if batch < 1 or length < 1:
        raise ValueError(f"batch and length must be >= 1, got batch={batch}, length={length}")
    spec = ATTENTIONS[config.attention].cache_spec(config, batch, length)
    dtype = jnp.dtype(config.dtype)
    return [{k: jnp.zeros(s, dtype) for k, s in spec.items()} for _ in range(config.n_layers)]


def cache_bytes_per_token(config: Any, *, per_layer: bool = False) -> int:
    """Bytes of KV cache one token occupies: ``2 H_kv d_h`` (MHA) or ``d_c + d_R`` (MLA) numbers
    per layer, times the compute dtype's size, times ``n_layers`` unless ``per_layer``
    (``ValueError`` for a non-config)."""
    _check_config(config)
    spec = ATTENTIONS[config.attention].cache_spec(config, 1, 1)
    numbers = sum(int(np.prod(s)) for s in spec.values())
    return numbers * jnp.dtype(config.dtype).itemsize * (1 if per_layer else config.n_layers)


def extend(
    graphdef: nnx.GraphDef, params: Any, tokens: jax.Array, cache: list, pos: jax.Array | int
) -> tuple[jax.Array, list]:
    """Run S new tokens through the model with the cache (pure; jit it).

    ``graphdef, params`` from ``transformer.init`` (one seed); ``tokens`` int ``[B, S]`` at
    positions ``pos..pos+S-1``; ``cache`` from :func:`init_cache` (or a previous call),
    length ``>= pos + S``; ``pos`` int scalar (may be traced), the tokens already cached.
    Returns ``(logits [B, S, V] float32, cache)`` with the new keys/latents written.
    """
    model = nnx.merge(graphdef, params)
    return model.extend(tokens, cache, jnp.asarray(pos, jnp.int32))


def sample_logits(
    logits: jax.Array, key: jax.Array, temperature: float = 1.0, top_k: int = 0
) -> jax.Array:
    """Next tokens ``[B]`` int32 from logits ``[B, V]``: argmax at ``temperature == 0``, else
    a categorical draw from ``softmax(logits / temperature)`` over the ``top_k`` largest
    logits (all when 0). Raises ``ValueError`` for a negative temperature or top_k."""
    if temperature < 0 or top_k < 0:
        raise ValueError(f"temperature and top_k must be >= 0, got {temperature}, {top_k}")
    if temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits.astype(jnp.float32) / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]  # (B, 1)
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnums=(0, 3, 5, 6))
def _generate(graphdef, params, prompt, max_new_tokens, key, temperature, top_k):
    model = nnx.merge(graphdef, params)
    b, p = prompt.shape
    cache = init_cache(model.config, b, p + max_new_tokens)
    logits, cache = model.extend(prompt, cache, jnp.int32(0))
    keys = jax.random.split(key, max_new_tokens)

    def step(carry, k):
        last, cache, pos = carry
        tok = sample_logits(last, k, temperature, top_k)  # (B,)
        logits, cache = model.extend(tok[:, None], cache, pos)
        return (logits[:, -1], cache, pos + 1), tok

    _, new = jax.lax.scan(step, (logits[:, -1], cache, jnp.int32(p)), keys)
    return jnp.concatenate([prompt, new.T], axis=1)


def generate(
    graphdef: nnx.GraphDef,
    params: Any,
    prompt: jax.Array,
    max_new_tokens: int,
    *,
    key: jax.Array,
    temperature: float = 1.0,
    top_k: int = 0,
) -> jax.Array:
    """Continue ``prompt`` by ``max_new_tokens`` tokens (KV-cache decoding, one program).

    Args:
      graphdef, params: from ``transformer.init`` or a trained run (one seed).
      prompt: int ``[B, P]``, ``P >= 1``.
      max_new_tokens: N >= 1.
      key: PRNG key of the draws (unused when ``temperature == 0``).
      temperature: 0 = greedy; else softmax temperature.
      top_k: keep the k largest logits before drawing (0 = all).

    Returns int32 ``[B, P + N]``, the prompt followed by the new tokens; raises
    ``ValueError`` for an empty prompt, ``N < 1``, negative temperature / top_k, or ``P + N``
    beyond ``max_len`` with learned positions (RoPE models extrapolate past it).
    """
    prompt = jnp.asarray(prompt, jnp.int32)
    if prompt.ndim != 2 or prompt.shape[1] < 1:
        raise ValueError(f"prompt must be int [batch, length >= 1], got shape {prompt.shape}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    config = nnx.merge(graphdef, params).config  # builds modules only, no compute
    total = prompt.shape[1] + max_new_tokens
    if config.position == "learned" and total > config.max_len:
        raise ValueError(
            f"prompt + max_new_tokens = {total} exceeds max_len={config.max_len} of a model "
            "with learned positions"
        )
    return _generate(
        graphdef, params, prompt, int(max_new_tokens), key, float(temperature), int(top_k)
    )


def generate_memory(
    graphdef: nnx.GraphDef, params: Any, batch: int, prompt_len: int, max_new_tokens: int
) -> dict[str, int]:
    """XLA's buffer assignment of the whole :func:`generate` program (compiled, not run).

    Returns bytes of ``arguments`` (parameters, prompt, key), ``outputs``, ``temporaries``
    (the cache and every intermediate) and ``total`` = their sum minus aliased bytes: the
    peak device memory of decoding ``batch`` sequences of ``prompt_len + max_new_tokens``.
    """
    prompt = jax.ShapeDtypeStruct((batch, prompt_len), jnp.int32)
    key = jax.eval_shape(lambda: jax.random.key(0))
    lowered = _generate.lower(graphdef, params, prompt, int(max_new_tokens), key, 0.0, 0)
    m = lowered.compile().memory_analysis()
    out = {
        "arguments": int(m.argument_size_in_bytes),
        "outputs": int(m.output_size_in_bytes),
        "temporaries": int(m.temp_size_in_bytes),
    }
    out["total"] = sum(out.values()) - int(m.alias_size_in_bytes)
    return out
