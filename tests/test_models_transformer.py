"""Tests for amemory.models.transformer: numpy reference forward, causality, closed-form
parameter counts, roles, and equivalence under jit / vmap-over-seeds / pmap / sharded jit."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from amemory.models import transformer as T

TINY = T.preset("tiny")
# Every optional feature switched the other way from `tiny`.
TINY_ALT = T.preset(
    "tiny",
    ffn="swiglu",
    norm="layernorm",
    position="learned",
    qk_norm=True,
    tied_head=True,
    use_bias=True,
)


# One jitted forward shared by all tests (graphdef static): eager nnx calls are slow.
_apply = jax.jit(T.apply, static_argnums=0, static_argnames="deterministic")


@pytest.fixture(scope="module")
def tiny():
    graphdef, params = T.init(TINY, jax.random.key(0))
    return graphdef, params


def _tokens(seed, b, t, vocab):
    return jnp.asarray(np.random.default_rng(seed).integers(0, vocab, (b, t)), jnp.int32)


# ----------------------------------------------------------------------------- reference


def _np_norm(x, p, kind, eps):
    if kind == "rmsnorm":
        return x / np.sqrt(np.mean(x**2, -1, keepdims=True) + eps) * p["scale"]
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _np_linear(x, p):
    return x @ p["kernel"] + p.get("bias", 0.0)


def _np_rope(x, base):
    """Rotation of the complex pairs (x_j, x_{j+Dh/2}) by angle t * base^(-2j/Dh)."""
    t, dh = x.shape[1], x.shape[-1]
    z = x[..., : dh // 2] + 1j * x[..., dh // 2 :]
    theta = base ** (-np.arange(dh // 2) * 2.0 / dh)
    z = z * np.exp(1j * np.arange(t)[:, None] * theta)[None, :, None, :]
    return np.concatenate([z.real, z.imag], axis=-1)


def _np_gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _np_forward(params, c, tokens, tops=None):
    """Slow float64 numpy forward pass written from the architecture description; each
    layer's per-head max attended logit ``[H]`` is appended to ``tops`` when given."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    tokens = np.asarray(tokens)
    b, t = tokens.shape
    h, dh = c.n_heads, c.d_model // c.n_heads
    x = p["embed"]["embedding"][tokens]
    if c.position == "learned":
        x = x + p["pos_embed"]["embedding"][:t]
    for i in range(c.n_layers):
        lp = p["layers"][i]
        a = _np_norm(x, lp["attn_norm"], c.norm, c.norm_eps)
        q, k, v = (_np_linear(a, lp["attn"][r]).reshape(b, t, h, dh) for r in "qkv")
        if c.qk_norm:
            q = _np_norm(q, lp["attn"]["q_norm"], "rmsnorm", c.norm_eps)
            k = _np_norm(k, lp["attn"]["k_norm"], "rmsnorm", c.norm_eps)
        if c.position == "rope":
            q, k = _np_rope(q, c.rope_base), _np_rope(k, c.rope_base)
        s = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(dh)
        s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
        (tops if tops is not None else []).append(s.max(axis=(0, 2, 3)))
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        y = np.einsum("bhqk,bkhd->bqhd", w, v).reshape(b, t, c.d_model)
        x = x + _np_linear(y, lp["attn"]["o"])
        m = _np_norm(x, lp["mlp_norm"], c.norm, c.norm_eps)
        if c.ffn == "gelu":
            f = _np_gelu(_np_linear(m, lp["mlp"]["w_in"]))
        else:
            g = _np_linear(m, lp["mlp"]["w_gate"])
            f = g / (1 + np.exp(-g)) * _np_linear(m, lp["mlp"]["w_in"])
        x = x + _np_linear(f, lp["mlp"]["w_out"])
    x = _np_norm(x, p["final_norm"], c.norm, c.norm_eps)
    if c.tied_head:
        return x @ p["embed"]["embedding"].T
    return x @ p["head"]["kernel"]


def _randomise(params, seed):
    """Replace every leaf by N(0, 0.3^2) (vectors: 1 + N(0, 0.3^2)) so norms and biases
    are not trivially 1 / 0. numpy RNG: no per-shape compilation."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda leaf: jnp.asarray(
            (1.0 if leaf.ndim == 1 else 0.0) + 0.3 * rng.normal(size=leaf.shape), jnp.float32
        ),
        params,
    )


@pytest.mark.parametrize("config", [TINY, TINY_ALT], ids=["tiny", "tiny_alt"])
def test_forward_matches_numpy_reference(config):
    graphdef, params = T.init(config, jax.random.key(1))
    params = _randomise(params, 2)
    tokens = _tokens(3, 2, config.max_len, config.vocab_size)
    logits = _apply(graphdef, params, tokens)
    chex.assert_shape(logits, (2, config.max_len, config.vocab_size))
    assert logits.dtype == jnp.float32
    tops = []
    ref = _np_forward(params, config, tokens, tops)
    np.testing.assert_allclose(np.asarray(logits), ref, rtol=2e-4, atol=2e-4)
    top = T.apply(graphdef, params, tokens, with_aux=True)[1]["max_logit"]  # (L, H)
    np.testing.assert_allclose(np.asarray(top), np.stack(tops), rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("config", [TINY, TINY_ALT], ids=["tiny", "tiny_alt"])
def test_causality(config):
    graphdef, params = T.init(config, jax.random.key(4))
    f = lambda tok: _apply(graphdef, params, tok)
    tokens = _tokens(5, 2, config.max_len, config.vocab_size)
    t0 = 9
    changed = tokens.at[:, t0].set((tokens[:, t0] + 1) % config.vocab_size)
    a, b = f(tokens), f(changed)
    np.testing.assert_array_equal(np.asarray(a[:, :t0]), np.asarray(b[:, :t0]))
    assert float(jnp.min(jnp.max(jnp.abs(a[:, t0:] - b[:, t0:]), axis=-1))) > 0


# ----------------------------------------------------------------------------- counts


def _closed_form_count(c):
    d, f, v, n = c.d_model, c.d_ff, c.vocab_size, c.n_layers
    b = 1 if c.use_bias else 0
    norm = d * (2 if c.norm == "layernorm" else 1)
    attn = 4 * (d * d + b * d) + (2 * (d // c.n_heads) if c.qk_norm else 0)
    n_ffn_in = 2 if c.ffn == "swiglu" else 1
    ffn = n_ffn_in * (d * f + b * f) + f * d + b * d
    total = v * d + n * (attn + ffn + 2 * norm) + norm
    total += c.max_len * d if c.position == "learned" else 0
    total += 0 if c.tied_head else d * v
    return total


@pytest.mark.parametrize(
    "name,expected",
    [("tiny", 11_880), ("small", 7_342_336), ("gpt2-small", 124_439_808),
     ("nanogpt-160m", 162_220_800)],
)  # fmt: skip
def test_preset_parameter_counts(name, expected):
    config = T.preset(name)
    abstract = jax.eval_shape(lambda k: T.init_params(config, k), jax.random.key(0))
    assert T.count_params(abstract) == _closed_form_count(config) == expected
    roles = T.param_roles(abstract)
    d, f = config.d_model, config.d_ff
    expected_shapes = {"q": (d, d), "k": (d, d), "v": (d, d), "o": (d, d)}
    expected_shapes |= {"w_in": (d, f), "w_out": (f, d)}
    for leaf, role in zip(jax.tree.leaves(abstract), jax.tree.leaves(roles), strict=True):
        if role in expected_shapes:
            assert leaf.shape == expected_shapes[role], (role, leaf.shape)


def test_variant_parameter_counts_and_shapes():
    for config in (TINY_ALT, T.preset("nanogpt-160m", ffn="swiglu", d_ff=2048)):
        abstract = jax.eval_shape(lambda k, c=config: T.init_params(c, k), jax.random.key(0))
        assert T.count_params(abstract) == _closed_form_count(config)
    assert _closed_form_count(T.preset("nanogpt-160m", ffn="swiglu", d_ff=2048)) == 162_220_800
    _, params = T.init(TINY_ALT, jax.random.key(0))
    layer = params["layers"][1]
    chex.assert_shape(layer["mlp"]["w_gate"]["kernel"], (24, 56))
    chex.assert_shape(layer["attn"]["q_norm"]["scale"], (8,))
    chex.assert_shape(params["pos_embed"]["embedding"], (19, 24))
    assert "head" not in params


# ----------------------------------------------------------------------------- roles


@pytest.mark.parametrize("config", [TINY, TINY_ALT], ids=["gelu", "swiglu"])
def test_every_leaf_has_exactly_one_role(config):
    _, params = T.init(config, jax.random.key(0))
    paths = jax.tree_util.tree_flatten_with_path(params)[0]
    roles = jax.tree.leaves(T.param_roles(params))
    assert len(roles) == len(paths)
    counts = {r: roles.count(r) for r in T.ROLES}
    n = config.n_layers
    for r in ("q", "k", "v", "o", "w_in", "w_out"):
        assert counts[r] == n
    assert counts["w_gate"] == (n if config.ffn == "swiglu" else 0)
    assert counts["head"] == (0 if config.tied_head else 1)
    assert counts["embed"] == (2 if config.position == "learned" else 1)
    assert sum(counts.values()) == len(paths)
    # Role of each leaf agrees with an independent reading of its path.
    for path, _ in paths:
        keys = [getattr(k, "key", k) for k in path]
        role = T.role_of(path)
        if keys[-1] == "kernel" and keys[-2] in T.ATTN_ROLES + T.FFN_ROLES:
            assert role == keys[-2]
        elif keys[-2].endswith("norm"):
            assert role == "norm"
        elif keys[-1] == "bias":
            assert role == "bias"
        elif keys[-1] == "embedding":
            assert role == "embed"
        else:
            assert keys == ["head", "kernel"] and role == "head"


def test_role_of_path_forms_and_errors():
    assert T.role_of(("layers", 3, "attn", "v", "kernel")) == "v"
    assert T.role_of(("layers", "3", "mlp", "w_gate", "kernel")) == "w_gate"
    assert T.role_of("layers/0/attn/o/bias") == "bias"
    assert T.role_of("layers/0/attn/q_norm/scale") == "norm"
    assert T.role_of("pos_embed/embedding") == "embed"
    assert T.role_of(("head", "kernel"), jnp.zeros((3, 5))) == "head"  # role_fn(path, leaf)
    # the stacked layout of scan_layers=True: same roles without the layer index
    assert T.role_of(("layers", "attn", "v", "kernel")) == "v"
    assert T.role_of("layers/mlp/w_out/bias") == "bias"
    assert T.role_of("layers/attn/k_norm/scale") == "norm"
    assert T.role_of("layers/mlp_norm/scale") == "norm"
    for bad in (
        "layers/0/attn/w_in/kernel",  # FFN role under attn
        "layers/0/mlp/q/kernel",
        "layers/x/attn/q/kernel",
        "embed/kernel",
        "head/scale",
        "foo/kernel",
        "kernel",
        "layers/0/attn/q/kernel/extra",
        "layers/attn/q/kernel/extra",
        "layers/q/kernel",
    ):
        with pytest.raises(ValueError, match="cannot classify"):
            T.role_of(bad)
    with pytest.raises(ValueError, match="cannot classify"):
        T.param_roles({"embed": {"embedding": jnp.zeros(3)}, "extra": {"w": jnp.zeros(2)}})


# ----------------------------------------------------------------------------- scanned layers


def test_scanned_layers_match_per_layer_model():
    """scan_layers=True on stack_layers(params) gives the per-layer model's loss and
    gradients (same operations in the same order: float32 rounding only, rtol 1e-5 /
    atol 1e-6), with dropout masks and remat. Every optional feature is on (TINY_ALT); the
    plain tiny preset is trained scanned in tests/test_train_parallel.py."""
    config = TINY_ALT.replace(dropout=0.3, remat=True, remat_policy="dots_saveable")
    scanned = config.replace(scan_layers=True)
    graphdef, params = T.init(config, jax.random.key(2))
    g_scan, p_init = T.init(scanned, jax.random.key(2))
    stacked = T.stack_layers(params)
    assert jax.tree.structure(stacked) == jax.tree.structure(p_init)
    chex.assert_trees_all_equal_shapes(stacked, p_init)
    chex.assert_shape(p_init["layers"]["attn"]["q"]["kernel"], (config.n_layers, 24, 24))
    q = np.asarray(p_init["layers"]["attn"]["q"]["kernel"])
    assert not np.allclose(q[0], q[1])  # each layer drew its own initialisation
    assert T.count_params(p_init) == T.count_params(params)
    chex.assert_trees_all_equal(T.unstack_layers(stacked), params)
    tokens = _tokens(4, 3, 13, config.vocab_size)

    def loss(gd, p):
        return jnp.mean(T.apply(gd, p, tokens, rng=jax.random.key(5), deterministic=False) ** 2)

    l_ref, g_ref = jax.jit(jax.value_and_grad(lambda p: loss(graphdef, p)))(params)
    l_scan, g_scan_ = jax.jit(jax.value_and_grad(lambda p: loss(g_scan, p)))(stacked)
    np.testing.assert_allclose(float(l_scan), float(l_ref), rtol=1e-5)
    chex.assert_trees_all_close(T.unstack_layers(g_scan_), g_ref, rtol=1e-5, atol=1e-6)
    # Roles, analysis helpers and Muon's matrix axes read both layouts alike.
    roles = T.param_roles(stacked)
    assert roles["layers"]["attn"]["q"]["kernel"] == "q"
    assert roles["layers"]["attn_norm"]["scale"] == "norm"
    assert set(jax.tree.leaves(roles)) == set(jax.tree.leaves(T.param_roles(params)))
    for name, m in T.hidden_matrices(params).items():
        np.testing.assert_array_equal(np.asarray(T.hidden_matrices(stacked)[name]), np.asarray(m))
    np.testing.assert_array_equal(
        np.asarray(T.vo_maps(stacked, config)), np.asarray(T.vo_maps(params, config))
    )
    assert T.matrix_axes("layers/attn/q/kernel") == (-2, -1)
    assert T.matrix_axes("layers/attn_norm/scale") is None
    assert T.matrix_axes("layers/1/mlp/w_in/bias") is None
    with pytest.raises(ValueError, match="already in the stacked"):
        T.stack_layers(stacked)
    with pytest.raises(ValueError, match="remat_policy"):
        config.replace(remat_policy="dots")


def test_scanned_mla_moe_blocks_and_decoding_match():
    """Whatever a Block holds scans: MLA attention and a mixture of experts give the same
    logits and MoE aux scalars stacked or per layer, and KV-cache decoding (layers walked
    one by one) gives the same logits (float32 rounding: rtol 1e-5)."""
    from amemory.models import decode

    config = T.preset("tiny", attention="mla", ffn="swiglu", moe={"experts": 4, "top_k": 2})
    graphdef, params = T.init(config, jax.random.key(3))
    g_scan = T.init(config.replace(scan_layers=True), jax.random.key(3))[0]
    stacked = T.stack_layers(params)
    tokens = _tokens(5, 2, 9, config.vocab_size)
    fwd = jax.jit(lambda g, p: T.apply(g, p, tokens, with_aux=True), static_argnums=0)
    (l_ref, a_ref), (l_scan, a_scan) = fwd(graphdef, params), fwd(g_scan, stacked)
    np.testing.assert_allclose(np.asarray(l_scan), np.asarray(l_ref), rtol=1e-5, atol=1e-6)
    assert set(a_scan) == set(a_ref) == {"moe_lb_loss", "moe_drop_fraction", "max_logit"}
    assert a_ref["max_logit"].shape == (config.n_layers, config.n_heads)
    for k in a_ref:
        np.testing.assert_allclose(np.asarray(a_scan[k]), np.asarray(a_ref[k]), rtol=1e-5)
    # KV-cache extension (the decoding path): prefill 6 tokens, then 3 more, both layouts.
    ext = jax.jit(decode.extend, static_argnums=0)
    outs = []
    for g, p in ((graphdef, params), (g_scan, stacked)):
        cache = decode.init_cache(config, 2, 9)
        _, cache = ext(g, p, tokens[:, :6], cache, 0)
        outs.append(np.asarray(ext(g, p, tokens[:, 6:], cache, 6)[0]))  # (B, 3, V)
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[0], np.asarray(l_ref)[:, 6:], rtol=1e-4, atol=1e-5)
    assert T.matrix_axes("layers/mlp/experts/w_in") == (-2, -1)  # [L, E, D, F]: L, E batch


# ----------------------------------------------------------------------------- transforms


def test_jit_vmap_over_seeds_pmap_and_sharded_jit(tiny):
    graphdef, params = tiny
    tokens = _tokens(6, 8, 19, TINY.vocab_size)
    plain = T.apply(graphdef, params, tokens)  # eager, op by op
    jitted = _apply(graphdef, params, tokens)
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(plain), rtol=1e-5, atol=1e-5)

    # Multi-seed: init over a batch of keys equals per-key init; vmapped apply equals
    # per-seed apply.
    keys = jax.random.split(jax.random.key(7), 3)
    _, stacked = T.init(TINY, keys)
    chex.assert_shape(stacked["layers"][0]["attn"]["v"]["kernel"], (3, 24, 24))
    multi = jax.jit(jax.vmap(lambda p: T.apply(graphdef, p, tokens)))(stacked)
    for s in range(3):
        _, single = T.init(TINY, keys[s])
        chex.assert_trees_all_close(jax.tree.map(lambda a, s=s: a[s], stacked), single, atol=1e-6)
        np.testing.assert_allclose(
            np.asarray(multi[s]), np.asarray(_apply(graphdef, single, tokens)), atol=1e-5
        )
    assert not np.allclose(np.asarray(multi[0]), np.asarray(multi[1]))

    # pmap over the 8 fake CPU devices, params replicated, batch split.
    n = jax.local_device_count()
    assert n == 8
    pm = jax.pmap(lambda p, t: T.apply(graphdef, p, t), in_axes=(None, 0))
    out = pm(params, tokens.reshape(n, 1, 19)).reshape(plain.shape)
    np.testing.assert_allclose(np.asarray(out), np.asarray(plain), rtol=1e-5, atol=1e-5)

    # Sharded jit: batch over a data axis, params replicated.
    mesh = jax.make_mesh((n,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    data = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    repl = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    sharded = jax.jit(lambda p, t: T.apply(graphdef, p, t), out_shardings=data)(
        jax.device_put(params, repl), jax.device_put(tokens, data)
    )
    np.testing.assert_allclose(np.asarray(sharded), np.asarray(plain), rtol=1e-5, atol=1e-5)


def test_remat_and_dropout():
    tokens = _tokens(8, 2, 10, 37)
    graphdef, params = T.init(TINY, jax.random.key(9))
    g_remat, params_remat = T.init(TINY.replace(remat=True), jax.random.key(9))
    chex.assert_trees_all_close(params, params_remat)

    def grads(gd):
        return jax.jit(jax.grad(lambda p: jnp.mean(T.apply(gd, p, tokens) ** 2)))(params)

    chex.assert_trees_all_close(grads(graphdef), grads(g_remat), rtol=1e-5, atol=1e-6)

    gd, p = T.init(TINY.replace(dropout=0.5), jax.random.key(9))
    det = _apply(gd, p, tokens)
    np.testing.assert_allclose(np.asarray(det), np.asarray(_apply(graphdef, params, tokens)))
    k = jax.random.key(10)
    d1 = _apply(gd, p, tokens, rng=k, deterministic=False)
    d2 = _apply(gd, p, tokens, rng=k, deterministic=False)
    d3 = _apply(gd, p, tokens, rng=jax.random.key(11), deterministic=False)
    np.testing.assert_array_equal(np.asarray(d1), np.asarray(d2))
    assert not np.allclose(np.asarray(d1), np.asarray(det))
    assert not np.allclose(np.asarray(d1), np.asarray(d3))
    with pytest.raises(ValueError, match="rng"):
        T.apply(gd, p, tokens, deterministic=False)


# ----------------------------------------------------------------------------- analysis


def test_vo_ffn_and_hidden_matrices(tiny):
    _, params = tiny
    h, dh = TINY.n_heads, TINY.head_dim
    vo = T.vo_maps(params, TINY)
    chex.assert_shape(vo, (2, 3, 24, 24))
    wv = np.asarray(params["layers"][1]["attn"]["v"]["kernel"]).T  # [out, in]
    wo = np.asarray(params["layers"][1]["attn"]["o"]["kernel"]).T
    for head in range(h):
        sl = slice(head * dh, (head + 1) * dh)
        np.testing.assert_allclose(np.asarray(vo[1, head]), wo[:, sl] @ wv[sl, :], atol=1e-6)
        assert np.linalg.matrix_rank(np.asarray(vo[1, head]), tol=1e-7) <= dh
    full = T.vo_maps(params, TINY, per_head=False)
    np.testing.assert_allclose(np.asarray(full[1]), wo @ wv, atol=1e-6)
    np.testing.assert_allclose(np.asarray(vo.sum(1)), np.asarray(full), atol=1e-6)

    ffn = T.ffn_matrices(params)
    assert set(ffn) == {"w_in", "w_out"}
    chex.assert_shape(ffn["w_in"], (2, 56, 24))
    chex.assert_shape(ffn["w_out"], (2, 24, 56))
    _, alt = T.init(TINY_ALT, jax.random.key(0))
    chex.assert_shape(T.ffn_matrices(alt)["w_gate"], (2, 56, 24))

    hidden = T.hidden_matrices(params)
    assert set(hidden) == {f"layers/{i}/{r}" for i in (0, 1) for r in
                           ("q", "k", "v", "o", "w_in", "w_out", "vo")}  # fmt: skip
    np.testing.assert_allclose(np.asarray(hidden["layers/1/vo"]), wo @ wv, atol=1e-6)
    np.testing.assert_array_equal(
        np.asarray(hidden["layers/0/w_in"]),
        np.asarray(params["layers"][0]["mlp"]["w_in"]["kernel"]).T,
    )
    for m in hidden.values():
        assert m.ndim == 2


# ----------------------------------------------------------------------------- validation


def test_config_and_input_validation():
    with pytest.raises(ValueError, match="ffn"):
        T.preset("tiny", ffn="relu")
    with pytest.raises(ValueError, match="norm"):
        T.preset("tiny", norm="batchnorm")
    with pytest.raises(ValueError, match="position"):
        T.preset("tiny", position="alibi")
    with pytest.raises(ValueError, match="divisible"):
        T.preset("tiny", n_heads=5)
    with pytest.raises(ValueError, match="even head dim"):
        T.preset("tiny", d_model=15, n_heads=3)
    with pytest.raises(ValueError, match="dropout"):
        T.preset("tiny", dropout=1.0)
    with pytest.raises(ValueError, match="dtype"):
        T.preset("tiny", dtype="int8")
    with pytest.raises(ValueError, match="vocab_size"):
        T.preset("tiny", vocab_size=0)
    with pytest.raises(ValueError, match="preset name"):
        T.preset("gpt5")
    with pytest.raises(ValueError, match="unknown TransformerConfig field"):
        T.preset("tiny", d_modle=8)
    assert T.preset("tiny", dtype=jnp.bfloat16).dtype == "bfloat16"
    graphdef, params = T.init(TINY, jax.random.key(0))
    with pytest.raises(ValueError, match="max_len"):
        T.apply(graphdef, params, jnp.zeros((1, 20), jnp.int32))
    with pytest.raises(ValueError, match="integer"):
        T.apply(graphdef, params, jnp.zeros((1, 5), jnp.float32))
    with pytest.raises(ValueError, match=r"\[batch, seq\]"):
        T.apply(graphdef, params, jnp.zeros((5,), jnp.int32))
