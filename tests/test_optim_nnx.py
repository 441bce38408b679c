"""amemory.optim under flax.nnx.Optimizer: the same roles at init and update, foreign nnx
models (every standard layer's role and matrix, the output layer), the three tutorial
models (Flax's NNX MNIST CNN, miniGPT, the gemma example's Einsum block) trained on a
4-device Explicit mesh, and the label-mismatch error.

References: the functional path (tx.init / tx.update on plain dict params, which never
sees nnx paths), the exact polar factor from numpy's SVD, and hand-written tables of
flax.nnx's kernel layouts.
"""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from amemory import optim
from amemory.models import transformer as tfm


class _Foreign(nnx.Module):
    """A plain nnx model: Linear -> MultiHeadAttention -> LayerNorm -> Linear."""

    def __init__(self, rngs):
        self.l1 = nnx.Linear(17, 12, rngs=rngs)
        self.att = nnx.MultiHeadAttention(
            num_heads=2, in_features=12, qkv_features=14, decode=False, rngs=rngs
        )
        self.ln = nnx.LayerNorm(12, rngs=rngs)
        self.l2 = nnx.Linear(12, 3, rngs=rngs)

    def __call__(self, x):
        return self.l2(self.ln(self.att(self.l1(x))))


def test_path_keys_drop_only_the_variable_value_key():
    model = _Foreign(nnx.Rngs(0))
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param))[0]]
    names = {optim.path_str(p) for p in paths}
    assert "att/value/kernel" in names and "l1/kernel" in names  # dict key "value" kept
    assert all(isinstance(p[-1], jax.tree_util.GetAttrKey) for p in paths)  # nnx adds it
    # amemory's own role_of reads nnx.state paths (raised ValueError on ".../value")
    state = nnx.state(tfm.Transformer(tfm.preset("tiny"), rngs=nnx.Rngs(params=0)), nnx.Param)
    roles = jax.tree.leaves(jax.tree_util.tree_map_with_path(tfm.role_of, state))
    assert roles.count("v") == tfm.preset("tiny").n_layers


def test_nnx_optimizer_on_amemory_transformer_equals_functional_step():
    config = tfm.preset("tiny")
    model = tfm.Transformer(config, rngs=nnx.Rngs(params=0))
    graphdef, params = tfm.init(config, jax.random.key(0))
    rules = {"hidden": optim.muon(0.02, preset="jordan"), "rest": optax.adam(3e-3)}
    tx = optim.routed(rules, tfm.role_of)
    opt = nnx.Optimizer(model, tx, wrt=nnx.Param)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, config.vocab_size, (2, 7)))

    def loss(m):
        return jnp.mean(m(tokens) ** 2)

    @nnx.jit
    def step(model, opt):
        opt.update(model, nnx.grad(loss)(model))

    def f_loss(p):
        return jnp.mean(tfm.apply(graphdef, p, tokens) ** 2)

    @jax.jit
    def ref_step(p, s):
        u, s = tx.update(jax.grad(f_loss)(p), s, p)
        return optax.apply_updates(p, u), s

    ref_params, ref_state = params, tx.init(params)
    for _ in range(2):
        step(model, opt)
        ref_params, ref_state = ref_step(ref_params, ref_state)
    got = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    for path, ref in jax.tree_util.tree_flatten_with_path(ref_params)[0]:
        name = optim.path_str(path)
        leaf = got
        for k in optim.path_keys(path):
            leaf = leaf[k]
        # two compiled programs (nnx.jit, jax.jit) round differently and Newton-Schulz
        # amplifies it: 1e-5 on parameters moved by ~0.02 a step; a leaf routed to the
        # other transform (Adam instead of Muon) would be off by ~1e-2
        np.testing.assert_allclose(leaf, ref, atol=1e-5, err_msg=name)


def test_foreign_nnx_model_mha_kernels_are_the_head_flattened_matrix():
    """Query kernel [d, H, d_h] -> matrix (d, H*d_h); out kernel [H, d_h, d] -> (H*d_h, d).

    Reference: the exact polar factor of the explicitly reshaped gradient (the kernel is
    checked against numpy in test_optim_orthogonalize.py); a wrong axis grouping is off by
    ~1e-2.
    """
    model = _Foreign(nnx.Rngs(1))
    lr = 0.1
    muon = optim.muon(
        lr, momentum=0.0, orthogonalizer="polar", shape_scale="none",
        matrix_axes=optim.nnx_matrix_axes,
    )  # fmt: skip
    tx = optim.routed({"hidden": muon, "rest": optax.sgd(lr)}, optim.nnx_role)
    opt = nnx.Optimizer(model, tx, wrt=nnx.Param)
    before = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    x = jnp.asarray(np.random.default_rng(2).standard_normal((3, 5, 17)), jnp.float32)
    grads = nnx.grad(lambda m: jnp.mean(m(x) ** 2))(model)
    g = nnx.to_pure_dict(nnx.state(grads, nnx.Param))
    nnx.jit(lambda m, o, gr: o.update(m, gr))(model, opt, grads)
    after = nnx.to_pure_dict(nnx.state(model, nnx.Param))

    def ref_polar(a, shape):  # explicit reshape + the SVD kernel (tested against numpy)
        return np.asarray(optim.polar(jnp.asarray(a).reshape(shape)))

    q = g["att"]["query"]["kernel"]  # [12, 2, 7]
    ref_q = -lr * ref_polar(q, (12, 14)).reshape(q.shape)
    np.testing.assert_allclose(
        after["att"]["query"]["kernel"] - before["att"]["query"]["kernel"], ref_q, atol=1e-6
    )
    o = g["att"]["out"]["kernel"]  # [2, 7, 12]
    ref_o = -lr * ref_polar(o, (14, 12)).reshape(o.shape)
    np.testing.assert_allclose(
        after["att"]["out"]["kernel"] - before["att"]["out"]["kernel"], ref_o, atol=1e-6
    )
    ref_l1 = -lr * ref_polar(g["l1"]["kernel"], (17, 12))
    np.testing.assert_allclose(after["l1"]["kernel"] - before["l1"]["kernel"], ref_l1, atol=1e-6)
    np.testing.assert_allclose(
        after["ln"]["scale"] - before["ln"]["scale"], -lr * g["ln"]["scale"], atol=1e-7
    )
    rows = optim.routing_table(before, {"hidden": 0, "rest": 1}, optim.nnx_role)
    assert {r.path: r.role for r in rows}["att/value/kernel"] == "v"
    with pytest.raises(ValueError, match=r"nnx_role.*'cell/w'"):
        optim.nnx_role(("cell", "w"), jnp.zeros(3))


def test_role_fn_labelling_differently_at_update_is_a_valueerror_naming_the_leaf():
    calls = {"n": 0}

    def flaky(path, leaf):  # depends on call order, not only on the path
        calls["n"] += 1
        return "q" if calls["n"] <= 2 else "norm"

    params = {"w": jnp.ones((3, 4)), "s": jnp.ones((4, 3))}
    tx = optim.routed({"q": optim.muon(0.1), "rest": optax.sgd(0.1)}, flaky)
    state = tx.init(params)
    with pytest.raises(ValueError, match=r"'s'.*'rest' now but 'q' at init"):
        tx.update(params, state, params)


# ------------------------------------------------------- the tutorials' models, small


BATCH = P("batch")  # the models run on a mesh with a "batch" axis (Explicit sharding)


class CNN(nnx.Module):  # Flax's NNX MNIST tutorial, shrunk (8x8 images, 4 and 8 channels)
    def __init__(self, rngs):
        self.conv1 = nnx.Conv(1, 4, kernel_size=(3, 3), rngs=rngs)
        self.batch_norm1 = nnx.BatchNorm(4, rngs=rngs)
        self.conv2 = nnx.Conv(4, 8, kernel_size=(3, 3), rngs=rngs)
        self.batch_norm2 = nnx.BatchNorm(8, rngs=rngs)
        self.avg_pool = functools.partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
        self.linear1 = nnx.Linear(2 * 2 * 8, 16, rngs=rngs)
        self.linear2 = nnx.Linear(16, 10, rngs=rngs)

    def __call__(self, x):  # x [B, 8, 8, 1] -> logits [B, 10]
        x = self.avg_pool(nnx.relu(self.batch_norm1(self.conv1(x))))
        x = self.avg_pool(nnx.relu(self.batch_norm2(self.conv2(x))))
        x = x.reshape(x.shape[0], -1)
        return self.linear2(nnx.relu(self.linear1(x)))


class Block(nnx.Module):  # the NNX miniGPT tutorial's TransformerBlock
    def __init__(self, d, heads, ff, rngs):
        self.mha = nnx.MultiHeadAttention(heads, d, decode=False, rngs=rngs)
        self.layer_norm1 = nnx.LayerNorm(d, rngs=rngs)
        self.linear1 = nnx.Linear(d, ff, rngs=rngs)
        self.linear2 = nnx.Linear(ff, d, rngs=rngs)
        self.layer_norm2 = nnx.LayerNorm(d, rngs=rngs)

    def __call__(self, x):
        mask = nnx.make_causal_mask(x[..., 0])
        x = self.layer_norm1(x + self.mha(x, mask=mask))
        return self.layer_norm2(x + self.linear2(nnx.relu(self.linear1(x))))


class MiniGPT(nnx.Module):
    def __init__(self, vocab, maxlen, d, heads, ff, layers, rngs):
        self.token_emb = nnx.Embed(vocab, d, rngs=rngs)
        self.pos_emb = nnx.Embed(maxlen, d, rngs=rngs)
        self.transformer_blocks = nnx.List([Block(d, heads, ff, rngs) for _ in range(layers)])
        self.output_layer = nnx.Linear(d, vocab, use_bias=False, rngs=rngs)

    def __call__(self, tokens):  # [B, T] -> logits [B, T, V]
        x = (
            self.token_emb(tokens, out_sharding=BATCH)
            + self.pos_emb(jnp.arange(tokens.shape[1]))[None]
        )
        for block in self.transformer_blocks:
            x = block(x)
        return self.output_layer(x)


class GemmaBlock(nnx.Module):  # the gemma example's Einsum attention and gated MLP
    def __init__(self, d, heads, kv_heads, dh, ff, rngs):
        self.pre_attention_norm = nnx.RMSNorm(d, rngs=rngs)
        self.q_einsum = nnx.Einsum("BTD,NDH->BTNH", (heads, d, dh), rngs=rngs)
        self.kv_einsum = nnx.Einsum("BSD,CKDH->CBSKH", (2, kv_heads, d, dh), rngs=rngs)
        self.attn_vec_einsum = nnx.Einsum("BTNH,NHD->BTD", (heads, dh, d), rngs=rngs)
        self.pre_ffw_norm = nnx.RMSNorm(d, rngs=rngs)
        self.gating_einsum = nnx.Einsum("BTD,CDF->CBTF", (2, d, ff), rngs=rngs)
        self.linear = nnx.Einsum("BTF,FD->BTD", (ff, d), rngs=rngs)
        self.groups = heads // kv_heads

    def __call__(self, x):
        h = self.pre_attention_norm(x)
        q = self.q_einsum(h)  # [B, T, N, H]
        k, v = self.kv_einsum(h)  # [B, S, K, H] each
        k, v = (jnp.repeat(a, self.groups, axis=2) for a in (k, v))
        logits = jnp.einsum("BTNH,BSNH->BNTS", q, k) / np.sqrt(q.shape[-1])
        mask = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool))
        probs = jax.nn.softmax(jnp.where(mask, logits, -1e9), axis=-1)
        x = x + self.attn_vec_einsum(jnp.einsum("BNTS,BSNH->BTNH", probs, v))
        gate, up = self.gating_einsum(self.pre_ffw_norm(x))
        return x + self.linear(nnx.gelu(gate) * up)


class Gemma(nnx.Module):  # tied embedding: logits = embedder.attend(x)
    def __init__(self, vocab, d, heads, kv_heads, dh, ff, layers, rngs):
        self.embedder = nnx.Embed(vocab, d, rngs=rngs)
        self.layers = nnx.List(
            [GemmaBlock(d, heads, kv_heads, dh, ff, rngs) for _ in range(layers)]
        )
        self.final_norm = nnx.RMSNorm(d, rngs=rngs)

    def __call__(self, tokens):
        x = self.embedder(tokens, out_sharding=BATCH) * np.sqrt(self.embedder.features)
        for layer in self.layers:
            x = layer(x)
        return self.embedder.attend(self.final_norm(x))


# ------------------------------------------------------- roles and matrices of nnx layers

MATRIX_ROLES = {"dense", "head", "q", "k", "v", "o"}


class _AllLayers(nnx.Module):
    """One of every standard layer with parameters; ``proj`` is defined last at the top."""

    def __init__(self, rngs):
        self.lin = nnx.Linear(5, 7, rngs=rngs)
        self.gen = nnx.LinearGeneral((2, 3), 5, axis=(-2, -1), rngs=rngs)
        self.batched = nnx.LinearGeneral(4, 6, batch_axis={0: 3}, rngs=rngs)
        self.ein = nnx.Einsum("BTD,NDH->BTNH", (2, 5, 3), rngs=rngs)
        self.experts = nnx.Einsum("EBD,EDF->EBF", (3, 5, 4), rngs=rngs)
        self.conv = nnx.Conv(2, 4, kernel_size=(3, 3), rngs=rngs)
        self.convt = nnx.ConvTranspose(4, 3, kernel_size=(2, 2), rngs=rngs)
        self.att = nnx.MultiHeadAttention(2, 6, qkv_features=8, decode=False, rngs=rngs)
        self.emb = nnx.Embed(11, 5, rngs=rngs)
        self.ln = nnx.LayerNorm(5, rngs=rngs)
        self.rms = nnx.RMSNorm(5, rngs=rngs)
        self.bn = nnx.BatchNorm(4, rngs=rngs)
        self.proj = nnx.Linear(7, 3, rngs=rngs)


# flax.nnx 0.12 kernel layouts, by hand: path -> (role, (fan_in axes, fan_out axes))
EXPECTED = {
    "lin/kernel": ("dense", ((0,), (1,))),  # [in, out]
    "gen/kernel": ("dense", ((0, 1), (2,))),  # [*in, *out]
    "batched/kernel": ("dense", ((1,), (2,))),  # [*batch, in, out]
    "ein/kernel": ("dense", ((1,), (0, 2))),  # NDH: D summed, N and H added
    "experts/kernel": ("dense", ((1,), (2,))),  # EDF: E in input and output: a batch axis
    "conv/kernel": ("dense", ((0, 1, 2), (3,))),  # [kh, kw, c_in, c_out]
    "convt/kernel": ("dense", ((0, 1, 2), (3,))),
    "att/query/kernel": ("q", ((0,), (1, 2))),  # [d, H, d_h]
    "att/key/kernel": ("k", ((0,), (1, 2))),
    "att/value/kernel": ("v", ((0,), (1, 2))),
    "att/out/kernel": ("o", ((0, 1), (2,))),  # [H, d_h, d]
    "proj/kernel": ("head", ((0,), (1,))),  # the Linear defined last at the model top
    "emb/embedding": ("embed", None),
    "ln/scale": ("norm", None),
    "rms/scale": ("norm", None),
    "bn/scale": ("norm", None),
}


def _as_tuples(axes):
    return None if axes is None else tuple((a,) if isinstance(a, int) else tuple(a) for a in axes)


def test_every_standard_layer_has_a_role_and_a_matching_matrix():
    model = _AllLayers(nnx.Rngs(0))
    layers = optim.nnx_layers(model)
    params = nnx.state(model, nnx.Param)
    got = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        role, axes = layers.role(path, leaf), layers.matrix_axes(path, leaf)
        got[optim.path_str(path)] = (role, _as_tuples(axes))
        assert (role in MATRIX_ROLES) == (axes is not None), optim.path_str(path)
    assert {k: v for k, v in got.items() if not k.endswith("bias")} == EXPECTED
    assert {v for k, v in got.items() if k.endswith("bias")} == {("bias", None)}
    # the layouts Muon builds from them: conv [3, 3, 2, 4] -> (18, 4), experts -> 3 x (5, 4)
    lay = optim._matrices.matrix_layout(
        model.conv.kernel[...], layers.matrix_axes, ("conv", "kernel")
    )
    assert (lay.batch, lay.fan_in, lay.fan_out) == (1, 18, 4)
    lay = optim._matrices.matrix_layout(
        model.experts.kernel[...], layers.matrix_axes, ("experts", "kernel")
    )
    assert (lay.batch, lay.fan_in, lay.fan_out) == (3, 5, 4)


def test_output_layer_is_found_or_named_in_a_warning():
    cnn = optim.nnx_layers(CNN(nnx.Rngs(0)))
    assert cnn.role("linear2/kernel") == "head" and cnn.role("linear1/kernel") == "dense"
    gpt = optim.nnx_layers(MiniGPT(31, 8, 16, 2, 32, 1, nnx.Rngs(0)))
    assert gpt.role("output_layer/kernel") == "head"
    assert gpt.role("transformer_blocks/0/linear2/kernel") == "dense"
    gemma = Gemma(31, 16, 4, 2, 4, 32, 1, nnx.Rngs(0))  # logits from the tied embedding
    with pytest.warns(UserWarning, match=r"'layers/0/linear/kernel', goes to Muon.*heads=\("):
        layers = optim.nnx_layers(gemma)
    assert layers.role("layers/0/linear/kernel") == "dense"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "head" not in optim.nnx_layers(gemma, heads=()).kernels.values()
        assert (
            optim.nnx_layers(gemma, heads=("layers/0/linear",)).role("layers/0/linear/kernel")
            == "head"
        )
    with pytest.raises(ValueError, match=r"heads: 'nope' .*'layers/0/linear'"):
        optim.nnx_layers(gemma, heads=("nope",))
    named = nnx.Module()  # by name: head/lm_head at any depth, the other names at the top
    named.classifier, named.sub = nnx.Linear(4, 3, rngs=nnx.Rngs(0)), nnx.Module()
    named.sub.lm_head, named.sub.logits = (nnx.Linear(4, 3, rngs=nnx.Rngs(0)) for _ in "ab")
    roles = {k: r for k, (r, _) in optim.nnx_layers(named).kernels.items()}
    assert roles == {"classifier/kernel": "head", "sub/lm_head/kernel": "head",
                     "sub/logits/kernel": "dense"}  # fmt: skip
    # by path alone: names only, a warning for other kernels at the top, no guessing
    assert optim.nnx_role(("output_layer", "kernel"), jnp.zeros((4, 3))) == "head"
    with pytest.warns(UserWarning, match=r"'linear2/kernel' is a kernel at the model top"):
        assert optim.nnx_role(("linear2", "kernel"), jnp.zeros((4, 3))) == "dense"
    with pytest.raises(ValueError, match=r"'conv1/kernel'.*nnx_layers\(model\)"):
        optim.nnx_role(("conv1", "kernel"), jnp.zeros((3, 3, 1, 4)))
    with pytest.raises(ValueError, match=r"'conv1/kernel'.*nnx_layers\(model\)"):
        optim.nnx_matrix_axes(("conv1", "kernel"), jnp.zeros((3, 3, 1, 4)))


# ------------------------------------------------------- training on an Explicit mesh

rng = np.random.default_rng(0)
TUTORIALS = {  # model, batch, expected roles
    "cnn": (
        lambda r: CNN(r),
        (rng.standard_normal((8, 8, 8, 1)).astype(np.float32), rng.integers(0, 10, 8)),
        {"conv2/kernel": "dense", "linear2/kernel": "head"},
    ),
    "minigpt": (
        lambda r: MiniGPT(31, 8, 16, 2, 32, 1, r),
        (tokens := rng.integers(0, 31, (8, 8)), tokens),
        {"transformer_blocks/0/mha/query/kernel": "q", "output_layer/kernel": "head"},
    ),
    "gemma": (
        lambda r: Gemma(31, 16, 4, 2, 4, 32, 1, r),
        (tokens, tokens),
        {"layers/0/kv_einsum/kernel": "dense", "embedder/embedding": "embed"},
    ),
}


@pytest.mark.parametrize("name", list(TUTORIALS))
def test_tutorial_models_train_with_muon_on_an_explicit_mesh(name):
    """Params on a 2x2 ("batch", "model") mesh with Explicit axes, 2-D kernels split along
    their contracted axis, the batch along "batch"; under jax.set_mesh as the miniGPT
    tutorial. Before amemory.optim.distributed.auto_sharded the first update raised
    ShardingTypeError."""
    make, (x, y), roles = TUTORIALS[name]
    mesh = jax.make_mesh((2, 2), ("batch", "model"), axis_types=(AxisType.Explicit,) * 2)

    def spec(path, leaf):  # 2-D kernels on "model" along axis 0; the rest replicated
        split = leaf.ndim == 2 and "emb" not in optim.path_str(path)
        return NamedSharding(mesh, P("model", None) if split else P())

    def loss_fn(model, x, y):
        logits = model(x)
        if name != "cnn":  # next-token prediction
            logits, y = logits[:, :-1], y[:, 1:]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @nnx.jit
    def step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
        optimizer.update(model, grads)
        return loss

    with jax.set_mesh(mesh):
        model = make(nnx.Rngs(0))
        params = nnx.state(model, nnx.Param)
        nnx.update(model, jax.tree_util.tree_map_with_path(
            lambda p, a: jax.device_put(a, spec(p, a)), params
        ))  # fmt: skip
        layers = optim.nnx_layers(model, heads=() if name == "gemma" else None)
        rules = {
            "hidden": optim.muon(0.02, matrix_axes=layers.matrix_axes),
            "rest": optax.adam(3e-3),
        }
        table = {r.path: r.role for r in optim.routing_table(params, rules, layers.role)}
        assert {k: table[k] for k in roles} == roles
        optimizer = nnx.Optimizer(model, optim.routed(rules, layers.role), wrt=nnx.Param)
        batch = NamedSharding(mesh, P("batch"))
        x, y = jax.device_put(x, batch), jax.device_put(y, batch)
        losses = [float(step(model, optimizer, x, y)) for _ in range(4)]
        kernel = model.linear1.kernel if name == "cnn" else None
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses
    if kernel is not None:  # still split as it was, the type says so
        assert jax.typeof(kernel[...]).sharding.spec == P("model", None)
