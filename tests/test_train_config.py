"""Config loading, overrides and validation (no compilation)."""

import pytest
from train_helpers import LM_CONFIG, MEMORY_CONFIG

from amemory.train import config as C
from amemory.train import optimizers


def test_overrides_typed_and_locked():
    c = C.load_config(
        LM_CONFIG,
        [
            "optimizer.name=signgd",
            "steps=7",
            "seeds=0,1,2",
            "model.qk_norm=true",
            "optimizer.lr=1e-3",
            "schedule.warmup_steps=5",  # <= steps
        ],
    )
    assert c.optimizer.name == "signgd" and c.steps == 7 and c.seeds == (0, 1, 2)
    assert c.model.qk_norm is True and c.optimizer.lr == pytest.approx(1e-3)
    assert c.is_locked
    assert C.load_config(MEMORY_CONFIG + ":full").memory.K == 999


@pytest.mark.parametrize(
    "override, match",
    [
        ("optimizer.nam=muon", r"unknown field 'nam' in optimizer; fields: \['adam_lr'"),
        ("optimizer.name=lion", r"optimizer.name='lion'; allowed values: \('adam', 'muon'"),
        ("parallel.mode=tpu", r"parallel.mode='tpu'; allowed values"),
        ("steps=abc", r"cannot parse as int"),
        ("steps=0", r"config.steps=0; must be an integer >= 1"),
        ("optimizer.muon_roles=vo+xx", r"unknown role or group 'xx'"),
        ("seeds=1,1", r"distinct integers"),
        ("data", r"expected --config.field=value"),
        ("model.remat_policy=dots", r"model: TransformerConfig.remat_policy must be one of \("),
        ("profile_steps=5,2", r"profile_steps=\(5, 2\); must be \(\) or \(first, last\)"),
        ("optimizer.ns_dtype=fp8", r"optimizer.ns_dtype: ns_dtype='fp8'; allowed: None, 'auto'"),
        ("optimizer.ns_steps=0", r"optimizer.ns_steps: steps must be an int >= 1, got 0"),
        ("optimizer.shape_scale=x", r"optimizer.shape_scale: shape_scale='x'; allowed: \('none'"),
        ("schedule.name=step", r"schedule.name='step'; allowed values: \('constant'"),
        ("model.dtype=fp8", r"model: TransformerConfig.dtype must be one of \("),
    ],
)
def test_bad_overrides_name_field_and_allowed_values(override, match):
    with pytest.raises(ValueError, match=match):
        C.validate(C.load_config(LM_CONFIG, [override]))


@pytest.mark.parametrize(
    "override, match",
    [
        ("memory.embeddings=x", r"memory.embeddings='x'; allowed values: \('decoupled'"),
        ("prior.kind=x", r"prior.kind='x'; allowed values: \('two_level'"),
    ],
)
def test_bad_memory_overrides_fail_in_validate(override, match):
    """The memory task's registries are checked with the config (--print-config), before
    a run directory or lock exists."""
    with pytest.raises(ValueError, match=match):
        C.validate(C.load_config(MEMORY_CONFIG, [override]))


def test_engine_fields_added_once_and_overridable():
    c = C.load_config(LM_CONFIG, ["model.scan_layers=true", "profile_steps=10,15"])
    assert c.model.scan_layers is True and c.profile_steps == (10, 15)
    assert c.model.remat_policy == "nothing_saveable" and c.optimizer.ns_dtype == "auto"
    m = C.load_config(MEMORY_CONFIG)  # no model group: only the fields that apply
    assert "model" not in m and m.optimizer.ns_dtype == "auto"
    assert m.profile_steps == ()
    with pytest.raises(ValueError, match=r"unknown field 'scan_layers' in optimizer"):
        C.load_config(LM_CONFIG, ["optimizer.scan_layers=true"])


def test_seeds_with_pmap_train_as_on_one_device(tmp_path):
    """parallel.mode=pmap is the data-parallel mesh, so multi-seed runs work there: each
    seed draws its own pairs and matches the same run on one device."""
    from train_helpers import memory_config

    from amemory.train.loop import train

    runs = {
        mode: train(
            memory_config(steps=3, seeds="0,1", batch_size=16, **{"parallel.mode": mode}),
            tmp_path / mode,
        )  # fmt: skip
        for mode in ("pmap", "single")
    }
    loss = runs["pmap"]["final_train_loss"]
    assert runs["pmap"]["mode"] == "pmap" and len(loss) == 2 and loss[0] != loss[1]
    assert loss == pytest.approx(runs["single"]["final_train_loss"], rel=1e-5)


def test_parse_roles_groups():
    from amemory.models.roles import role_of
    from amemory.optim import parse_roles

    assert parse_roles("vo+ffn", role_of)[:6] == ("v", "o", "v_up", "w_in", "w_gate", "w_out")
    assert parse_roles("qk+q", role_of)[:2] == ("q", "k")
    assert "kv_down" in parse_roles("qk", role_of)
    assert parse_roles("v+w_in", role_of) == ("v", "w_in")
    assert parse_roles("none", role_of) == ()


def test_schedules_closed_form():
    c = C.load_config(LM_CONFIG, ["steps=100", "schedule.warmup_steps=10", "schedule.name=linear"])
    m = optimizers.multiplier(c.schedule, 100)
    assert float(m(0)) == 0.0 and float(m(5)) == pytest.approx(0.5)
    assert float(m(10)) == pytest.approx(1.0)
    assert float(m(55)) == pytest.approx(1.0 - 0.9 * 45 / 90)
    c = C.load_config(LM_CONFIG, ["steps=100", "schedule.warmup_steps=0", "schedule.name=wsd"])
    m = optimizers.multiplier(c.schedule, 100)  # 80 stable steps, 20 decay to 0.1
    assert float(m(79)) == pytest.approx(1.0) and float(m(90)) == pytest.approx(0.55)


def test_muon_on_non_matrix_rejected_before_compile():
    import jax

    c = C.load_config(LM_CONFIG, ["optimizer.muon_roles=all"])
    params = {
        "w": jax.ShapeDtypeStruct((4, 4), "float32"),
        "s": jax.ShapeDtypeStruct((4,), "float32"),
    }
    roles = {"w": "q", "s": "norm"}
    with pytest.raises(ValueError, match=r"routes s \(role 'norm', shape \(4,\)\) to muon"):
        optimizers.build(c, params, roles)
    built = optimizers.build(c, params, {"w": "q", "s": "norm"}, muon_roles=("q",))
    assert [r[3] for r in built.table] == ["adam", "muon"]  # leaves in key order: s, w
    # Stacked (scanned) layout: a norm scale [L, D] is 2-D but not a matrix.
    from amemory.models.roles import matrix_axes

    stacked = {
        "layers": {
            "attn": {"q": {"kernel": jax.ShapeDtypeStruct((3, 4, 4), "float32")}},
            "attn_norm": {"scale": jax.ShapeDtypeStruct((3, 4), "float32")},
        }
    }
    roles = {"layers": {"attn": {"q": {"kernel": "q"}}, "attn_norm": {"scale": "norm"}}}
    with pytest.raises(ValueError, match=r"routes layers/attn_norm/scale \(role 'norm', shape"):
        optimizers.build(c, stacked, roles, matrix_axes=matrix_axes)
    ok = optimizers.build(c, stacked, roles, muon_roles=("q",), matrix_axes=matrix_axes)
    assert [r[3] for r in ok.table] == ["muon", "adam"]


def test_cli_rejects_bad_overrides_before_training(capsys, tmp_path):
    from amemory.train import cli

    rc = cli.main(["--config", LM_CONFIG, "--workdir", str(tmp_path), "--config.optimizer.name=x"])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "allowed values" in err
    assert cli.main(["--config", LM_CONFIG, "--workdir", str(tmp_path), "--bogus"]) == 2
    args = ["--config.steps", "3", "--config.schedule.warmup_steps=0"]  # warmup <= steps
    assert cli.main(["--config", LM_CONFIG, "--print-config", *args]) == 0
    assert "steps: 3" in capsys.readouterr().out
    assert not any(tmp_path.iterdir())  # nothing was written, nothing compiled
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    helptext = " ".join(capsys.readouterr().out.split())  # the --resume rule, as loop.train's
    assert "required when it holds checkpoints" in helptext and "records no training" in helptext


def _np_newton_schulz(m, a=3.4445, b=-4.7750, c=2.0315, steps=5):
    import numpy as np

    x = m / (np.linalg.norm(m) + 1e-7)
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    for _ in range(steps):
        g = x @ x.T
        x = a * x + (b * g + c * g @ g) @ x
    return x.T if tall else x


def test_preset_defines_momentum_and_scaling_not_config_defaults():
    """optimizer.preset=wang2025 must give the paper's update (M = mu M + G, no Nesterov,
    no shape scale), whatever the config's own momentum/nesterov/shape_scale defaults say."""
    import jax.numpy as jnp
    import numpy as np

    c = C.load_config(
        LM_CONFIG,
        [
            "optimizer.preset=wang2025",
            "optimizer.muon_roles=q",
            "optimizer.lr=0.1",
            "schedule.name=constant",
            "schedule.warmup_steps=0",
        ],
    )
    assert c.optimizer.nesterov is True and c.optimizer.shape_scale == "jordan"  # defaults
    rng = np.random.default_rng(0)
    w = rng.normal(size=(5, 3)).astype(np.float32)  # tall, so the "jordan" scale would matter
    built = optimizers.build(c, {"w": jnp.asarray(w)}, {"w": "q"})
    state = built.tx.init({"w": jnp.asarray(w)})
    mom = np.zeros_like(w)
    for _ in range(3):
        g = rng.normal(size=w.shape).astype(np.float32)
        upd, state = built.tx.update({"w": jnp.asarray(g)}, state, {"w": jnp.asarray(w)})
        mom = 0.95 * mom + g  # wang2025: mu = 0.95 (arXiv 2509.26030), sum form
        np.testing.assert_allclose(
            np.asarray(upd["w"]), -0.1 * _np_newton_schulz(mom), rtol=1e-4, atol=1e-5
        )
