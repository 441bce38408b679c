"""Gradient accumulation (``gradient_accumulation_steps``): k microbatches of B / k rows give
the update of one batch of B rows, every task and parallel mode; the compiled step's
temporaries fall with k; a resumed accumulating run continues bit for bit.

Reference: the same step with k = 1 (``jax.value_and_grad`` on the whole batch, no scan),
and a numpy least-squares gradient for the mesh test.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from train_helpers import lm_config, max_rel_diff, memory_config

from amemory.train import engine as E
from amemory.train import parallel, run


def _one_step(config, k: int):
    """Parameters after one step of ``config`` with ``k`` microbatches, its metrics, and
    the gradient ``accumulated_grad`` gives at the initial parameters (the step's own)."""
    with config.unlocked():
        config.gradient_accumulation_steps = k
    b = E.build(config, parallel.placement(config.parallel))
    it = b.task.train_input()
    batch = b.engine.put_batch(next(it) if it is not None else None)
    state = b.engine.init_state()
    grad = jax.jit(lambda p, x: E.accumulated_grad(b.task.loss, p, x, jax.random.key(1), k)[1])
    grads = parallel.to_host(grad(state.params, batch)) if batch is not None else None
    state, acc = b.engine.step(state, b.engine.new_accumulator(batch), batch)
    return parallel.to_host(state.params), E.interval_metrics(b.engine.fetch(acc)), grads


# The gradients agree to 1e-6 (measured 4.8e-7, float32 summation order). The optimizers
# amplify that round-off: Adam's first step is ~g / |g| (entries near 0 flip), Newton-Schulz
# amplifies along small singular directions (see test_train_parallel.py). Measured max
# relative parameter differences after the step: adam 1.1e-5, muon 3.4e-5, normuon 3.6e-5
# (updates: 2.6e-6 / 6e-5 / 5.8e-5 relative in norm); a dropped or double-counted
# microbatch changes them by 1e-2 or more.
@pytest.mark.parametrize(
    "name,k,extra",
    [
        ("adam", 4, {}),
        ("normuon", 4, {"model.scan_layers": "true", "model.remat": "true"}),
        ("muon", 2, {"parallel.mode": "sharded", "parallel.fsdp": 4, "data.batch_size": 16}),
    ],
)
def test_k_microbatches_give_the_update_of_one_batch(corpus, name, k, extra):
    overrides = {"optimizer.name": name, "optimizer.diagnostics": "false", **extra}
    one, m1, g1 = _one_step(lm_config(corpus, **overrides), 1)
    four, m4, g4 = _one_step(lm_config(corpus, **overrides), k)
    assert max_rel_diff(g4, g1) < 1e-6
    assert max_rel_diff(four, one) < 1e-4
    np.testing.assert_allclose(m4["loss"], m1["loss"], rtol=1e-6)
    np.testing.assert_allclose(m4["grad_norm"], m1["grad_norm"], rtol=1e-6)


def test_biographies_microbatches_are_weighted_by_their_tokens(tmp_path):
    """Masked means: microbatches hold different answer-token counts, so only a mean
    weighted by each microbatch's count (engine.LOSS_WEIGHT) equals the batch's."""
    from train_helpers import LM_CONFIG

    from amemory.train.config import load_config

    over = "data.kind=biographies data.biographies.m=3 data.biographies.eval_per_group=6 "
    over += "data.batch_size=8 model.preset=tiny model.d_model=None model.n_layers=None "
    over = (over + "model.n_heads=None model.d_ff=None optimizer.name=adam progress=false").split()
    one, m1, g1 = _one_step(load_config(LM_CONFIG, over), 1)
    four, m4, g4 = _one_step(load_config(LM_CONFIG, over), 4)
    assert max_rel_diff(g4, g1) < 1e-6
    assert max_rel_diff(four, one) < 1e-4
    np.testing.assert_allclose(m4["loss"], m1["loss"], rtol=1e-6)


def test_memory_microbatches_split_the_pairs_of_the_step():
    one, m1, _ = _one_step(memory_config(batch_size=24, **{"optimizer.name": "sgd"}), 1)
    three, m3, _ = _one_step(memory_config(batch_size=24, **{"optimizer.name": "sgd"}), 3)
    np.testing.assert_allclose(three["W"], one["W"], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(m3["loss"], m1["loss"], rtol=1e-6)
    with pytest.raises(ValueError, match="gradient_accumulation_steps=2 needs sampled pairs"):
        _one_step(memory_config(), 2)


def test_batch_must_split_over_devices_and_microbatches(corpus):
    cfg = lm_config(corpus, **{"parallel.mode": "pmap", "data.batch_size": 16})
    with pytest.raises(ValueError, match=r"data.batch_size=16 must be divisible by the 8 data "
                       r"shards .* times gradient_accumulation_steps=4"):  # fmt: skip
        _one_step(cfg, 4)


def test_compiled_temporaries_fall_with_k(corpus):
    """Only one microbatch's activations are live: XLA's own memory figure shrinks."""
    temps = {}
    for k in (1, 4):
        cfg = lm_config(corpus, **{"data.batch_size": 32, "optimizer.name": "adam"})
        with cfg.unlocked():
            cfg.gradient_accumulation_steps = k
        b = E.build(cfg, parallel.placement(cfg.parallel))
        local = next(b.task.train_input())
        temps[k] = b.engine.lower(local).compile().memory_analysis().temp_size_in_bytes
    assert temps[4] < 0.5 * temps[1], temps


def test_accumulated_grad_on_an_explicit_mesh_matches_numpy():
    """Rows split over an Explicit 8-device mesh, 4 microbatches: the least-squares gradient
    ``X^T (X w - y) / B`` in float64 numpy."""
    rng = np.random.default_rng(0)
    X, y, w = rng.standard_normal((32, 5)), rng.standard_normal(32), rng.standard_normal(5)
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    rows = NamedSharding(mesh, P("data"))
    batch = {"x": jax.device_put(X.astype(np.float32), rows), "y": jax.device_put(y, rows)}

    def loss(params, b, rng):
        return 0.5 * jnp.mean((b["x"] @ params - b["y"]) ** 2), {}

    with jax.sharding.set_mesh(mesh):
        fn = jax.jit(lambda p, b: E.accumulated_grad(loss, p, b, jax.random.key(0), 4))
        (val, _), g = fn(jnp.asarray(w, jnp.float32), batch)
    np.testing.assert_allclose(g, X.T @ (X @ w - y) / 32, rtol=1e-5)
    np.testing.assert_allclose(val, 0.5 * np.mean((X @ w - y) ** 2), rtol=1e-5)


def test_a_resumed_accumulating_run_continues_bit_for_bit(corpus, tmp_path):
    # a constant schedule: the 2-step run's rates are the 4-step run's first two
    extra = {"checkpoint_every": 2, "schedule.name": "constant", "gradient_accumulation_steps": 2}
    _, whole = run(lm_config(corpus, steps=4, **extra), tmp_path / "whole")
    run(lm_config(corpus, steps=2, **extra), tmp_path / "cut")
    _, resumed = run(lm_config(corpus, steps=4, **extra), tmp_path / "cut", resume=True)
    for a, b in zip(jax.tree.leaves(resumed.params), jax.tree.leaves(whole.params), strict=True):
        np.testing.assert_array_equal(a, b)


def test_eval_batch_defaults_to_the_training_batch_clipped_to_the_split(corpus, capfd):
    from amemory.train.tasks import LMTask

    place = parallel.placement(lm_config(corpus).parallel)
    task = LMTask(lm_config(corpus, **{"data.batch_size": 200}), place)
    windows = (len(task.data.val_tokens) - 1) // 16  # seq_len 16: windows of 17 tokens
    assert 0 < windows < 200 and task.eval_batch_size == windows
    assert f"data.eval_batch_size={windows}: the validation split holds {windows}" in (
        capfd.readouterr().err
    )
    assert LMTask(lm_config(corpus), place).eval_batch_size == 8  # fits: the training batch
    assert LMTask(lm_config(corpus, **{"data.eval_batch_size": 3}), place).eval_batch_size == 3
