"""The Muon family under sharded ``jit`` with ``Explicit``, ``Auto`` and mixed mesh axes.

One row of the table = one mesh (axis types), one leaf (shape, ``matrix_axes``, the mesh
axes it is split along: rows, columns, heads, experts, the contracted axis), one layout
(``gspmd`` or the ``owner`` layout) and one transform, run for two updates in ONE jit.
Reference: the same transform on the unsharded arrays (no mesh, ``distributed="gspmd"``);
the sharded update must equal it to fp32 round-off, and under ``Explicit`` axes keep the
gradient's sharding (the momentum the parameter's).
"""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from amemory import optim

E, A = AxisType.Explicit, AxisType.Auto
TRANSFORMS = {
    "muon": lambda **kw: optim.scale_by_muon(**kw),
    "normuon": lambda **kw: optim.scale_by_normuon(**kw),
    "adamuon": lambda **kw: optim.scale_by_adamuon(**kw),
    "contrib": lambda matrix_axes, **kw: optim.contrib.scale_by_muon(
        weight_dimension_numbers=optim.contrib.MuonDimensionNumbers(*matrix_axes)
    ),
    "muonh": lambda **kw: optim.muonh(0.1, **kw),  # needs params: a norm per matrix
}
# leaf kinds: shape and (in_axes, out_axes); distinct sizes so a transposed axis fails
LEAVES = {
    "dense": ((24, 32), (0, 1)),
    "heads": ((16, 4, 6), (0, (1, 2))),  # MultiHeadAttention query [d, H, d_h]
    "out": ((4, 6, 20), ((0, 1), 2)),  # MultiHeadAttention out [H, d_h, d]
    "experts": ((4, 8, 12), (1, 2)),  # expert / scanned-layer stack [E, m, n]
    "layers": ((2, 4, 8, 12), (2, 3)),  # scanned expert stack [L, E, m, n]
}
ROWS = [  # (axis types, leaf, spec, layout, transform)
    ((E,), "dense", P(None, "x"), "gspmd", "muon"),
    ((E,), "dense", P("x", None), "owner", "muon"),  # contracted (fan_in) axis split
    ((E,), "heads", P(None, "x", None), "gspmd", "muon"),  # head axis
    ((E,), "heads", P("x", None, None), "owner", "normuon"),
    ((E,), "out", P("x", None, None), "gspmd", "adamuon"),  # head axis, contracted
    ((E,), "experts", P("x", None, None), "owner", "muon"),  # expert axis: in place
    ((E,), "dense", P(None, "x"), "gspmd", "contrib"),
    ((A,), "heads", P(None, "x", None), "owner", "muon"),
    ((A,), "out", P(None, None, "x"), "gspmd", "contrib"),
    ((E, A), "dense", P("y", "x"), "owner", "muon"),
    ((A, E), "experts", P("y", None, "x"), "gspmd", "normuon"),
    ((E, E), "heads", P("y", "x", None), "owner", "adamuon"),
    ((E,), "layers", P(None, "x", None, None), "gspmd", "muonh"),  # split axis in the batch
]


def _two_updates(tx, g1, g2, state, params):
    u1, state = tx.update(g1, state, params)
    u2, state = tx.update(g2, state, params)
    return u1, u2, state


@pytest.mark.parametrize("row", range(len(ROWS)))
def test_sharded_update_equals_unsharded(row):
    types, kind, spec, layout, name = ROWS[row]
    shape, axes = LEAVES[kind]
    rng = np.random.default_rng(row)
    g1, g2, p = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    ref_tx = TRANSFORMS[name](matrix_axes=axes, distributed="gspmd")
    ref = _two_updates(ref_tx, g1, g2, ref_tx.init(p), p)[:2]

    names = ("x",) if len(types) == 1 else ("y", "x")
    mesh = jax.make_mesh((4,) if len(types) == 1 else (2, 2), names, axis_types=types)
    kw = {"ns_mesh": (mesh, "x"), "distributed": "owner"} if layout == "owner" else {}
    tx = TRANSFORMS[name](matrix_axes=axes, **({} if name == "contrib" else kw))
    sharding = NamedSharding(mesh, spec)
    params = jax.device_put(p, sharding)
    with jax.set_mesh(mesh) if row % 2 else contextlib.nullcontext():  # with/without context
        state = tx.init(params)
        u1, u2, state = jax.jit(_two_updates, static_argnums=0)(
            tx, jax.device_put(g1, sharding), jax.device_put(g2, sharding), state, params
        )
    for got, want in zip((u1, u2), ref, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-6, rtol=0)
    if E in types:  # outputs keep the input shardings (types name the Explicit axes only)
        kinds = dict(zip(names, types, strict=True))
        typed = P(*[e if e and kinds[e] == E else None for e in spec])
        assert jax.typeof(u2).sharding.spec == typed
        mu = state.mu if hasattr(state, "mu") else state[0].mu
        assert jax.typeof(mu).sharding.spec == typed


def test_owner_layout_plans_from_explicit_shardings():
    """An expert stack [E, m, n] split along E: under Explicit axes the type says so and
    each owner keeps its experts (in place); under Auto axes the layout cannot see it and
    follows the FSDP convention (the largest divisible axis: columns, an all-to-all)."""
    rows = {}
    for types in ((E,), (A,)):
        mesh = jax.make_mesh((4,), ("x",), axis_types=types)
        leaf = jax.ShapeDtypeStruct((4, 8, 12), jnp.float32, sharding=NamedSharding(mesh, P("x")))
        (rows[types[0]],) = optim.describe_layout(
            {"w": leaf}, ns_mesh=(mesh, "x"), matrix_axes=(1, 2)
        )
    assert (rows[E]["layout"], rows[E]["split"]) == ("owner/in_place", "batch")
    assert (rows[A]["layout"], rows[A]["split"]) == ("owner/all_to_all", "columns")


def _tree_on_explicit_mesh(tx, grads, params, specs, atol):
    """``tx``'s update of a dict tree split by ``specs`` on a 4-device Explicit mesh equals
    its unsharded update, and each output keeps its gradient's spec."""
    mesh = jax.make_mesh((4,), ("x",), axis_types=(E,))
    ref = tx.update(grads, tx.init(params), params)[0]
    put = lambda t: {k: jax.device_put(v, NamedSharding(mesh, specs[k])) for k, v in t.items()}
    with jax.set_mesh(mesh):
        got = jax.jit(tx.update)(put(grads), tx.init(put(params)), put(params))[0]
    for k in grads:
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(ref[k]), atol=atol, err_msg=k)
        assert jax.typeof(got[k]).sharding.spec == specs[k]


def test_contrib_drop_in_on_an_explicit_mesh():
    """optim.contrib.muon (optax.contrib.muon's API: Muon on 2-D leaves, Adam on the rest)
    on a tree split along rows, a vector and a head axis; optax's own raises here."""
    specs = {"w": P("x", None), "b": P("x"), "q": P(None, "x", None)}
    rng = np.random.default_rng(7)
    grads = {k: rng.standard_normal(s).astype(np.float32) for k, s in
             {"w": (16, 24), "b": (8,), "q": (16, 4, 6)}.items()}  # fmt: skip
    params = jax.tree.map(jnp.ones_like, grads)
    _tree_on_explicit_mesh(optim.contrib.muon(0.1), grads, params, specs, atol=1e-6)


def test_muonh_on_an_explicit_mesh():
    """MuonH (Muon then the Hyperball projection, which needs params) on split leaves
    (a stack split along its batch: the table's last row)."""
    specs = {"w": P("x", None), "e": P(None, None, "x")}
    rng = np.random.default_rng(8)
    params = {k: rng.standard_normal(s).astype(np.float32) for k, s in
              {"w": (16, 24), "e": (4, 8, 12)}.items()}  # fmt: skip
    grads = jax.tree.map(lambda w: 0.5 * w + 0.1, params)
    tx = optim.muonh(0.1, matrix_axes=(-2, -1))
    _tree_on_explicit_mesh(tx, grads, params, specs, atol=2e-6)
