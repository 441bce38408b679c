"""amemory.models: the one-layer associative memory and a Flax NNX decoder.

- :mod:`amemory.models.memory`: functional one-layer memory ``softmax(Ẽᵀ W E_k)`` of
  papers A and B, its losses and embedding builders (``decoupled``, ``coupled_rotation``,
  ``random_orthonormal``, ``gaussian``, ``coherent``).
"""

from amemory.models import memory

__all__ = ["memory"]
