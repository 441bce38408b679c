"""Training engine: one ``jit`` over a mesh (one device, many, or many hosts).

Public API (imported lazily, so ``amemory train --help`` and config errors stay fast):
  train(config, workdir, *, resume=False, allow_changed=()) -> summary  (amemory.train.loop)
  run(config, workdir, *, resume=False, allow_changed=(), task=None)
                                                -> (summary, final TrainState as numpy)
  load_config(path, overrides) -> ConfigDict                (config file + a.b=value overrides)
  plan(config, topology, *, save=None) -> report   (the step compiled for a TPU topology)
  Task (the interface a model family implements), TrainState, Checkpointer,
  NonFiniteLossError, DivergenceError, RunInterrupted, WorkdirBusyError
                                                (amemory.train.guard, .lock)

The modules, one job each, are listed in docs/architecture.md.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "train": "amemory.train.loop",
    "run": "amemory.train.loop",
    "NonFiniteLossError": "amemory.train.guard",
    "DivergenceError": "amemory.train.guard",
    "RunInterrupted": "amemory.train.guard",
    "WorkdirBusyError": "amemory.train.lock",
    "load_config": "amemory.train.config",
    "plan": "amemory.train.planner",
    "TrainState": "amemory.train.state",
    "Task": "amemory.train.tasks",
    "Checkpointer": "amemory.train.checkpoint",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'amemory.train' has no attribute {name!r}")
