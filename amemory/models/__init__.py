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
  parameter roles from paths.
"""

from amemory.models import attention, decode, memory, moe, transformer
from amemory.models.transformer import (
    ROLES,
    Transformer,
    TransformerConfig,
    apply,
    ffn_matrices,
    hidden_matrices,
    init,
    init_params,
    param_roles,
    preset,
    role_of,
    vo_maps,
)

__all__ = [
    "ROLES",
    "Transformer",
    "TransformerConfig",
    "apply",
    "attention",
    "decode",
    "ffn_matrices",
    "hidden_matrices",
    "init",
    "init_params",
    "memory",
    "moe",
    "param_roles",
    "preset",
    "role_of",
    "transformer",
    "vo_maps",
]
