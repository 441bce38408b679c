"""Device placement for the parallel modes, and multi-host start-up.

The engine has two paths: ``pmap``, and ``jit`` over a ``Mesh`` (``single`` is the
one-device mesh). Modes (``config.parallel.mode``):
  single   ``jax.jit`` over a one-device mesh (the first device).
  pmap     data parallel with ``jax.pmap`` over the local devices: the state is
           replicated (leading device axis), each device takes ``B / n`` rows of
           the batch, gradients and loss are averaged with ``lax.pmean``.
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


def check_batch(batch_size: int, data_shards: int, field: str) -> None:
    """Raise ValueError unless ``batch_size`` splits evenly over the data shards."""
    if batch_size % data_shards:
        raise ValueError(
            f"config.{field}={batch_size} must be divisible by the {data_shards} data shards "
            "(devices) of this parallel mode"
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


def batch_sharding(mesh: Mesh, *, leading_axes: int = 0) -> NamedSharding:
    """Rows of the batch split over ``("data", "fsdp")`` jointly; other axes replicated.

    ``leading_axes`` axes before the rows (a per-seed batch ``[S, B, ...]``) are not split.
    """
    return NamedSharding(mesh, P(*([None] * leading_axes), AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    """Fully replicated sharding on ``mesh``."""
    return NamedSharding(mesh, P())


def global_batch(local: Any, sharding: NamedSharding, *, row_axis: int = 0) -> Any:
    """Assemble a global jax.Array tree from this process's rows (numpy tree).

    Process p holds rows ``[p B/P, (p+1) B/P)`` along ``row_axis`` of every leaf.
    """

    def one(x):
        x = np.asarray(x)
        shape = list(x.shape)
        shape[row_axis] *= jax.process_count()
        return jax.make_array_from_process_local_data(sharding, x, tuple(shape))

    return jax.tree.map(one, local)


def split_for_pmap(local: Any, n_devices: int) -> Any:
    """Reshape each ``[B, ...]`` leaf to ``[n_devices, B / n_devices, ...]``.

    Raises:
      ValueError: if ``n_devices`` does not divide ``B``.
    """

    def one(x):
        x = np.asarray(x)
        if x.shape[0] % n_devices:
            raise ValueError(
                f"per-process batch {x.shape[0]} must be divisible by the {n_devices} local "
                "devices in parallel.mode='pmap'"
            )
        return x.reshape(n_devices, x.shape[0] // n_devices, *x.shape[1:])

    return jax.tree.map(one, local)


def put_for_pmap(local: Any) -> Any:
    """This process's ``[B, ...]`` rows -> ``[n_local, B / n_local, ...]`` on the local devices
    (one slice per device, the layout ``pmap`` reads; host-to-device only)."""
    devices = jax.local_devices()
    sharding = NamedSharding(Mesh(np.array(devices), ("local",)), P("local"))
    return jax.device_put(split_for_pmap(local, len(devices)), sharding)


def pmap_to_mesh(tree: Any, mesh: Mesh) -> Any:
    """A pmap-replicated tree (leading local-device axis) as arrays replicated over ``mesh``.

    Each device's own copy becomes its shard, so nothing moves between devices.
    """
    sharding = NamedSharding(mesh, P())
    devices = list(sharding.addressable_devices)

    def one(x):
        by_device = {s.device: s.data for s in x.addressable_shards}
        shape = x.shape[1:]
        parts = [by_device[d].reshape(shape) for d in devices]
        return jax.make_array_from_single_device_arrays(shape, sharding, parts)

    return jax.tree.map(one, tree)


def to_host(tree: Any) -> Any:
    """Full values of (possibly sharded, possibly multi-process) arrays as numpy, on every
    process (``multihost_utils.process_allgather`` when several processes hold shards)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return multihost_utils.process_allgather(tree, tiled=True)
    return jax.tree.map(np.asarray, jax.device_get(tree))


def replicate(tree: Any) -> Any:
    """Copy ``tree`` to every local device with a leading device axis (pmap layout)."""
    devices = jax.local_devices()
    sharding = NamedSharding(Mesh(np.array(devices), ("local",)), P("local"))
    return jax.tree.map(
        lambda x: jax.device_put(np.stack([np.asarray(x)] * len(devices)), sharding), tree
    )


def unreplicate(tree: Any) -> Any:
    """First device's copy of a pmap-replicated tree, as a single-device array."""
    device = jax.local_devices()[0]
    return jax.tree.map(lambda x: jax.device_put(x.addressable_shards[0].data[0], device), tree)


@dataclasses.dataclass(frozen=True)
class Placement:
    """How a run puts state and batches on devices (built once by ``placement``).

    ``mesh`` is the jit mesh of "single" (one device) and "sharded"; under "pmap" it is a
    mesh over every device used for evaluation only.
    """

    mode: str
    mesh: Mesh
    n_local: int = 1

    @property
    def data_shards(self) -> int:
        """Number of ways the global batch is split across devices."""
        if self.mode == "pmap":
            return self.n_local * jax.process_count()
        return self.mesh.size


def placement(pcfg: Any) -> Placement:
    """Resolve ``config.parallel`` into a ``Placement`` (after ``initialize_distributed``).

    Raises:
      ValueError: for mode "single" with more than one process, or a bad fsdp size.
    """
    if pcfg.mode == "single":
        if jax.process_count() > 1:
            raise ValueError(
                "config.parallel.mode='single' cannot run on several processes; "
                "use 'pmap' or 'sharded'"
            )
        return Placement("single", mesh=make_mesh(1, jax.devices()[:1]))
    if pcfg.mode == "pmap":
        return Placement("pmap", mesh=make_mesh(1), n_local=jax.local_device_count())
    return Placement("sharded", mesh=make_mesh(pcfg.fsdp))
