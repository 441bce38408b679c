"""amemory.models: the one-layer associative memory and a Flax NNX decoder.

- :mod:`amemory.models.memory`: functional one-layer memory ``softmax(Ẽᵀ W E_k)`` of
  papers A and B, its losses and embedding builders (``decoupled``, ``coupled_rotation``,
  ``random_orthonormal``, ``gaussian``, ``coherent``).
- :mod:`amemory.models.transformer`: decoder-only Flax NNX transformer with separate 2-D
  kernels per role, role-named parameter paths, presets (``tiny``, ``small``,
  ``gpt2-small``, ``nanogpt-160m``) and a functional ``init``/``apply`` API.
- :mod:`amemory.models.attention`: multi-head (MHA) and multi-head latent attention
  (MLA, DeepSeek-V2); :mod:`amemory.models.moe`: the MLP and a mixture of experts;
  :mod:`amemory.models.decode`: KV-cache decoding and sampling; :mod:`amemory.models.roles`:
  parameter roles from paths (``role_of``).
"""

from amemory.models import attention, decode, memory, moe, roles, transformer
from amemory.models.roles import role_of

__all__ = ["attention", "decode", "memory", "moe", "role_of", "roles", "transformer"]
