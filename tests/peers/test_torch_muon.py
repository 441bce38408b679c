"""pytorch's Muon tests, ported to amemory (our own code; torch is not needed).

Source: pytorch/pytorch ``test/optim/test_muon.py`` (read at commit 10e8fbd4), classes
``TestMuonVanillaRegression`` and ``TestMuonConvergence``; torch's optimizer is
``torch/optim/_muon.py``. Ported cases:

- ``test_vanilla_nesterov_true_matches_pre_diff_baseline`` and
  ``..._nesterov_false_...``: torch's pinned parameter and momentum values after 5 steps
  (``torch.manual_seed(42)``, ``p = randn(8, 4)``, 5 gradients ``randn_like(p)``, lr 0.02,
  momentum 0.95, weight decay 0.1 / 0) reproduced with ``muon(lr, preset="torch",
  ns_dtype="bfloat16")``: torch's gradients come from ``_torch_rng.TorchRandn`` (its CPU
  generator in numpy), torch's ``[out, in]`` parameter is our kernel transposed. The
  momentum buffer involves no Newton-Schulz and matches to fp32 round-off (2e-7); the
  parameters go through 5 bf16 Newton-Schulz runs, computed with different rounding points
  (torch fuses ``b A + c A^2`` and ``a X + B X`` into ``addmm``), so they match to
  :data:`BF16_TOL`: 5 steps x lr x sqrt(2) (the shape scale of an 8 x 4 matrix) x 8 bf16
  ulps (2^-8 each) of an entry of the orthogonalised update (|entry| <= 1).
- ``TestMuonConvergence``: a two-layer linear regression (8 -> 16 -> 4, 64 samples, lr
  0.02, 200 steps, no weight decay) loses at least 90% of its loss, with the direct and the
  Gram Newton-Schulz forms (torch's ``use_gram_newton_schulz`` False / True).

Not ported: ``TestMuonStandardNS`` / ``TestMuonGramNS`` smoke tests (finite, changed) are
implied by the above; ``TestMuonGramConfig`` and ``TestMuonCudaGraph`` test torch's own
argument parsing and CUDA graphs.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _torch_rng import TorchRandn

from amemory import optim

BF16_TOL = 5 * 0.02 * math.sqrt(2.0) * 8 * 2.0**-8  # 4.4e-3, see the module docstring

# torch's pinned values (test_muon.py, TestMuonVanillaRegression), [out=8, in=4]
EXPECTED_PARAM_NESTEROV_TRUE = [
    [1.938483476638794, 1.463821530342102, 0.8684228658676147, -2.107022762298584],
    [0.6464439034461975, -1.2333816289901733, -0.05520281195640564, -1.594115972518921],
    [-0.7017418742179871, 1.5892770290374756, -0.3630223572254181, -1.3906430006027222],
    [-0.6950568556785583, -0.6230637431144714, -0.7075115442276001, 0.7674455046653748],
    [1.6756398677825928, -0.14238590002059937, -0.4740765392780304, 0.41970568895339966],
    [-0.75552898645401, 1.045496940612793, 0.8197356462478638, 1.681230068206787],
    [1.2763956785202026, 1.2807981967926025, 0.6196531653404236, 1.2518298625946045],
    [-0.20052097737789154, 0.02047128602862358, -0.25045672059059143, 0.7741371989250183],
]
EXPECTED_PARAM_NESTEROV_FALSE = [
    [1.9527949094772339, 1.4754483699798584, 0.8651961088180542, -2.1447465419769287],
    [0.6431010365486145, -1.2468913793563843, -0.0508497953414917, -1.615515112876892],
    [-0.7089078426361084, 1.601587176322937, -0.370036244392395, -1.3938430547714233],
    [-0.7046897411346436, -0.6338974237442017, -0.6964432597160339, 0.7840660214424133],
    [1.7094919681549072, -0.1214023157954216, -0.4710087776184082, 0.4312562346458435],
    [-0.7728015780448914, 1.0400207042694092, 0.8233118653297424, 1.6969393491744995],
    [1.2878977060317993, 1.301850438117981, 0.6351599097251892, 1.2659329175949097],
    [-0.2075868397951126, 0.010008741170167923, -0.25453078746795654, 0.7897554636001587],
]
EXPECTED_BUF = [
    [-0.11098092794418335, 0.08274538069963455, 0.05440763011574745, 0.022694384679198265],
    [0.06464089453220367, 0.04171084985136986, 0.05522793158888817, -0.024408867582678795],
    [-0.10506078600883484, 0.16549666225910187, -0.036471910774707794, 0.048419296741485596],
    [-0.11045779287815094, 0.2032998502254486, -0.13876627385616302, 0.06581886857748032],
    [-0.14690940082073212, 0.005613995250314474, -0.0447036549448967, 0.0763719230890274],
    [0.0020838298369199038, -0.01441915426403284, -0.09339231252670288, -0.025113143026828766],
    [-0.0352008081972599, -0.03741401806473732, -0.16004668176174164, 0.17050980031490326],
    [-0.09506358951330185, 0.007350748870521784, 0.01989450491964817, 0.16971878707408905],
]


def _run_vanilla(nesterov: bool, weight_decay: float):
    randn = TorchRandn(42)
    p = jnp.asarray(randn(8, 4).T)  # our kernel [fan_in, fan_out] = torch's [out, in].T
    tx = optim.muon(0.02, preset="torch", ns_dtype="bfloat16", nesterov=nesterov,
                    weight_decay=weight_decay)  # fmt: skip
    state = tx.init(p)
    step = jax.jit(lambda g, s, p: tx.update(g, s, p))
    for _ in range(5):
        u, state = step(jnp.asarray(randn(8, 4).T), state, p)
        p = optax.apply_updates(p, u)
    (mu,) = [x for x in jax.tree.leaves(state) if np.shape(x) == (4, 8)]
    return np.asarray(p).T, np.asarray(mu).T


@pytest.mark.parametrize(
    "nesterov, weight_decay, expected",
    [(True, 0.1, EXPECTED_PARAM_NESTEROV_TRUE), (False, 0.0, EXPECTED_PARAM_NESTEROV_FALSE)],
)
def test_vanilla_regression_matches_torch_pinned_values(nesterov, weight_decay, expected):
    param, buf = _run_vanilla(nesterov, weight_decay)
    np.testing.assert_allclose(buf, EXPECTED_BUF, atol=2e-7, rtol=0)
    np.testing.assert_allclose(param, expected, atol=BF16_TOL, rtol=0)


@pytest.mark.parametrize("ns_method", ["direct", "gram"])
def test_muon_reduces_a_learnable_regression_loss(ns_method):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    target = x @ rng.standard_normal((8, 16)) @ rng.standard_normal((16, 4))
    params = {
        "w1": jnp.asarray(rng.uniform(-(8**-0.5), 8**-0.5, (8, 16)), jnp.float32),
        "w2": jnp.asarray(rng.uniform(-(16**-0.5), 16**-0.5, (16, 4)), jnp.float32),
    }  # torch.nn.Linear's default initialisation, kernels [in, out]

    def loss(p):
        return jnp.mean((x @ p["w1"] @ p["w2"] - target) ** 2)

    tx = optim.muon(0.02, preset="torch", weight_decay=0.0, ns_method=ns_method)
    state = tx.init(params)

    @jax.jit
    def step(p, s):
        g = jax.grad(loss)(p)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    initial = float(loss(params))
    for _ in range(200):
        params, state = step(params, state)
    assert float(loss(params)) < 0.1 * initial
