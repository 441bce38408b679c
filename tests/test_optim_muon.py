"""Muon / NorMuon against independent references: optax.contrib.muon, numpy re-implementations
of the published PyTorch updates (Keller Jordan, torch.optim.Muon, Moonlight, Wang et al.,
NorMuon), numpy SVD; plus jit / pmap / sharded-jit / Orbax / inject_hyperparams plumbing.

Matrix layouts: amemory sees leaves as [fan_in, fan_out] (Flax kernels); the PyTorch
references hold W as [out, in]. The numpy references below work in the PyTorch layout on
the transposed arrays, so a wrong fan_in/fan_out convention fails loudly (shapes are
distinct and non-square).
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from optax.contrib import muon as optax_muon

from amemory.optim import (
    MuonState,
    collect_diagnostics,
    muon,
    newton_schulz,
    normuon,
    orthogonality_error,
    scale_by_muon,
)

SHAPES = {"wide": (12, 20), "tall": (20, 12), "square": (16, 16), "wide2": (12, 20)}


def _params(key=0, dtype=jnp.float32):
    rng = np.random.default_rng(key)
    return {k: jnp.asarray(rng.standard_normal(s) * 0.1, dtype) for k, s in SHAPES.items()}


def _grads(rng, params):
    return {k: jnp.asarray(rng.standard_normal(v.shape), v.dtype) for k, v in params.items()}


# ---------------------------------------------------------------- optax.contrib.muon


def test_preset_optax_matches_optax_contrib_muon_10_steps(weight_decay=0.05):
    """Tolerance: |diff| <= 2e-6 + 1e-5 |ref| per entry (fp32 rounding; updates are ~0.05)."""
    params = _params()
    ours = muon(0.1, preset="optax", weight_decay=weight_decay)
    ref = optax_muon(0.1, weight_decay=weight_decay)
    s, rs = ours.init(params), ref.init(params)
    up, rup = jax.jit(ours.update), jax.jit(ref.update)
    p, rp = params, params
    rng = np.random.default_rng(1)
    for _ in range(10):
        g = _grads(rng, params)
        u, s = up(g, s, p)
        ru, rs = rup(g, rs, rp)
        chex.assert_trees_all_close(u, ru, atol=2e-6, rtol=1e-5)
        p, rp = optax.apply_updates(p, u), optax.apply_updates(rp, ru)
    chex.assert_trees_all_close(p, rp, atol=1e-5)


# ---------------------------------------------------------------- numpy references


def _np_ns(x, steps=5, eps=1e-7):
    """Keller Jordan's zeropower_via_newtonschulz5, in float64 (reference runs bf16)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    tall = x.shape[0] > x.shape[1]
    X = x.T if tall else x
    X = X / (np.linalg.norm(X) + eps)
    for _ in range(steps):
        A = X @ X.T
        X = a * X + (b * A + c * A @ A) @ X
    return X.T if tall else X


def _np_peer_step(W, G, buf, *, lr, wd, beta, form, nesterov, scale):
    """One step of a PyTorch-style Muon on W [out, in]; returns (W, buf)."""
    if form == "ema":
        buf = buf + (1 - beta) * (G - buf)  # buf.lerp_(G, 1 - beta)
        U = G + beta * (buf - G) if nesterov else buf  # G.lerp(buf, beta)
    else:
        buf = beta * buf + G
        U = G + beta * buf if nesterov else buf
    O = _np_ns(U)
    rows, cols = W.shape
    if scale == "jordan":
        O = O * max(1.0, rows / cols) ** 0.5
    elif scale == "moonlight":
        O = O * 0.2 * max(rows, cols) ** 0.5
    W = W * (1 - lr * wd) - lr * O
    return W, buf


PEERS = {
    # preset: (form, nesterov, scale, weight decay of the preset)
    "jordan": ("ema", True, "jordan", 0.0),
    "torch": ("ema", True, "jordan", 0.1),
    "moonlight": ("sum", True, "moonlight", 0.1),
    "wang2025": ("sum", False, "none", 0.0),
}


@pytest.mark.parametrize("preset", sorted(PEERS))
def test_presets_match_numpy_reference_of_the_peer(preset):
    """fp32 NS (ns_dtype=None) against a float64 numpy reference; the peers run NS in bf16."""
    form, nesterov, scale, wd = PEERS[preset]
    lr, beta = 0.05, 0.95
    params = _params(2)
    tx = muon(lr, preset=preset, ns_dtype=None)
    state = tx.init(params)
    update = jax.jit(tx.update)
    Wt = {k: np.asarray(v, np.float64).T for k, v in params.items()}  # torch layout [out, in]
    bufs = {k: np.zeros_like(w) for k, w in Wt.items()}
    rng = np.random.default_rng(3)
    p = params
    for _ in range(6):
        g = _grads(rng, params)
        u, state = update(g, state, p)
        p = optax.apply_updates(p, u)
        for k in Wt:
            Gt = np.asarray(g[k], np.float64).T
            Wt[k], bufs[k] = _np_peer_step(
                Wt[k], Gt, bufs[k], lr=lr, wd=wd, beta=beta, form=form, nesterov=nesterov,
                scale=scale,
            )  # fmt: skip
    for k in Wt:
        np.testing.assert_allclose(np.asarray(p[k]).T, Wt[k], atol=2e-5, err_msg=f"{preset}/{k}")


def _np_normuon_step(G, buf, v, beta=0.95, beta2=0.95):
    """Official normuon_update (github.com/zichongli5/NorMuon), torch layout [out, in]."""
    buf = buf + (1 - beta) * (G - buf)
    U = G + beta * (buf - G)
    O = _np_ns(U)
    vnorm = np.linalg.norm(O)
    v_mean = np.mean(O * O, axis=-1, keepdims=True)
    v = v + (1 - beta2) * (v_mean - v)
    O = O / (np.sqrt(v) + 1e-10)
    O = O * vnorm / (np.linalg.norm(O) + 1e-10)
    O = O * max(1.0, G.shape[0] / G.shape[1]) ** 0.5
    return O, buf, v


def test_normuon_matches_official_update():
    params = _params(4)
    tx = normuon(1.0)
    state = tx.init(params)
    update = jax.jit(tx.update)
    bufs = {k: np.zeros(v.shape[::-1]) for k, v in params.items()}
    vs = {k: np.zeros((v.shape[1], 1)) for k, v in params.items()}
    rng = np.random.default_rng(5)
    for _ in range(4):
        g = _grads(rng, params)
        u, state = update(g, state)
        for k in params:
            O, bufs[k], vs[k] = _np_normuon_step(np.asarray(g[k], np.float64).T, bufs[k], vs[k])
            np.testing.assert_allclose(-np.asarray(u[k]).T, O, atol=3e-5, err_msg=k)
    assert state[0].nu["tall"].shape == (12,)


def test_paper_update_is_minus_lr_polar_in_float64():
    """momentum=0, exact polar, no scaling: W <- W - lr msgn(G) (docs/science.md, notation)."""
    rng = np.random.default_rng(6)
    g = rng.standard_normal((9, 7))
    g = g - g.mean(axis=0, keepdims=True)  # 1^T G = 0: rank deficient
    u_, s_, vh_ = np.linalg.svd(g, full_matrices=False)
    ref = -0.3 * (u_[:, s_ > 1e-10] @ vh_[s_ > 1e-10])
    with jax.enable_x64(True):
        tx = muon(0.3, momentum=0.0, orthogonalizer="polar", shape_scale="none")
        w = jnp.zeros((9, 7), jnp.float64)
        u, _ = tx.update(jnp.asarray(g), tx.init(w), w)
        assert u.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(u), ref, atol=1e-12)


# ---------------------------------------------------------------- structure


def test_batched_leaves_equal_python_loop_and_matrix_axes():
    rng = np.random.default_rng(7)
    params = {
        "stack": jnp.asarray(rng.standard_normal((3, 12, 20)), jnp.float32),  # [L, in, out]
        "mat": jnp.asarray(rng.standard_normal((20, 12)), jnp.float32),
        "heads": jnp.asarray(rng.standard_normal((2, 6, 20)), jnp.float32),  # [H, hd, d]
    }

    def axes(path, leaf):
        return ((0, 1), 2) if path[-1] == "heads" else (-2, -1)

    tx = scale_by_muon(momentum=0.0, matrix_axes=axes, shape_scale="none")
    u, _ = jax.jit(tx.update)(params, tx.init(params))
    tx2 = scale_by_muon(momentum=0.0, matrix_axes=axes, shape_scale="none", batch_leaves=False)
    u2, _ = tx2.update(params, tx2.init(params))
    chex.assert_trees_all_close(u, u2, atol=1e-5)
    for i in range(3):
        np.testing.assert_allclose(u["stack"][i], newton_schulz(params["stack"][i]), atol=1e-5)
    np.testing.assert_allclose(u["mat"], newton_schulz(params["mat"]), atol=1e-5)
    flat = newton_schulz(params["heads"].reshape(12, 20)).reshape(2, 6, 20)
    np.testing.assert_allclose(u["heads"], flat, atol=1e-5)


def test_non_matrix_leaf_raises_with_path_and_shape():
    tx = muon(0.1)
    with pytest.raises(ValueError, match=r"'layer/bias'.*\(7,\)"):
        tx.init({"layer": {"bias": jnp.zeros(7), "kernel": jnp.zeros((7, 7))}})
    with pytest.raises(ValueError, match=r"matrix_axes"):
        tx.init({"w": jnp.zeros((2, 3, 4))})
    with pytest.raises(ValueError, match="disjoint"):
        muon(0.1, matrix_axes=(0, 0)).init({"w": jnp.zeros((3, 3))})


def test_unknown_preset_or_option_lists_allowed():
    with pytest.raises(ValueError, match=r"moonlight.*wang2025"):
        muon(0.1, preset="keller")
    with pytest.raises(ValueError, match=r"unknown option.*'beta'.*momentum"):
        muon(0.1, beta=0.9)
    with pytest.raises(ValueError, match=r"shape_scale.*rms_match"):
        muon(0.1, shape_scale="mup")
    with pytest.raises(ValueError, match="momentum"):
        muon(0.1, momentum=1.5)
    with pytest.raises(ValueError, match="momentum_form"):
        muon(0.1, momentum_form="adam")


def test_inject_hyperparams_and_schedule():
    params = _params()
    g = _grads(np.random.default_rng(8), params)
    tx = optax.inject_hyperparams(muon)(learning_rate=0.1, preset="jordan", momentum=0.9)
    state = tx.init(params)
    u1, state = jax.jit(tx.update)(g, state, params)
    state.hyperparams["learning_rate"] = jnp.asarray(0.05)
    u2, _ = jax.jit(tx.update)(g, state, params)
    plain = muon(0.1, preset="jordan", momentum=0.9)
    u_ref, _ = plain.update(g, plain.init(params), params)
    chex.assert_trees_all_close(u1, u_ref, atol=1e-6)
    assert np.isfinite(np.asarray(u2["wide"])).all()
    # momentum is injectable through scale_by_muon (muon() injects learning_rate)
    inner = optax.inject_hyperparams(scale_by_muon)(momentum=0.5)
    st = inner.init(params)
    st.hyperparams["momentum"] = jnp.asarray(0.0)
    u4, _ = jax.jit(inner.update)(g, st)
    ref0 = scale_by_muon(momentum=0.0)
    u5, _ = ref0.update(g, ref0.init(params))
    chex.assert_trees_all_close(u4, u5, atol=1e-6)
    sched = muon(optax.linear_schedule(0.1, 0.0, 10), preset="jordan")
    u3, _ = sched.update(g, sched.init(params), params)
    # first step: U = (1 - b)(1 + b) G for any b, so NS(U) is the same; lr(0) = 0.1
    chex.assert_trees_all_close(u3, u_ref, atol=1e-6)


def test_jit_pmap_and_sharded_jit_agree():
    params = {"a": jnp.ones((16, 24)) * 0.1, "b": jnp.ones((24, 16)) * 0.1}
    g = _grads(np.random.default_rng(9), params)
    tx = muon(0.1, preset="jordan")
    state = tx.init(params)
    eager, _ = tx.update(g, state, params)
    jitted, _ = jax.jit(tx.update)(g, state, params)
    chex.assert_trees_all_close(jitted, eager, atol=1e-6)

    n = jax.device_count()
    assert n == 8
    rep = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), (g, state, params))
    pm, _ = jax.pmap(tx.update)(*rep)
    for i in (0, n - 1):
        chex.assert_trees_all_close(jax.tree.map(lambda x, i=i: x[i], pm), eager, atol=1e-6)

    mesh = jax.make_mesh((n,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))
    shard = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp", None))
    put = lambda t: jax.tree.map(  # noqa: E731
        lambda x: jax.device_put(x, shard) if x.ndim == 2 else x, t
    )
    sh, sh_state = jax.jit(tx.update)(put(g), put(state), put(params))
    chex.assert_trees_all_close(sh, eager, atol=1e-6)
    assert isinstance(sh_state[0], MuonState)


def test_second_update_does_not_recompile():
    params = _params()
    tx = muon(0.1, preset="jordan")
    update = jax.jit(tx.update)
    state = tx.init(params)
    rng = np.random.default_rng(10)
    for _ in range(3):
        _, state = update(_grads(rng, params), state, params)
    assert update._cache_size() == 1


def test_orbax_roundtrip_keeps_muon_state(tmp_path):
    import orbax.checkpoint as ocp

    params = _params()
    tx = muon(0.1, preset="jordan", diagnostics=True)
    state = tx.init(params)
    _, state = tx.update(_grads(np.random.default_rng(11), params), state, params)
    ckpt = ocp.StandardCheckpointer()
    ckpt.save(tmp_path / "opt", state)
    ckpt.wait_until_finished()
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, tx.init(params))
    restored = ckpt.restore(tmp_path / "opt", abstract)
    assert isinstance(restored[0], MuonState)
    assert int(restored[0].count) == 1
    chex.assert_trees_all_close(restored, state)


def test_diagnostics_do_not_change_update_and_match_reference():
    params = _params()
    g = _grads(np.random.default_rng(12), params)
    on = muon(0.1, preset="jordan", diagnostics=True, momentum=0.0)
    off = muon(0.1, preset="jordan", momentum=0.0)
    u_on, s_on = on.update(g, on.init(params), params)
    u_off, s_off = off.update(g, off.init(params), params)
    chex.assert_trees_all_close(u_on, u_off)
    diag = collect_diagnostics(s_on)
    assert sorted(diag) == sorted(f"{n}/{k}" for k in SHAPES for n in ("ortho_error", "update_rms"))
    ref = orthogonality_error(newton_schulz(g["tall"]))
    np.testing.assert_allclose(diag["ortho_error/tall"], ref, rtol=1e-4)
    rms = np.sqrt(np.mean(np.square(np.asarray(u_off["wide"]) / -0.1)))
    np.testing.assert_allclose(diag["update_rms/wide"], rms, rtol=1e-5)
    assert collect_diagnostics(s_off) == {}


def test_shape_scales_and_mu_dtype():
    from amemory.optim import shape_scale_factor

    assert shape_scale_factor("jordan", 12, 48) == pytest.approx(2.0)
    assert shape_scale_factor("jordan", 48, 12) == 1.0
    assert shape_scale_factor("rms_match", 12, 48, 0.2) == pytest.approx(0.2 * 48**0.5)
    assert shape_scale_factor("spectral", 48, 12) == pytest.approx(0.5)
    g = {"w": jnp.asarray(np.random.default_rng(13).standard_normal((12, 48)), jnp.float32)}
    tx = scale_by_muon(momentum=0.0, shape_scale="spectral", mu_dtype=jnp.bfloat16)
    state = tx.init(g)
    assert state.mu["w"].dtype == jnp.bfloat16
    u, state = tx.update(g, state)
    np.testing.assert_allclose(u["w"], 2.0 * newton_schulz(g["w"]), atol=1e-5)
    assert u["w"].dtype == jnp.float32 and state.mu["w"].dtype == jnp.bfloat16


def test_ns_mesh_keeps_matrices_whole_under_fsdp():
    """ns_mesh: same update; no collectives inside the NS matmuls of FSDP-sharded leaves."""
    n = jax.device_count()
    mesh = jax.make_mesh((n,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))
    shard = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp", None))
    rng = np.random.default_rng(14)
    params = {
        "a": jnp.asarray(rng.standard_normal((16, 48)), jnp.float32),
        "b": jnp.asarray(rng.standard_normal((48, 16)), jnp.float32),
        "c": jnp.asarray(rng.standard_normal((24, 24)), jnp.float32),
    }
    put = lambda t: jax.tree.map(lambda x: jax.device_put(x, shard) if x.ndim == 2 else x, t)  # noqa: E731
    ref_tx = muon(0.1, preset="jordan")
    ref, _ = ref_tx.update(params, ref_tx.init(params), params)

    def collectives(tx):
        state = put(tx.init(params))
        update = jax.jit(tx.update)
        u, _ = update(put(params), state, put(params))
        chex.assert_trees_all_close(u, ref, atol=1e-6)
        text = update.lower(put(params), state, put(params)).compile().as_text()
        return sum(text.count(op) for op in ("all-gather(", "all-reduce(", "reduce-scatter("))

    plain = collectives(muon(0.1, preset="jordan"))
    whole = collectives(muon(0.1, preset="jordan", ns_mesh=(mesh, "fsdp")))
    assert whole < plain, (whole, plain)
    with pytest.raises(ValueError, match="ns_mesh"):
        muon(0.1, ns_mesh=(mesh, "tp"))


# ---------------------------------------------------------------- options, presets, stacks


def test_explicit_none_overrides_the_preset(monkeypatch):
    """muon(lr, preset="jordan", ns_dtype=None) must keep fp32 NS, not the preset's "auto"
    (bf16 off CPU). The backend is faked as GPU so that "auto" would mean bf16 here."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    params = _params(15)
    g = _grads(np.random.default_rng(16), params)
    explicit = muon(0.1, preset="jordan", ns_dtype=None)
    u, _ = explicit.update(g, explicit.init(params), params)
    ref_tx = muon(0.1, preset="jordan", ns_dtype=jnp.float32)
    ref, _ = ref_tx.update(g, ref_tx.init(params), params)
    chex.assert_trees_all_close(u, ref, atol=1e-7)
    auto = muon(0.1, preset="jordan")  # the preset's "auto": bf16 under the fake GPU
    u_auto, _ = auto.update(g, auto.init(params), params)
    assert float(jnp.max(jnp.abs(u_auto["wide"] - ref["wide"]))) > 1e-4


def test_options_are_one_object_in_every_signature():
    import dataclasses
    import inspect

    from amemory.optim import MuonOptions, adamuon, normuon, scale_by_adamuon, scale_by_normuon

    fields = [f.name for f in dataclasses.fields(MuonOptions)]
    for fn in (scale_by_muon, muon, scale_by_normuon, normuon, scale_by_adamuon, adamuon):
        params = inspect.signature(fn).parameters
        assert all(params[f].kind is inspect.Parameter.KEYWORD_ONLY for f in fields), fn
    assert inspect.signature(scale_by_adamuon).parameters["presign"].default is True
    with pytest.raises(ValueError, match=r"scale_by_normuon: unknown option\(s\) \['beta'\]"):
        scale_by_normuon(beta=0.9)
    with pytest.raises(ValueError, match="preconditioning='newton'"):
        scale_by_muon(preconditioning="newton")


@pytest.mark.parametrize("shape", [(12, 20), (3, 12, 20), (2, 3, 20, 12)])
def test_leading_stack_axes_are_batch_axes(shape):
    """matrix_axes=(-2, -1): scanned layers [L, ...] and experts [E, ...] are independent
    matrices; reference: a Python loop of NS on each matrix, scaled by its own shape."""
    g = jnp.asarray(np.random.default_rng(17).standard_normal(shape), jnp.float32)
    tx = scale_by_muon(momentum=0.0, matrix_axes=(-2, -1), shape_scale="jordan")
    u, _ = jax.jit(tx.update)({"w": g}, tx.init({"w": g}))
    flat_g = np.asarray(g).reshape((-1,) + shape[-2:])
    flat_u = np.asarray(u["w"]).reshape(flat_g.shape)
    scale = max(1.0, shape[-1] / shape[-2]) ** 0.5
    for m, o in zip(flat_g, flat_u, strict=True):
        np.testing.assert_allclose(o, scale * _np_ns(m.astype(np.float64)), atol=2e-5)
