"""amemory.optim under flax.nnx.Optimizer: the same roles at init and update, foreign nnx
models (Linear, MultiHeadAttention with 3-D kernels), and the label-mismatch error.

References: the functional path (tx.init / tx.update on plain dict params, which never
sees nnx paths) and the exact polar factor from numpy's SVD.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

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
