"""Training engine: one device, ``pmap``, sharded ``jit`` over a mesh, or many hosts.

Public API:
  train(config, workdir, *, resume=False) -> summary dict   (amemory.train.loop)
  run(config, workdir, *, resume=False) -> (summary, final TrainState as numpy)
  load_config(path, overrides) -> ConfigDict                (config file + a.b=value overrides)
  TrainState, Checkpointer, NonFiniteLossError
"""

from amemory.train.checkpoint import Checkpointer
from amemory.train.config import load_config
from amemory.train.loop import NonFiniteLossError, run, train
from amemory.train.state import TrainState

__all__ = ["Checkpointer", "NonFiniteLossError", "TrainState", "load_config", "run", "train"]
