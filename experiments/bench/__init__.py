"""Benchmarks: `amemory bench optim`, `train` and `plan`.

Every benchmark records the host's load beside its figures (:func:`host_load`): timings
taken above ``LOAD_PER_CORE`` runnable processes per core are marked indicative only; a
ratio measured under load is not a verdict (the sides slow down unequally).
"""

import os

LOAD_PER_CORE = 0.5


def host_load() -> dict:
    """``{"load_average": [1, 5, 15 min], "host_cores", "indicative_only"}``; prints a
    warning line when the 1-minute load exceeds ``LOAD_PER_CORE`` per core."""
    load, cores = list(os.getloadavg()), os.cpu_count() or 1
    loaded = load[0] / cores > LOAD_PER_CORE
    if loaded:
        print(f"load {load[0]:.1f} on {cores} cores: timings are indicative only")
    return {"load_average": load, "host_cores": cores, "indicative_only": loaded}
