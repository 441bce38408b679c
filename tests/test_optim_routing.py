"""Role routing: resolution table, errors, and routed updates equal to per-role transforms."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from amemory.models.roles import GROUPS, ROLES
from amemory.optim import (
    Roles,
    collect_diagnostics,
    label_params,
    muon,
    parse_spec,
    routed,
    routing_table,
)

PARAMS = {
    "embed": {"embedding": jnp.ones((11, 8))},
    "layers": [
        {
            "attn": {r: {"kernel": jnp.ones((8, 8)) * (i + 1)} for r in ("q", "k", "v", "o")},
            "mlp": {"w_in": {"kernel": jnp.ones((8, 24))}, "w_out": {"kernel": jnp.ones((24, 8))}},
            "ln": {"scale": jnp.ones(8)},
        }
        for i in range(2)
    ],
    "head": {"kernel": jnp.ones((8, 11))},
}


def _role(path, leaf):
    if path[0] in ("embed", "head"):
        return path[0]
    if path[-1] == "scale":
        return "norm"
    return path[-2]


role_fn = Roles(_role, ROLES, GROUPS)  # the transformer's vocabulary


def test_groups_and_specs():
    assert set(GROUPS["hidden"]) == set(GROUPS["qk"] + GROUPS["vo"] + GROUPS["ffn"] + ("dense",))
    assert parse_spec("vo+ffn", role_fn)[:6] == ("v", "o", "v_up", "w_in", "w_gate", "w_out")
    assert parse_spec("v+w_in+v", role_fn) == ("v", "w_in")
    assert "router" in ROLES and not any("router" in g for g in GROUPS.values())
    assert set(parse_spec("hidden", role_fn)) <= set(ROLES)
    with pytest.raises(ValueError, match=r"unknown role or group 'mlp'.*'w_in'"):
        parse_spec("vo+mlp", role_fn)


def test_routing_table_and_labels():
    rules = {"vo+ffn": muon(0.02), "rest": optax.adam(1e-3)}
    rows = routing_table(PARAMS, rules, role_fn)
    by_path = {r.path: r for r in rows}
    assert by_path["layers/0/attn/v/kernel"].transform == "vo+ffn"
    assert by_path["layers/1/mlp/w_out/kernel"].shape == (24, 8)
    assert by_path["layers/1/attn/q/kernel"].transform == "rest"
    assert by_path["layers/0/ln/scale"].role == "norm"
    assert by_path["embed/embedding"].transform == "rest"
    assert len(rows) == len(jax.tree.leaves(PARAMS))
    labels = label_params(PARAMS, role_fn)
    assert labels["layers"][0]["attn"]["k"]["kernel"] == "k"
    one_arg = label_params(PARAMS, lambda path: _role(path, None))  # role_of(path) style
    assert one_arg == labels


def test_unclaimed_and_double_claimed_roles_raise():
    with pytest.raises(ValueError, match=r"no rule claims the role\(s\) .*'embed'.*'norm'"):
        routed({"hidden": muon(0.02)}, role_fn).init(PARAMS)
    with pytest.raises(ValueError, match=r"role 'v' is claimed by two rules.*'vo'.*'hidden'"):
        routed({"vo": muon(0.02), "hidden": muon(0.02), "rest": optax.adam(1e-3)}, role_fn)
    with pytest.raises(ValueError, match="allowed roles"):
        label_params(PARAMS, Roles(lambda p, x: "mlp", ROLES, GROUPS))


def test_routed_updates_equal_separate_transforms():
    rng = np.random.default_rng(0)
    grads = jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), x.dtype), PARAMS)
    m, a = muon(0.02, preset="jordan", diagnostics=True), optax.adam(1e-3)
    tx = routed({"hidden": m, "rest": a}, role_fn)
    state = tx.init(PARAMS)
    u, state = jax.jit(tx.update)(grads, state, PARAMS)
    w = grads["layers"][1]["mlp"]["w_in"]["kernel"]
    u_m, _ = m.update({"w": w}, m.init({"w": w}), {"w": w})
    np.testing.assert_allclose(u["layers"][1]["mlp"]["w_in"]["kernel"], u_m["w"], atol=1e-6)
    e = grads["embed"]["embedding"]
    u_a, _ = a.update(e, a.init(e), e)
    np.testing.assert_allclose(u["embed"]["embedding"], u_a, atol=1e-7)
    none_tx = routed({"none": muon(0.02), "rest": a}, role_fn)  # muon_roles="none"
    u_none, _ = none_tx.update(grads, none_tx.init(PARAMS), PARAMS)
    chex.assert_tree_all_finite(u_none)
    diag = collect_diagnostics(state)
    assert "ortho_error/layers/0/attn/q/kernel" in diag
    assert not any("embed" in k or "scale" in k for k in diag)
    chex.assert_tree_all_finite(u)
