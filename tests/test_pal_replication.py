"""pal_replication: our one-layer memory is pal's matrix model, and the agreement test.

pal (facebookresearch/pal, projects/scaling_law/grid_experiments/utils.py ``AssMem``):
``logits = E[x] W U`` over M classes, label ``x mod M``. The stage maps it to
``memory.logits`` with ``Ẽ[:, k] = U[:, k mod M]``; the references below are written in
pal's layout with numpy and jax.nn directly.
"""

from __future__ import annotations

import gzip
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ml_collections import ConfigDict
from scipy import stats

from amemory.models import memory
from experiments import pal_replication as pr


@pytest.fixture(scope="module")
def pal_model():
    N, M, d = 20, 5, 7
    rng = np.random.default_rng(3)
    E = rng.normal(size=(N, d)) / np.sqrt(d)  # pal's E [N, d]
    U = rng.normal(size=(d, M)) / np.sqrt(d)  # pal's UT [d, M]
    W = rng.normal(size=(d, d)) / np.sqrt(d)  # pal's W
    return N, M, E, U, W


def test_same_model_same_gradient_same_error(pal_model):
    N, M, E, U, W = pal_model
    x = np.array([0, 3, 7, 19, 3, 12])
    ours_E, ours_Et = jnp.asarray(E.T), jnp.asarray(U[:, np.arange(N) % M])

    def pal_loss(W):  # pal's F.cross_entropy(E[x] @ W @ UT, x % M), mean over the batch
        z = jnp.asarray(E)[x] @ W @ jnp.asarray(U)
        return -jnp.mean(jax.nn.log_softmax(z)[jnp.arange(x.size), x % M])

    ours = memory.sampled_loss(jnp.asarray(W.T), ours_E, ours_Et, x, x)
    np.testing.assert_allclose(ours, pal_loss(jnp.asarray(W)) + np.log(N / M), rtol=1e-6)
    g_ours = jax.grad(memory.sampled_loss)(jnp.asarray(W.T), ours_E, ours_Et, x, x)
    np.testing.assert_allclose(g_ours.T, jax.grad(pal_loss)(jnp.asarray(W)), atol=1e-6)
    pred_pal = np.argmax(E @ W @ U, axis=1)
    pred_ours = np.argmax(np.asarray(memory.logits(jnp.asarray(W.T), ours_E, ours_Et)), -1) % M
    np.testing.assert_array_equal(pred_ours, pred_pal)


def test_agree_is_welch():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.1, 0.05, 10), rng.normal(0.12, 0.02, 8)
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    np.testing.assert_allclose(pr.agree(a, b), (ci.low, ci.high), rtol=1e-10)
    lo, hi = pr.agree(np.full(3, 0.2), np.full(4, 0.2))  # two constant arms: (nearly) a point
    assert abs(lo) < 1e-15 and abs(hi) < 1e-15
    assert pr.agree(np.zeros(3), np.zeros(4)) == (0.0, 0.0)


def test_load_pal_keeps_matrix_rows_without_layernorm(tmp_path):
    rows = [dict(model="matrix", layernorm=False, N=100, M=5, optimizer="SGD", d=10, lr=1.0,
                 batch_size=256, ntrain=1024, seed=s, error=0.1 * s) for s in (1, 2)]  # fmt: skip
    rows += [dict(rows[0], layernorm=True), dict(rows[0], model="learnable")]
    path = tmp_path / "all.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(map(json.dumps, rows)) + "\n")
    cfg = ConfigDict(dict(N=100, M=5))
    cells = pr.load_pal(str(path), cfg)
    assert list(cells) == [("SGD", 10, 1.0, 256, 1024)]
    np.testing.assert_allclose(cells["SGD", 10, 1.0, 256, 1024], [0.1, 0.2])
    with pytest.raises(ValueError, match="no matrix-model row"):
        pr.load_pal(str(path), ConfigDict(dict(N=50, M=5)))
