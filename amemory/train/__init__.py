"""Training engine: one device, ``pmap``, sharded ``jit`` over a mesh, or many hosts.

Public API:
  train(config, workdir) -> summary dict      run one config (amemory.train.loop)
  TrainState                                   the pytree carried between steps
  CheckpointManager                            Orbax wrapper with shape-checked restore
  load_config(path, overrides) -> ConfigDict   config file + ``--config.a.b=v`` overrides
"""

from amemory.train.loop import train

__all__ = ["train"]
