"""Training engine: one device, ``pmap``, sharded ``jit`` over a mesh, or many hosts.

Public API (imported lazily, so ``amemory train --help`` and config errors stay fast):
  train(config, workdir, *, resume=False) -> summary dict   (amemory.train.loop)
  run(config, workdir, *, resume=False) -> (summary, final TrainState as numpy)
  load_config(path, overrides) -> ConfigDict                (config file + a.b=value overrides)
  TrainState, Checkpointer, NonFiniteLossError

Modules: config (load/override/validate), tasks (model + data + eval per config.task),
optimizers (names -> optax), state, parallel (modes, mesh, multi-host), checkpoint (Orbax),
loop (the step and the loop), cli (``amemory train``).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "train": "amemory.train.loop",
    "run": "amemory.train.loop",
    "NonFiniteLossError": "amemory.train.loop",
    "load_config": "amemory.train.config",
    "TrainState": "amemory.train.state",
    "Checkpointer": "amemory.train.checkpoint",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'amemory.train' has no attribute {name!r}")
