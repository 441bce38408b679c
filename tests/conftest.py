"""Test set-up: 8 fake CPU devices and a persistent compilation cache.

Both must be configured before jax is imported anywhere, so this file sets the
environment at import time (pytest imports conftest.py before test modules).
"""

import os
import pathlib

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_CACHE = pathlib.Path(
    os.environ.get("AMEMORY_TEST_CACHE", pathlib.Path.home() / ".cache" / "amemory" / "jax-tests")
)
_CACHE.mkdir(parents=True, exist_ok=True)
os.environ["JAX_COMPILATION_CACHE_DIR"] = str(_CACHE)
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.2"

import jax  # noqa: E402

jax.config.update("jax_compilation_cache_dir", str(_CACHE))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)

import pytest  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A tiny corpus (``train_helpers.write_corpus``), one per test module; its tokenizer
    cache lives in a temporary $AMEMORY_DATA (restored after the module)."""
    from train_helpers import write_corpus

    d = tmp_path_factory.mktemp("corpus")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AMEMORY_DATA", str(d / "cache"))
        yield write_corpus(d)
