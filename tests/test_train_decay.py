"""Weight decay as large runs use it, and parametrizations as config (amemory.train.optimizers).

References written by hand: with a zero gradient every direction is 0, so a leaf moves by
its decay alone: ``theta (1 - lr wd)`` (or ``theta (1 - wd r)`` for independent decay, r =
base_width / width), or not at all where the mask leaves it out. muP's rates from Tensor
Programs V (arXiv 2203.03466) Table 3, Adam column: hidden and output weights
``adam_lr * r``, input weights (embeddings), norm scales and biases ``adam_lr``; Adam's
first step is ``g / (|g| + eps)`` in numpy.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from train_helpers import LM_CONFIG, lm_config

from amemory import optim
from amemory.train import config as C
from amemory.train import engine as E
from amemory.train import optimizers, parallel
from amemory.train.loop import _routes

ROLES = {"q": "q", "scale": "norm", "b": "bias", "head": "head", "embed": "embed"}
LR, ADAM_LR, WD, ADAM_WD = 0.05, 0.01, 0.3, 0.2


def _params():
    rng = np.random.default_rng(0)
    shapes = {"q": (5, 7), "scale": (3, 7), "b": (7,), "head": (7, 11), "embed": (11, 7)}
    return {k: jnp.asarray(rng.standard_normal(s), jnp.float32) for k, s in shapes.items()}


def _matrix_axes(path, leaf):  # the task's rule: norm scales (even stacked) and biases are not
    return None if ROLES[path[-1]] in ("norm", "bias") else (0, 1)


def _build(width=None, **over):
    base = {"optimizer.name": "muon", "optimizer.muon_roles": "q", "optimizer.lr": LR,
            "optimizer.adam_lr": ADAM_LR, "optimizer.weight_decay": WD,
            "optimizer.adam_weight_decay": ADAM_WD, "schedule.name": "constant",
            "schedule.warmup_steps": 0, **over}  # fmt: skip
    c = C.load_config(LM_CONFIG, [f"{k}={v}" for k, v in base.items()])
    C.validate(c)
    p = _params()
    return optimizers.build(c, p, dict(ROLES), matrix_axes=_matrix_axes, width=width), p


def _step(built, params, grads=None):
    grads = jax.tree.map(jnp.zeros_like, params) if grads is None else grads
    u, _ = built.tx.update(grads, built.tx.init(params), params)
    return jax.tree.map(np.asarray, optax.apply_updates(params, u))


def test_only_matrices_decay_each_half_by_its_own_rate():
    built, p = _build()
    new = _step(built, p)
    for k in ("scale", "b", "embed"):  # bit-identical: not decayed
        np.testing.assert_array_equal(new[k], p[k])
    f32 = np.float32
    np.testing.assert_array_equal(new["q"], p["q"] + -f32(LR) * (f32(WD) * p["q"]))
    np.testing.assert_array_equal(
        new["head"], p["head"] + -f32(ADAM_LR) * (f32(ADAM_WD) * p["head"])
    )
    built, p = _build(**{"optimizer.decay_embeddings": "true"})
    np.testing.assert_allclose(
        _step(built, p)["embed"], p["embed"] * (1 - ADAM_LR * ADAM_WD), rtol=1e-6
    )
    built, p = _build(**{"optimizer.name": "adam"})  # every leaf is Adam's own: weight_decay
    new = _step(built, p)
    for k in ("q", "head"):
        np.testing.assert_allclose(new[k], p[k] * (1 - ADAM_LR * WD), rtol=1e-6)
    np.testing.assert_array_equal(new["scale"], p["scale"])


def test_a_matrix_optimizer_holding_vectors_masks_their_decay():
    """signgd on every role: its norm scale, bias and embedding stay (the factory's mask)."""
    built, p = _build(**{"optimizer.name": "signgd", "optimizer.muon_roles": "all"})
    assert {row[3] for row in built.table} == {"signgd"}
    new = _step(built, p)
    for k in ("scale", "b", "embed"):
        np.testing.assert_array_equal(new[k], p[k])
    for k in ("q", "head"):
        np.testing.assert_allclose(new[k], p[k] * (1 - LR * WD), rtol=1e-6)


def test_independent_decay_is_wd_over_width_whatever_the_rate():
    for lr in (LR, 10 * LR):
        built, p = _build(
            width=28, **{"optimizer.weight_decay_scaling": "independent", "optimizer.lr": lr,
                         "optimizer.base_width": 7, "optimizer.parametrization": "mup"},
        )  # fmt: skip
        new = _step(built, p)
        np.testing.assert_allclose(new["q"], p["q"] * (1 - WD * 7 / 28), rtol=1e-6)
        # not scaled by Adam's rate nor by muP's rate multiplier on the head
        np.testing.assert_allclose(new["head"], p["head"] * (1 - ADAM_WD * 7 / 28), rtol=1e-6)
        np.testing.assert_array_equal(new["b"], p["b"])
    with pytest.raises(ValueError, match="optimizer.base_width=7 needs a task with a model width"):
        _build(**{"optimizer.base_width": 7})


def test_mup_rates_per_role_match_tensor_programs_v_table_3():
    rng = np.random.default_rng(1)
    p = _params()
    g = {k: jnp.asarray(rng.standard_normal(v.shape), jnp.float32) for k, v in p.items()}
    over = {"optimizer.name": "adam", "optimizer.weight_decay": 0.0, "optimizer.eps": 1e-8,
            "optimizer.parametrization": "mup", "optimizer.base_width": 7}  # fmt: skip
    built, _ = _build(width=28, **over)
    new = _step(built, p, g)
    rate = {"q": 7 / 28, "head": 7 / 28, "embed": 1.0, "scale": 1.0, "b": 1.0}  # Table 3
    for k, r in rate.items():
        gk = np.asarray(g[k], np.float64)
        want = np.asarray(p[k], np.float64) - ADAM_LR * r * gk / (np.abs(gk) + 1e-8)
        np.testing.assert_allclose(new[k], want, rtol=1e-6, atol=1e-7, err_msg=k)
    # Muon's leaves keep their rate under mup (spectral shape_scale is Muon's counterpart)
    sp, _ = _build(
        width=28, **{**over, "optimizer.name": "muon", "optimizer.parametrization": "sp"}
    )
    mup, _ = _build(width=28, **{**over, "optimizer.name": "muon"})
    np.testing.assert_array_equal(_step(mup, p, g)["q"], _step(sp, p, g)["q"])


def test_mup_scales_the_head_init_and_refuses_a_tied_head(corpus):
    heads = {}
    for name in ("sp", "mup"):
        cfg = lm_config(corpus, **{"optimizer.parametrization": name, "model.tied_head": "false",
                                    "optimizer.base_width": 6})  # fmt: skip
        b = E.build(cfg, parallel.placement(cfg.parallel))
        assert b.task.width == 24  # the tiny preset: d_model 24, so r = 1/4
        heads[name] = np.asarray(b.engine.init_state().params["head"]["kernel"])
    np.testing.assert_array_equal(heads["mup"], heads["sp"] * 0.5)  # init std x sqrt(r)
    cfg = lm_config(corpus, **{"optimizer.parametrization": "mup", "model.tied_head": "true"})
    with pytest.raises(ValueError, match="set model.tied_head=false"):
        E.build(cfg, parallel.placement(cfg.parallel))


def test_the_routing_table_shows_the_decay_mask():
    built, p = _build()
    wd = {row[0]: row[5] for row in built.table}
    assert wd == {"q": WD, "scale": 0.0, "b": 0.0, "head": ADAM_WD, "embed": 0.0}
    line = "routing: bias,embed,norm -> adam; head -> adam wd=0.2; q -> muon wd=0.3"
    assert _routes(built.table) == line
    rows = optim.routing_table(
        p, {"q": 0, "rest": 1}, lambda path: ROLES[path[-1]], weight_decay=wd
    )
    text = optim.format_routing_table(rows)
    assert text.splitlines()[0].endswith("transform  wd")
    assert re.search(r"^head .* rest +0\.2$", text, re.M) and re.search(
        r"^b .* rest +0$", text, re.M
    )


def test_bad_values_name_the_field():
    cases = [("parametrization", "ntk", "('sp', 'mup')"),
             ("weight_decay_scaling", "x", "('lr', 'independent')")]  # fmt: skip
    for field, value, allowed in cases:
        with pytest.raises(
            ValueError,
            match=re.escape(f"config.optimizer.{field}='{value}'; allowed values: {allowed}"),
        ):
            C.validate(C.load_config(LM_CONFIG, [f"optimizer.{field}={value}"]))
    with pytest.raises(ValueError, match="config.optimizer.adam_weight_decay=-1.0"):
        C.validate(C.load_config(LM_CONFIG, ["optimizer.adam_weight_decay=-1"]))
