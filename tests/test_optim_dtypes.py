"""Every optimizer of amemory.optim keeps its state's dtypes and tree across ``update`` and
returns updates in the parameters' dtype, for float16/bfloat16/float32/float64 parameters.

As optax's own dtype test does (``optax/contrib/_common_test.py``,
``test_state_shape_dtype_shard_stability``), the check is that ``jax.lax.cond`` accepts
``update``'s result and the unchanged ``(params, state)`` as its two branches: it
refuses any difference of tree, shape or dtype.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from amemory import optim


def _role(path, leaf):
    return "bias" if path[-1] == "b" else "dense"


# name -> (factory, with a vector leaf): every row of the registry at its default learning
# rate on matrix leaves (what every optimizer is for; the Muon family and Hyperball refuse
# vectors), then variants with options, weight decay and vector leaves.
OPTIMIZERS = {
    name: (lambda info=info: info.factory(info.default_lr), False)
    for name, info in optim.OPTIMIZERS.items()
} | {
    "signum_vector": (lambda: optim.signum(1e-3), True),
    "sgd_vector": (lambda: optim.sgd(0.05, momentum=0.9), True),
    "muon_optax_preset": (lambda: optim.muon(0.02, preset="optax", weight_decay=0.1), False),
    "muon_aol_polargrad": (
        lambda: optim.muon(0.02, preconditioning="aol", nuclear_scale="matrix", diagnostics=True),
        False,
    ),
    "muon_sign_ball": (lambda: optim.muon(0.02, norm="sign"), False),
    "adamuon_decay": (lambda: optim.adamuon(3e-3, weight_decay=0.1), False),
    "signgd_vector": (lambda: optim.signgd(1e-3, weight_decay=0.1), True),
    "contrib_muon": (lambda: optim.contrib.muon(0.02), True),
    "routed": (
        lambda: optim.routed({"dense": optim.muon(0.02), "rest": optax.adamw(1e-3)}, _role),
        True,
    ),
}


def _tree(dtype, with_vector, seed):
    rng = np.random.default_rng(seed)
    shapes = {"w": (6, 10), "t": (10, 6)} | ({"b": (10,)} if with_vector else {})
    return {k: jnp.asarray(rng.standard_normal(s), dtype) for k, s in shapes.items()}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_state_and_update_dtypes_are_stable(dtype):
    with jax.enable_x64(dtype == "float64"):
        dt = jnp.dtype(dtype)
        txs = {name: make() for name, (make, _) in OPTIMIZERS.items()}
        params = {name: _tree(dt, vec, 0) for name, (_, vec) in OPTIMIZERS.items()}
        grads = {name: _tree(dt, vec, 1) for name, (_, vec) in OPTIMIZERS.items()}
        states = {name: txs[name].init(params[name]) for name in txs}

        @jax.jit
        def step(params, states):
            cond = jax.random.randint(jax.random.key(0), (), 0, 2) == 0  # not constant-folded
            out = {}
            for name, tx in txs.items():
                p, s, g = params[name], states[name], grads[name]
                u, s2 = jax.lax.cond(cond, lambda: tx.update(g, s, p), lambda: (p, s))  # noqa: B023
                out[name] = (optax.apply_updates(p, u), s2)
            return out

        for _ in range(2):
            out = step(params, states)
            params = {name: out[name][0] for name in out}
            states = {name: out[name][1] for name in out}
        for name in txs:
            assert all(x.dtype == dt for x in jax.tree.leaves(params[name])), name
