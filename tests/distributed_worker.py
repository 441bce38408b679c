"""Shared fixture of tests/test_optim_distributed.py, also run as one process of a 2-host job.

``python tests/distributed_worker.py PROCESS_ID PORT OUT.npz`` joins a 2-process
``jax.distributed`` job on 127.0.0.1:PORT (4 CPU devices each, gloo collectives), runs
``updates`` of Muon on the global (data=2, fsdp=4) mesh and (process 0) writes the
gathered updates.
"""

from __future__ import annotations

import os
import sys

import numpy as np

# Leaf shapes: distinct sizes so that a transposed or misplaced block fails loudly.
#   a, b      FSDP-split 2-D matrices (b tall: joins a's stack transposed)
#   c         square, split along rows
#   odd       no axis divisible by the device count: replicated, gathered by owners
#   scan      scanned layers [L, m, n] (batch axis L), split along n
#   experts   expert stack [E, m, n] split along E: stays in place
SHAPES = {
    "a": (16, 40),
    "b": (40, 16),
    "c": (24, 24),
    "odd": (13, 7),
    "scan": (3, 16, 40),
    "experts": (16, 8, 8),
}
STEPS = 3


def matrix_axes(path, x):
    """The last two axes are the matrix; leading axes are batch axes."""
    del path
    return (x.ndim - 2, x.ndim - 1)


def fsdp_spec(shape, s):
    """amemory.train.parallel's FSDP rule: split the largest axis divisible by s."""
    from jax.sharding import PartitionSpec as P

    cands = [i for i, d in enumerate(shape) if d % s == 0 and d >= s]
    if s == 1 or not cands:
        return P()
    ax = max(cands, key=lambda i: (shape[i], -i))
    return P(*[("fsdp" if i == ax else None) for i in range(len(shape))])


def trees(shapes=SHAPES, steps=STEPS, seed=0):
    """(params, [grads per step]) as numpy float32 trees."""
    rng = np.random.default_rng(seed)
    params = {k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()}
    grads = [
        {k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()}
        for _ in range(steps)
    ]
    return params, grads


def updates(mesh, make_tx, shapes=SHAPES, steps=STEPS):
    """Run ``steps`` jitted updates of ``make_tx(ns_mesh)`` with FSDP-sharded inputs.

    Returns:
      ``(update trees as global jax.Arrays sharded like the params, compiled HLO text
      of one update)``.
    """
    import jax

    from amemory.optim import owner_state_shardings

    s = mesh.shape["fsdp"]
    params, grads = trees(shapes, steps)

    def shard_of(x):
        return jax.sharding.NamedSharding(mesh, fsdp_spec(np.shape(x), s))

    def put(tree):
        return jax.tree.map(
            lambda x: jax.make_array_from_callback(x.shape, shard_of(x), lambda i: x[i]), tree
        )

    tx = make_tx((mesh, "fsdp"))
    state0 = jax.eval_shape(tx.init, params)
    state_sh = owner_state_shardings(state0, mesh, jax.tree.map(shard_of, state0))
    state = jax.jit(tx.init, out_shardings=state_sh)(put(params))
    param_sh = jax.tree.map(shard_of, params)
    p = put(params)
    step = jax.jit(tx.update, out_shardings=(param_sh, state_sh))
    step = step.lower(put(grads[0]), state, p).compile()
    out = []
    for g in grads:
        u, state = step(put(g), state, p)
        out.append(u)
    return out, step.as_text()


def _main(pid: int, port: int, path: str) -> None:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid,
        initialization_timeout=60,
    )  # fmt: skip
    from jax.experimental import multihost_utils

    from amemory.optim import muon

    mesh = jax.make_mesh((2, 4), ("data", "fsdp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    ups, _ = updates(mesh, lambda m: muon(0.1, matrix_axes=matrix_axes, ns_mesh=m))
    result = {
        f"{t}/{k}": np.asarray(multihost_utils.process_allgather(v, tiled=True))
        for t, u in enumerate(ups)
        for k, v in u.items()
    }
    if pid == 0:
        np.savez(path, **result)
    jax.distributed.shutdown()


if __name__ == "__main__":
    _main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
