"""Device placement for the parallel modes, and multi-host start-up.

The engine has one path, ``jax.jit`` over a ``Mesh``. Modes (``config.parallel.mode``):
  single   a one-device mesh (the first device).
  pmap     data parallelism (the name is kept from the ``jax.pmap`` engine it replaced):
           the mesh of ``sharded`` with ``fsdp = 1``, state replicated, batch split.
  sharded  ``jax.jit`` over a ``Mesh`` with axes ``("data", "fsdp")`` (Auto axis
           types): the batch is split over both axes (every device gets distinct
           rows, the usual FSDP layout), each parameter and optimizer-state leaf is
           split on ``"fsdp"`` along its largest axis divisible by the fsdp size
           (replicated when none is), and XLA inserts the all-gathers and
           reduce-scatters. With ``fsdp = 1`` this is plain data parallelism.
Multi-host: ``initialize_distributed`` calls ``jax.distributed.initialize`` first;
the mesh then spans every process's devices and each process feeds only its own
rows (``make_array_from_process_local_data``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXES = ("data", "fsdp")


def initialize_distributed(pcfg: Any) -> None:
    """Start JAX's distributed runtime when ``pcfg.distributed`` is true (idempotent).

    ``pcfg`` is ``config.parallel``: ``coordinator_address`` ("host:port"),
    ``num_processes`` and ``process_id`` (None = auto-detect from SLURM / TPU / ...),
    ``cpu_collectives`` ("gloo" | "mpi", used when the platform is CPU). Must run
    before any other JAX call creates a backend.
    """
    if not pcfg.distributed or jax.distributed.is_initialized():
        return
    platforms = jax.config.jax_platforms or ""
    if "cpu" in platforms.split(","):
        jax.config.update("jax_cpu_collectives_implementation", pcfg.cpu_collectives)
    jax.distributed.initialize(
        coordinator_address=pcfg.coordinator_address,
        num_processes=pcfg.num_processes,
        process_id=pcfg.process_id,
        initialization_timeout=120,
    )


def check_batch(batch_size: int, data_shards: int, field: str, microbatches: int = 1) -> None:
    """Raise ValueError unless ``batch_size`` splits evenly over the data shards, each
    shard's rows into ``microbatches`` (``config.gradient_accumulation_steps``)."""
    if batch_size % (data_shards * microbatches):
        times = f" times gradient_accumulation_steps={microbatches}" if microbatches > 1 else ""
        raise ValueError(
            f"config.{field}={batch_size} must be divisible by the {data_shards} data shards "
            f"(devices) of this parallel mode{times}"
        )


def make_mesh(fsdp: int = 1, devices: list | None = None) -> Mesh:
    """Mesh with axes ``("data", "fsdp")``, shape ``(n // fsdp, fsdp)`` (Auto axis types).

    Args:
      fsdp: size of the "fsdp" axis.
      devices: the devices (default: all global devices, ``n = jax.device_count()``).

    Raises:
      ValueError: if ``fsdp`` does not divide the device count.
    """
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    if fsdp < 1 or n % fsdp:
        raise ValueError(f"config.parallel.fsdp={fsdp} must divide the device count {n}")
    auto = jax.sharding.AxisType.Auto
    return jax.make_mesh((n // fsdp, fsdp), AXES, axis_types=(auto, auto), devices=devices)


def fsdp_spec(shape: tuple[int, ...], fsdp: int) -> P:
    """PartitionSpec splitting the largest axis divisible by ``fsdp`` on "fsdp" (else replicated).

    Ties go to the earliest axis. Scalars and ``fsdp == 1`` are replicated.
    """
    if fsdp == 1 or not shape:
        return P()
    candidates = [i for i, d in enumerate(shape) if d % fsdp == 0 and d >= fsdp]
    if not candidates:
        return P()
    axis = max(candidates, key=lambda i: (shape[i], -i))
    return P(*[("fsdp" if i == axis else None) for i in range(len(shape))])


def state_shardings(tree: Any, mesh: Mesh, *, leading_axes: int = 0) -> Any:
    """NamedSharding for every leaf of ``tree`` by ``fsdp_spec``.

    ``leading_axes`` axes (e.g. the seed axis of a multi-seed run) are never split.
    """
    fsdp = mesh.shape["fsdp"]

    def one(x):
        shape = tuple(np.shape(x))
        spec = fsdp_spec(shape[leading_axes:], fsdp)
        return NamedSharding(mesh, P(*([None] * leading_axes), *spec))

    return jax.tree.map(one, tree)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Rows of the batch split over ``("data", "fsdp")`` jointly; other axes replicated."""
    return NamedSharding(mesh, P(AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    """Fully replicated sharding on ``mesh``."""
    return NamedSharding(mesh, P())


def global_batch(local: Any, sharding: NamedSharding) -> Any:
    """Assemble a global jax.Array tree from this process's rows (numpy tree).

    Process p holds rows ``[p B/P, (p+1) B/P)`` of every leaf.
    """

    def one(x):
        x = np.asarray(x)
        shape = (x.shape[0] * jax.process_count(), *x.shape[1:])
        return jax.make_array_from_process_local_data(sharding, x, shape)

    return jax.tree.map(one, local)


def to_host(tree: Any) -> Any:
    """Full values of (possibly sharded, possibly multi-process) arrays as numpy, on every
    process (``multihost_utils.process_allgather`` when several processes hold shards)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return multihost_utils.process_allgather(tree, tiled=True)
    return jax.tree.map(np.asarray, jax.device_get(tree))


@dataclasses.dataclass(frozen=True)
class Placement:
    """How a run puts state and batches on devices (built once by ``placement``)."""

    mode: str
    mesh: Mesh

    @property
    def data_shards(self) -> int:
        """Number of ways the global batch is split across devices."""
        return self.mesh.size


def placement(pcfg: Any, devices: list | None = None) -> Placement:
    """Resolve ``config.parallel`` into a ``Placement`` (after ``initialize_distributed``).

    ``devices``: the devices to place on (default ``jax.devices()``; ``amemory plan``
    passes a TPU topology's).

    Raises:
      ValueError: for mode "single" with more than one process, or a bad fsdp size.
    """
    devices = list(jax.devices() if devices is None else devices)
    if pcfg.mode == "single":
        if jax.process_count() > 1:
            raise ValueError(
                "config.parallel.mode='single' cannot run on several processes; "
                "use 'pmap' or 'sharded'"
            )
        return Placement("single", make_mesh(1, devices[:1]))
    return Placement(pcfg.mode, make_mesh(1 if pcfg.mode == "pmap" else pcfg.fsdp, devices))
