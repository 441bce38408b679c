"""FLOP accounting of `amemory bench train` against hand counts and the optim benchmark."""

import jax
import jax.numpy as jnp
import pytest

from amemory.models import transformer
from amemory.optim import newton_schulz
from amemory.train import planner
from experiments.bench import optim as bench_optim


def test_model_flops_hand_count():
    mc = transformer.preset("tiny")  # V=37, D=24, L=2, F=56, untied head, GELU FFN
    params = jax.eval_shape(lambda: transformer.init_params(mc, jax.random.PRNGKey(0)))
    B, T = 3, 11
    n_matmul = 2 * (4 * 24 * 24 + 2 * 24 * 56) + 24 * 37
    want = 6 * n_matmul * B * T + 12 * 2 * T * 24 * B * T
    assert _step_flops(mc, params, B, T) == pytest.approx(want)
    tied = mc.replace(tied_head=True)
    params_t = jax.eval_shape(lambda: transformer.init_params(tied, jax.random.PRNGKey(0)))
    assert _step_flops(tied, params_t, B, T) == pytest.approx(want)
    scanned = mc.replace(scan_layers=True)  # stacked [L, ...] kernels: same count
    params_s = jax.eval_shape(lambda: transformer.init_params(scanned, jax.random.PRNGKey(0)))
    assert _step_flops(scanned, params_s, B, T) == pytest.approx(want)


def _step_flops(mc, params, B, T):
    roles = transformer.param_roles(params)
    return planner.model_flops_per_token(mc, params, roles, T) * B * T


@pytest.mark.parametrize("shape", [(24, 24), (24, 56), (56, 24), (256, 1024), (100, 150)])
def test_ns_flops_match_optim_benchmark(shape):
    method = "gram" if max(shape) >= 2 * min(shape) else "direct"
    assert planner.ns_flops(shape) == _program_flops(shape, method)  # "auto"
    assert planner.ns_flops(shape, method="direct") == _program_flops(shape, "direct")
    k, l = sorted(shape)
    if method == "direct":
        assert planner.ns_flops(shape) == 5 * (4 * k * k * l + 2 * k**3)


def _program_flops(shape, method):
    """The matmul FLOPs of ``newton_schulz``'s program, counted from its jaxpr."""
    x = jax.ShapeDtypeStruct(tuple(shape), jnp.float32)
    return bench_optim._dot_flops(jax.make_jaxpr(lambda m: newton_schulz(m, method=method))(x))
