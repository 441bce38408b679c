"""Conformance: one test per silent failure a peer's Muon shipped (docs/peers.md).

Each test builds the situation the peer got wrong and asserts that amemory gives the
right update (against numpy's SVD polar factor or the per-matrix computation) or
refuses with a ValueError. Small matrices with distinct sizes; the exact polar factor
(``orthogonalizer="polar"``) where the check is about which matrix is orthogonalised.
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
from amemory.models import transformer as tfm

EXACT = dict(momentum=0.0, orthogonalizer="polar", shape_scale="none")


def _polar(g):  # numpy reference: U V^T of the SVD, per matrix of a stack
    u, _, vt = np.linalg.svd(np.asarray(g, np.float64), full_matrices=False)
    return u @ vt


def _update(tx, g, params=None):
    params = jnp.zeros(g.shape) if params is None else params
    return np.asarray(tx.update(g, tx.init(params), params)[0])


def _grad(shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def test_newton_schulz_runs_under_every_parallel_layout():
    """DeepSpeed #8442: with ZeRO stage 0 (plain data parallel) Muon ran no Newton-Schulz.
    Here every layout (one device, GSPMD on split parameters, the owner layout on a
    data-parallel mesh with replicated parameters and on an FSDP mesh, Explicit axes,
    pmap) returns the polar factor of the gradient."""
    g = _grad((24, 40))
    want = -_polar(g)
    dp = jax.make_mesh((4, 1), ("data", "fsdp"), axis_types=(AxisType.Auto,) * 2)
    fsdp = jax.make_mesh((4,), ("fsdp",), axis_types=(AxisType.Explicit,))
    cases = {
        "single": (optim.muon(1.0, **EXACT), None),
        "gspmd": (optim.muon(1.0, **EXACT), NamedSharding(fsdp, P(None, "fsdp"))),
        "owner/data-parallel": (
            optim.muon(1.0, ns_mesh=(dp, "fsdp"), distributed="owner", **EXACT),
            NamedSharding(dp, P()),
        ),
        "owner/fsdp": (
            optim.muon(1.0, ns_mesh=(fsdp, "fsdp"), distributed="owner", **EXACT),
            NamedSharding(fsdp, P("fsdp", None)),
        ),
    }
    for name, (tx, sharding) in cases.items():
        gs = g if sharding is None else jax.device_put(g, sharding)
        got = jax.jit(lambda a, tx=tx: tx.update(a, tx.init(a), a)[0])(gs)
        np.testing.assert_allclose(np.asarray(got), want, atol=2e-5, err_msg=name)
        assert np.abs(np.asarray(got) - np.asarray(-g)).max() > 0.5  # not the raw gradient
    tx = optim.muon(1.0, **EXACT)  # pmap: one replica per device, as DDP / ZeRO-0
    got = jax.pmap(lambda a: tx.update(a, tx.init(a), a)[0])(jnp.stack([g] * 4))
    np.testing.assert_allclose(np.asarray(got), np.stack([want] * 4), atol=2e-5)


def test_owner_layout_orthogonalises_the_whole_matrix_not_each_shard():
    """PaddleFleet #1703: under EP/FSDP each rank orthogonalised its own slab of a matrix.
    A [32, 24] matrix split by rows over 4 devices: the update is the polar factor of the
    whole matrix, and far from the four slabs' polar factors stacked."""
    mesh = jax.make_mesh((4,), ("fsdp",), axis_types=(AxisType.Explicit,))
    g = _grad((32, 24), seed=1)
    tx = optim.muon(1.0, ns_mesh=(mesh, "fsdp"), distributed="owner", **EXACT)
    gs = jax.device_put(g, NamedSharding(mesh, P("fsdp", None)))
    got = np.asarray(jax.jit(lambda a: tx.update(a, tx.init(a), a)[0])(gs))
    np.testing.assert_allclose(got, -_polar(g), atol=2e-5)
    slabs = np.concatenate([_polar(s) for s in np.split(np.asarray(g), 4)])
    assert np.abs(got + slabs).max() > 0.1


def test_each_expert_is_normalised_on_its_own():
    """Marin #8621 (MuonH): one norm over all experts of a stack, so one expert's scale
    shrank the others' updates. Expert 0's gradient scaled by 1e4 leaves expert 1's
    update unchanged (Frobenius pre-normalisation per matrix, Newton-Schulz), also with
    NorMuon's second moment and the per-matrix PolarGrad scaling."""
    g = np.asarray(_grad((3, 12, 20), seed=2))
    loud = g.copy()
    loud[0] *= 1e4
    for tx in (
        optim.muon(1.0, matrix_axes=(-2, -1)),
        optim.normuon(1.0, matrix_axes=(-2, -1)),
        optim.muon(1.0, matrix_axes=(-2, -1), nuclear_scale="matrix", momentum=0.0),
    ):
        a, b = _update(tx, jnp.asarray(g)), _update(tx, jnp.asarray(loud))
        np.testing.assert_allclose(b[1:], a[1:], rtol=1e-4, atol=1e-6)


def test_expert_axis_is_a_batch_axis_not_part_of_the_matrix():
    """MaxText before PR #4843 used the expert axis as a reduction axis of the matrix.
    A [4, 8, 6] expert stack with matrix_axes=(-2, -1): expert e's update is polar(G[e]),
    in the GSPMD and in the owner layout (stack split along experts), and nnx_layers reads
    an Einsum's expert axis ("EBD,EDF->EBF") as a batch axis."""
    g = _grad((4, 8, 6), seed=3)
    want = -_polar(g)
    mesh = jax.make_mesh((4,), ("x",), axis_types=(AxisType.Explicit,))
    owner = optim.muon(1.0, matrix_axes=(-2, -1), ns_mesh=(mesh, "x"), **EXACT)
    gs = jax.device_put(g, NamedSharding(mesh, P("x", None, None)))
    for tx, x in ((optim.muon(1.0, matrix_axes=(-2, -1), **EXACT), g), (owner, gs)):
        got = jax.jit(lambda a, tx=tx: tx.update(a, tx.init(a), a)[0])(x)
        np.testing.assert_allclose(np.asarray(got), want, atol=2e-5)
    whole = _polar(np.asarray(g).transpose(1, 0, 2).reshape(8, 24))  # E inside the matrix
    assert np.abs(want + whole.reshape(8, 4, 6).transpose(1, 0, 2)).max() > 0.1
    layer = nnx.Einsum("EBD,EDF->EBF", (4, 8, 6), rngs=nnx.Rngs(0))
    assert optim.nnx_layers(layer, heads=()).matrix_axes("kernel", layer.kernel) == ((1,), (2,))


@pytest.mark.parametrize("scale", [1e-4, 1e-7])
def test_torch_preset_is_scale_invariant(scale):
    """NVIDIA Emerging-Optimizers #230: ``X / (||X|| + eps)`` degenerates for tiny
    gradients. preset="torch" divides by max(||X||, eps) as torch.optim.Muon: a gradient
    scaled by 1e-7 (entries ~1e-7, norm ~3e-6) gives the same update; zero stays zero.
    The additive form (preset="jordan", as Keller Jordan's reference) differs by ~25%."""
    g = _grad((64, 32), seed=4)
    torch_tx, add_tx = optim.muon(1.0, preset="torch"), optim.muon(1.0, preset="jordan")
    ref = _update(torch_tx, g)
    got = _update(torch_tx, g * scale)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    assert not np.any(_update(torch_tx, jnp.zeros_like(g)))  # zero in, zero out, no NaN
    if scale == 1e-7:  # the additive form: eps is 3% of the norm here
        drift = np.abs(_update(add_tx, g * scale) - _update(add_tx, g)).max()
        assert drift > 0.1 * np.abs(ref).max()


def test_head_and_embeddings_are_not_taken_for_hidden_matrices():
    """optax.contrib.muon sends every 2-D leaf to Muon, the embedding and the output
    layer included. amemory routes by role: the amemory transformer's embedding and head,
    the NNX miniGPT tutorial's embeddings and `output_layer`, and a CNN classifier are
    not 'hidden'; a routing table that leaves them unclaimed is a ValueError."""
    config = tfm.preset("tiny")
    _, params = tfm.init(config, jax.random.key(0))
    rules = {"hidden": optim.muon(0.02), "rest": optax.adam(1e-3)}
    rows = optim.routing_table(params, rules, tfm.role_of)
    to_muon = {r.path for r in rows if r.transform == "hidden"}
    assert to_muon and not any("emb" in p or "head" in p for p in to_muon)

    class GPT(nnx.Module):  # the miniGPT tutorial's names
        def __init__(self, rngs):
            self.token_emb = nnx.Embed(37, 16, rngs=rngs)
            self.linear1 = nnx.Linear(16, 16, rngs=rngs)
            self.output_layer = nnx.Linear(16, 37, rngs=rngs)

    model = GPT(nnx.Rngs(0))
    layers = optim.nnx_layers(model)
    state = nnx.state(model, nnx.Param)
    roles = {r.path: r.role for r in optim.routing_table(state, rules, layers.role)}
    assert (roles["token_emb/embedding"], roles["output_layer/kernel"]) == ("embed", "head")
    assert roles["linear1/kernel"] == "dense"
    with pytest.raises(ValueError, match="head"):  # nothing claims the head: refused
        optim.routed({"hidden": optim.muon(0.02)}, layers.role).init(state)
