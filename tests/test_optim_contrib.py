"""amemory.optim.contrib is a drop-in for optax.contrib.muon (optax 0.2.8).

1. optax's own tests for its Muon, as installed: ``optax/contrib/_muon_test.py`` and the
   Muon rows of ``optax/contrib/_common_test.py``, loaded from the optax package with
   their import of ``optax.contrib`` swapped for ``amemory.optim.contrib`` (nothing of
   optax's test code is copied here; the swap is done on the installed source text).
2. The same updates and the same state tree as optax.contrib.muon, option by option.
"""

import pathlib
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
import pytest

from amemory.optim import COEFFICIENT_SETS, contrib


def _swapped(relpath: str, old: str, new: str) -> types.ModuleType:
    path = pathlib.Path(optax.__file__).parent / relpath
    source = path.read_text()
    assert source.count(old) == 1, (relpath, old)
    module = types.ModuleType(f"optax_test_on_amemory_{path.stem}")
    exec(compile(source.replace(old, new), str(path), "exec"), module.__dict__)
    return module


# optax/contrib/_muon_test.py: every test is a Muon test.
OptaxMuonTest = _swapped(
    "contrib/_muon_test.py",
    "from optax.contrib import _muon\n",
    "from amemory.optim import contrib as _muon\n",
).MuonTest
for _name in dir(OptaxMuonTest):  # optax's private helper _compute_muon_reshape is not API
    if _name.startswith("test_reshape_inverse"):
        setattr(OptaxMuonTest, _name, None)  # not collected

# optax/contrib/_common_test.py: keep the rows whose parameters name the Muon optimizer.
_common = _swapped(
    "contrib/_common_test.py", "from optax import contrib\n", "from amemory.optim import contrib\n"
).ContribTest


class OptaxCommonMuonTest(_common):
    pass


_MUON_ROWS = [
    name
    for name in dir(_common)
    if name.startswith("test")
    and "'muon'" in getattr(getattr(_common, name), "__x_params_repr__", "")
]
for _name in dir(_common):
    if _name.startswith("test") and _name not in _MUON_ROWS:
        setattr(OptaxCommonMuonTest, _name, None)  # not collected
del _common


def test_the_optax_selection_is_the_muon_rows():
    assert len(_MUON_ROWS) == 16, _MUON_ROWS  # 8 test methods x their Muon parameter rows


# ---------------------------------------------------------------- same as optax, per option

RNG = np.random.default_rng(0)
PARAMS = {
    "w": jnp.asarray(RNG.standard_normal((6, 10)), jnp.float32),
    "t": jnp.asarray(RNG.standard_normal((10, 6)), jnp.float32),
    "stack": jnp.asarray(RNG.standard_normal((3, 5, 7)), jnp.float32),
    "b": jnp.asarray(RNG.standard_normal(7), jnp.float32),
}
GRADS = [jax.tree.map(lambda x: jnp.asarray(RNG.standard_normal(x.shape), x.dtype), PARAMS)]
GRADS += [jax.tree.map(lambda x: jnp.asarray(RNG.standard_normal(x.shape), x.dtype), PARAMS)]
DIMS = {
    "w": optax.contrib.MuonDimensionNumbers(),
    "t": optax.contrib.MuonDimensionNumbers(0, 1),
    "stack": optax.contrib.MuonDimensionNumbers(1, 2),
    "b": None,
}

CASES = {
    "defaults": {},
    "aol_dion_adaptive_rms": {
        "preconditioning": "aol",
        "ns_coeffs": "dion",
        "adaptive": True,
        "nesterov": False,
        "consistent_rms": 0.2,
    },
    "schatten_wd_mask_dims": {
        "preconditioning": "schatten",
        "weight_decay": 0.1,
        "weight_decay_mask": {"w": True, "t": False, "stack": True, "b": False},
        "muon_weight_dimension_numbers": DIMS,
        "adam_learning_rate": 0.003,
    },
    "spectral": {"preconditioning": "spectral"},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_updates_and_state_tree_equal_optax_contrib_muon(case):
    """Two steps; |diff| <= 2e-6 + 2e-5 |ref| (fp32 rounding; Gram vs direct NS forms)."""
    kw = CASES[case]
    ours, ref = contrib.muon(0.05, **kw), optax.contrib.muon(0.05, **kw)
    s, rs = ours.init(PARAMS), ref.init(PARAMS)
    assert jax.tree.structure(s) == jax.tree.structure(rs)  # checkpoints interchange
    step = jax.jit(lambda tx_update, g, s, p: tx_update(g, s, p), static_argnums=0)
    for g in GRADS:
        u, s = step(ours.update, g, s, PARAMS)
        ru, rs = step(ref.update, g, rs, PARAMS)
        for k in PARAMS:
            np.testing.assert_allclose(u[k], ru[k], atol=2e-6, rtol=2e-5, err_msg=f"{case}/{k}")
    same_dtypes = jax.tree.map(lambda a, b: a.dtype == b.dtype, s, rs)
    assert all(jax.tree.leaves(same_dtypes))


def test_non_matrix_leaves_go_to_adam_and_options_are_accepted():
    """The user's complaint: optax-only options and 1-D/3-D leaves used to raise."""
    tx = contrib.muon(
        0.02, preconditioning="aol", adaptive=True, muon_weight_dimension_numbers=None
    )
    state = tx.init(PARAMS)
    mu = state.inner_states["muon"].inner_state[0].mu
    assert isinstance(mu["b"], optax.MaskedNode) and isinstance(mu["stack"], optax.MaskedNode)
    assert mu["w"].shape == (6, 10)
    with pytest.raises(ValueError, match=r"ns_coeff preset.*'dion'"):
        contrib.muon(0.02, ns_coeffs="muon")


def test_coefficient_presets_are_optax_tables():
    from optax.contrib import _muon as optax_muon_module  # the peer's table, read not copied

    presets = optax_muon_module._NS_COEFFS_PRESET_DICT
    np.testing.assert_array_equal(COEFFICIENT_SETS["jordan"][0][0], presets["standard"])
    np.testing.assert_array_equal(COEFFICIENT_SETS["dion"][0], presets["dion"])
