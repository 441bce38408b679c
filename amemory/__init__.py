"""amemory: how matrix-aware optimizers (Muon) and coordinate-wise ones (Adam, SignGD)
learn associative memories, above all the rare (tail) facts of heavy-tailed data.

Subpackages:
  amemory.optim     pure Optax transformations (Muon family, SignGD, role routing)
  amemory.models    one-layer associative memory and a Flax NNX decoder
  amemory.data      heavy-tailed priors, memory tasks, biographies, real text corpora
  amemory.train     training engine (one jit over a device mesh, multi-host; launch plans)
  amemory.analysis  spectrum, balance and scaling metrics, plots
"""

__version__ = "0.1.0"
