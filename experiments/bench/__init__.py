"""Benchmarks: `amemory bench optim`, `train` and `plan`.

Every benchmark records the host's load beside its figures (:func:`host_load`): timings
taken above ``LOAD_PER_CORE`` runnable processes per core are marked indicative only; a
ratio measured under load is not a verdict (the sides slow down unequally).
"""

import os
import pathlib
import platform

from amemory import atomic

LOAD_PER_CORE = 0.5


def host_load() -> dict:
    """``{"load_average": [1, 5, 15 min], "host_cores", "indicative_only"}``; prints a
    warning line when the 1-minute load exceeds ``LOAD_PER_CORE`` per core."""
    load, cores = list(os.getloadavg()), os.cpu_count() or 1
    loaded = load[0] / cores > LOAD_PER_CORE
    if loaded:
        print(f"load {load[0]:.1f} on {cores} cores: timings are indicative only")
    return {"load_average": load, "host_cores": cores, "indicative_only": loaded}


def random_like(tree, seed: int):
    """A tree of standard-normal arrays with ``tree``'s shapes and dtypes (numpy seed ``seed``)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), x.dtype), tree)


def write_json(path: pathlib.Path, command: str, load: dict, **fields) -> None:
    """Write a benchmark's ``fields`` to ``path`` beside its command, the jax and optax
    versions, the device, the machine and the host ``load`` (:func:`host_load`)."""
    import jax
    import optax

    dev = jax.devices()[0]
    atomic.write_json(path, {
        "command": command, "jax": jax.__version__, "optax": optax.__version__,
        "platform": dev.platform, "device_kind": dev.device_kind,
        "machine": platform.machine(), **load, **fields,
    })  # fmt: skip
    print(f"\nwrote {path}")
