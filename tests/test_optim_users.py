"""amemory.optim in users' own Flax models: stacked layers, LoRA, role_fn path forms.

Each update is compared with an independent per-layer loop: the exact polar factor
(numpy SVD) of each layer's matrix, read by hand from the layer's documented kernel
layout. Muon runs with ``orthogonalizer="polar"``, no momentum and no shape scaling, so
its update of a matrix is exactly that matrix's polar factor.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from amemory import optim

L = 3  # stacked layers

#: leaf -> how one layer's kernel [..] becomes its [fan_in, fan_out] matrix (numpy)
MATRIX = {
    "lin/kernel": lambda k: k,  # Linear [in, out]
    "gen/kernel": lambda k: k.reshape(k.shape[0], -1),  # LinearGeneral [in, n, h]
    "ein/kernel": lambda k: np.moveaxis(k, 1, 0).reshape(k.shape[1], -1),  # "btd,ndh" [n, d, h]
    "conv/kernel": lambda k: k.reshape(-1, k.shape[-1]),  # Conv [kh, kw, c_in, c_out]
    "attn/query/kernel": lambda k: k.reshape(k.shape[0], -1),  # MHA [d, H, d_h]
    "attn/out/kernel": lambda k: k.reshape(-1, k.shape[-1]),  # MHA out [H, d_h, d]
    "lora/lora_a": lambda k: k,  # LoRA [in, r]
    "lora/lora_b": lambda k: k,  # LoRA [r, out]
}


class Block(nnx.Module):
    """One layer of every kind nnx_layers reads (distinct sizes)."""

    def __init__(self, rngs: nnx.Rngs):
        self.lin = nnx.Linear(5, 7, rngs=rngs)
        self.gen = nnx.LinearGeneral(5, (2, 3), rngs=rngs)
        self.ein = nnx.Einsum("btd,ndh->btnh", (2, 5, 3), rngs=rngs)
        self.conv = nnx.Conv(3, 4, (2, 2), rngs=rngs)
        self.attn = nnx.MultiHeadAttention(
            num_heads=2, in_features=6, qkv_features=6, decode=False, rngs=rngs
        )
        self.lora = nnx.LoRA(5, 2, 7, rngs=rngs)


def _vmapped(rngs):
    return nnx.vmap(Block, in_axes=0, out_axes=0)(rngs.split(L))


def _scanned(rngs):
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0))
    def make(carry, r):
        return carry, Block(r)

    return make(0, rngs.split(L))[1]


def _nested(rngs):  # a stack of stacks: [2, L, ...]
    return nnx.vmap(_vmapped, in_axes=0, out_axes=0)(rngs.split(2))


class Model(nnx.Module):
    def __init__(self, make, rngs: nnx.Rngs):
        self.blocks = make(rngs)
        self.head = nnx.Linear(7, 11, rngs=rngs)


def _polar(m):
    u, _, vt = np.linalg.svd(m, full_matrices=False)
    return u @ vt


def _muon_update(model, axes_fn, grads_of=nnx.Param):
    layers = optim.nnx_layers(model)
    muon = optim.scale_by_muon(
        orthogonalizer="polar", momentum=0.0, nesterov=False, shape_scale="none",
        matrix_axes=getattr(layers, axes_fn),
    )  # fmt: skip
    tx = optim.routed({"hidden+lora": muon, "rest": optax.identity()}, layers.role)
    params = nnx.to_pure_dict(nnx.state(model, grads_of))
    rng = np.random.default_rng(0)
    grads = jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(np.float32), params)
    return layers, grads, tx, params


def _flat(tree):
    return {optim.path_str(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.mark.parametrize("make", [_vmapped, _scanned, _nested], ids=["vmap", "scan", "nested"])
def test_stacked_layers_get_one_matrix_per_layer(make):
    """Every kernel of a stack [*S, ...] is updated as S separate per-layer matrices; before
    round 4 the layer axis was read as fan_in (relative error 0.25-0.64)."""
    model = Model(make, nnx.Rngs(0))
    _, grads, tx, params = _muon_update(model, "matrix_axes")
    upd = _flat(jax.jit(tx.update)(grads, tx.init(params))[0])
    g = _flat(grads)
    for leaf, to_matrix in MATRIX.items():
        name = "blocks/" + leaf
        lead = g[name].shape[: 2 if make is _nested else 1]
        for idx in np.ndindex(lead):
            want = _polar(to_matrix(g[name][idx]))
            np.testing.assert_allclose(to_matrix(upd[name][idx]), want, atol=2e-5, err_msg=name)
    np.testing.assert_array_equal(upd["head/kernel"], g["head/kernel"])  # head: identity


def test_stacked_attention_per_head_is_one_matrix_per_layer_and_head():
    model = Model(_vmapped, nnx.Rngs(1))
    _, grads, tx, params = _muon_update(model, "per_head_matrix_axes")
    upd = _flat(tx.update(grads, tx.init(params))[0])
    g = _flat(grads)
    q, o = g["blocks/attn/query/kernel"], g["blocks/attn/out/kernel"]
    for layer in range(L):
        for h in range(q.shape[2]):
            got = upd["blocks/attn/query/kernel"][layer, :, h]
            np.testing.assert_allclose(got, _polar(q[layer, :, h]), atol=2e-5)
            got = upd["blocks/attn/out/kernel"][layer, h]
            np.testing.assert_allclose(got, _polar(o[layer, h]), atol=2e-5)


def test_stacked_layers_on_an_explicit_mesh():
    """The same per-layer update with the stacks split along a feature axis on 4 devices
    (Explicit axes, Flax miniGPT's mesh type), inside jit."""
    model = Model(_vmapped, nnx.Rngs(2))
    _, grads, tx, params = _muon_update(model, "matrix_axes")
    want = _flat(tx.update(grads, tx.init(params))[0])
    mesh = jax.make_mesh((2,), ("x",), axis_types=(AxisType.Explicit,))

    def put(x):  # split the first axis of size 2 after the layer axis, else replicate
        spec = [None] * x.ndim
        if x.ndim > 1 and 2 in x.shape[1:]:
            spec[1 + x.shape[1:].index(2)] = "x"
        return jax.device_put(x, NamedSharding(mesh, P(*spec)))

    with jax.set_mesh(mesh):
        sharded = jax.tree.map(put, grads)
        got = _flat(jax.jit(tx.update)(sharded, tx.init(jax.tree.map(put, params)))[0])
    for name, x in want.items():
        np.testing.assert_allclose(got[name], x, atol=2e-5, err_msg=name)


def test_a_layer_axis_that_does_not_lead_is_refused_naming_the_leaf():
    model = Model(lambda r: nnx.vmap(Block, in_axes=0, out_axes=1)(r.split(L)), nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"'blocks/attn/key/kernel' has shape \(6, 3, 2, 3\) but"):
        optim.nnx_layers(model)


class LoraModel(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.hidden = nnx.LoRALinear(6, 10, lora_rank=3, rngs=rngs)
        self.out = nnx.LoRALinear(10, 4, lora_rank=2, rngs=rngs)

    def __call__(self, x):
        return self.out(jax.nn.tanh(self.hidden(x)))


def test_lora_roles_and_training_with_the_base_frozen():
    """LoRA A/B get roles of their own: with wrt=nnx.LoRAParam only they train, B on Muon
    (its first update the polar factor of its gradient), A on Adam; the base kernels stay
    bit-identical and the loss falls."""
    model = LoraModel(nnx.Rngs(0))
    layers = optim.nnx_layers(model)
    assert layers.role(("hidden", "lora", "lora_b")) == "lora_b"
    assert layers.role(("hidden", "lora", "lora_a")) == "lora_a"
    assert layers.role(("out", "kernel")) == "head"
    base = {k: np.asarray(v) for k, v in _flat(nnx.to_pure_dict(nnx.state(model))).items()}
    muon = optim.muon(0.05, orthogonalizer="polar", momentum=0.0, nesterov=False,
                      shape_scale="none", matrix_axes=layers.matrix_axes)  # fmt: skip
    tx = optim.routed({"hidden+lora_b": muon, "rest": optax.adam(1e-2)}, layers.role)
    opt = nnx.Optimizer(model, tx, wrt=nnx.LoRAParam)
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((32, 6)), jnp.float32)
    y = jnp.asarray(rng.standard_normal((32, 4)), jnp.float32)

    def loss_fn(m):
        return jnp.mean((m(x) - y) ** 2)

    @nnx.jit
    def step(m, o):
        loss, g = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, nnx.LoRAParam))(m)
        o.update(m, g)
        return loss, g

    b_before = np.asarray(model.hidden.lora.lora_b[...])
    first, g = step(model, opt)
    b_grad = np.asarray(g["hidden"]["lora"]["lora_b"][...])
    b_step = np.asarray(model.hidden.lora.lora_b[...]) - b_before
    np.testing.assert_allclose(b_step, -0.05 * _polar(b_grad), atol=2e-5)
    for _ in range(40):
        last, _ = step(model, opt)
    assert float(last) < 0.8 * float(first)
    after = _flat(nnx.to_pure_dict(nnx.state(model)))
    for k, v in base.items():
        if "lora" not in k:
            np.testing.assert_array_equal(after[k], v, err_msg=k)


@pytest.mark.parametrize(
    "role_fn",
    [
        lambda path, leaf: "w_in" if path[-1] == "kernel" else "bias",  # string tuples
        lambda path, leaf: (
            "w_in" if any(getattr(k, "key", None) == "kernel" for k in path) else "bias"
        ),  # jax DictKey entries (.key)
        lambda path, leaf: "w_in" if path[-1].name == "kernel" else "bias",  # GetAttrKey
        lambda path, leaf: (
            "w_in"
            if isinstance(path[1], int) and path[1].idx == 1 and path[-1] == "kernel"
            else "bias"
        ),  # SequenceKey (.idx) on a list index
    ],
    ids=["str", "DictKey", "GetAttrKey", "SequenceKey"],
)
def test_role_fn_for_either_path_form(role_fn):
    layer = {"kernel": jnp.ones((5, 2)), "bias": jnp.ones(2)}
    params = {"l": [{"kernel": jnp.ones((3, 5))}, layer]}
    grads = jax.tree.map(lambda x: jnp.full_like(x, 2.0), params)
    tx = optim.routed({"w_in": optax.sgd(1.0), "bias": optax.sgd(0.5)}, role_fn)
    upd = tx.update(grads, tx.init(params), params)[0]
    scale = -1.0 if role_fn(optim.path_keys(("l", 1, "kernel")), None) == "w_in" else -0.5
    np.testing.assert_allclose(upd["l"][1]["kernel"], 2.0 * scale)
    np.testing.assert_allclose(upd["l"][1]["bias"], -1.0)
    assert scale == -1.0


def test_role_fn_error_shows_the_path_form():
    bad = lambda path, leaf: "w_in" if path[-1] == ("kernel",) else "bias"  # noqa: E731
    tx = optim.routed({"w_in": optax.sgd(1.0), "bias": optax.sgd(0.5)}, bad)
    with pytest.raises(ValueError, match=r"tuple of str/int keys.*\('w', 'kernel'\)"):
        tx.init({"w": {"kernel": jnp.ones((2, 3))}})
