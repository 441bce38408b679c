"""amemory.optim as the train config uses it: decoupled weight decay for every optimizer
name, and the allowed names derived from the optim registries.

Reference: the update rule theta <- theta - lr (u + wd theta) written in numpy with u the
optimizer's direction (sign of the gradient / of the EMA momentum, heavy-ball momentum).
"""

import re

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from train_helpers import LM_CONFIG

from amemory import optim
from amemory.train import config as C
from amemory.train import optimizers

LR, WD, MOMENTUM, BETA = 0.05, 0.3, 0.9, 0.8


def _np_direction(name, grads, state):
    g = grads
    if name == "signgd":
        return np.sign(g)
    if name == "signum":
        state["m"] = BETA * state.get("m", 0.0) + (1 - BETA) * g
        return np.sign(state["m"])
    state["m"] = MOMENTUM * state.get("m", 0.0) + g  # optax.trace: heavy ball
    return g + MOMENTUM * state["m"]  # Nesterov


@pytest.mark.parametrize("name", ["signgd", "signum", "sgd"])
def test_weight_decay_is_decoupled_for_sign_and_sgd(name):
    c = C.load_config(
        LM_CONFIG,
        [
            f"optimizer.name={name}",
            "optimizer.muon_roles=q",
            f"optimizer.lr={LR}",
            f"optimizer.weight_decay={WD}",
            f"optimizer.momentum={MOMENTUM}",
            f"optimizer.signum_beta={BETA}",
            "optimizer.nesterov=true",
            "schedule.name=constant",
            "schedule.warmup_steps=0",
        ],
    )
    rng = np.random.default_rng(0)
    w = rng.standard_normal((5, 7)).astype(np.float32)
    built = optimizers.build(c, {"w": jnp.asarray(w)}, {"w": "q"})
    params = {"w": jnp.asarray(w)}
    state = built.tx.init(params)
    ref, ref_state = w.astype(np.float64), {}
    for _ in range(3):
        g = rng.standard_normal(w.shape).astype(np.float32)
        u, state = built.tx.update({"w": jnp.asarray(g)}, state, params)
        params = optax.apply_updates(params, u)
        ref = ref - LR * (_np_direction(name, g.astype(np.float64), ref_state) + WD * ref)
    np.testing.assert_allclose(params["w"], ref, atol=1e-5)


def test_optim_functions_decouple_weight_decay():
    g = {"w": jnp.asarray([[2.0, -3.0], [0.5, -1e-3]])}
    p = {"w": jnp.asarray([[1.0, 1.0], [-4.0, 20.0]])}
    for tx in (optim.signgd(0.1, weight_decay=0.5), optim.signum(0.1, beta=0.0, weight_decay=0.5)):
        u, _ = tx.update(g, tx.init(p), p)
        np.testing.assert_allclose(u["w"], -0.1 * (np.sign(g["w"]) + 0.5 * p["w"]), rtol=1e-6)
    tx = optim.muon(0.1, momentum=0.0, orthogonalizer="polar", shape_scale="none", weight_decay=0.5)
    u, _ = tx.update(g, tx.init(p), p)
    np.testing.assert_allclose(u["w"], -0.1 * (optim.polar(g["w"]) + 0.5 * p["w"]), rtol=1e-5)


def test_allowed_names_come_from_the_registries():
    choices = C.optimizer_choices()
    assert choices["optimizer.name"] == ("adam", *optim.OPTIMIZERS)
    assert choices["optimizer.preset"] == (None, *optim.PRESETS)
    for field, allowed in [
        ("shape_scale", optim.SHAPE_SCALES),
        ("orthogonalizer", optim.ORTHOGONALIZERS),
    ]:
        match = re.escape(f"config.optimizer.{field}: {field}='x'; allowed: {allowed}")
        with pytest.raises(ValueError, match=match):  # MuonOptions' own check, dotted name
            C.validate(C.load_config(LM_CONFIG, [f"optimizer.{field}=x"]))
    params = {"w": jnp.ones((4, 6)), "s": jnp.ones(6)}
    for name in choices["optimizer.name"]:  # every allowed name builds and steps
        c = C.load_config(LM_CONFIG, [f"optimizer.name={name}", "optimizer.muon_roles=q"])
        built = optimizers.build(c, params, {"w": "q", "s": "norm"})
        u, _ = built.tx.update(params, built.tx.init(params), params)
        assert np.isfinite(np.asarray(u["w"])).all() and u["w"].shape == (4, 6)
    with pytest.raises(ValueError, match=r"optimizer.name='lion'; allowed values: \('adam'"):
        C.validate(C.load_config(LM_CONFIG, ["optimizer.name=lion"]))


def test_an_optimizer_added_as_one_row_trains_through_the_config(monkeypatch):
    """CONTRIBUTING.md's recipe: one row of optim.OPTIMIZERS makes a name the train config
    accepts, with its default learning rate. Reference: theta - lr sign(g) in numpy."""
    toy = optim.OptimizerInfo(
        lambda lr, *, weight_decay: optim.decoupled(optax.scale_by_sign(), lr, weight_decay),
        default_lr=0.25,
    )
    monkeypatch.setitem(optim.OPTIMIZERS, "toy_sign", toy)
    overrides = ["optimizer.name=toy_sign", "optimizer.muon_roles=q", "schedule.warmup_steps=0"]
    c = C.load_config(LM_CONFIG, [*overrides, "schedule.name=constant"])
    g = np.asarray([[2.0, -3.0], [0.5, 0.0]], np.float32)
    built = optimizers.build(c, {"w": jnp.zeros((2, 2))}, {"w": "q"})
    u, _ = built.tx.update({"w": jnp.asarray(g)}, built.tx.init({"w": jnp.zeros((2, 2))}))
    np.testing.assert_allclose(u["w"], -0.25 * np.sign(g))
