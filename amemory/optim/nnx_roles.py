"""Roles and matrix axes of models built from standard ``flax.nnx`` layers (foreign models).

amemory's own transformer names a role in every parameter path
(``amemory.models.role_of``). For any other ``flax.nnx`` model, :func:`nnx_role` reads
the conventions of the standard layers from the path, and :func:`nnx_matrix_axes` says
which axes of a kernel form the matrix Muon orthogonalises:

==============================  ==================  ========  ==========================
layer, parameter                shape               role      matrix (fan_in, fan_out)
==============================  ==================  ========  ==========================
``nnx.Linear`` ``kernel``       ``[in, out]``       dense     ``(in, out)``
``nnx.MultiHeadAttention``      ``[d, H, d_h]``     q, k, v   ``(d, H*d_h)``
``query|key|value/kernel``
``nnx.MultiHeadAttention``      ``[H, d_h, d]``     o         ``(H*d_h, d)``
``out/kernel``
a kernel under ``head`` /       ``[in, out]``       head      ``(in, out)``
``lm_head``
``nnx.Embed`` ``embedding``     ``[V, d]``          embed     (not a Muon matrix)
any ``scale`` (LayerNorm,       ``[d]``             norm      (not a matrix)
RMSNorm, BatchNorm, ...)
any ``bias``                    ``[...]``           bias      (not a matrix)
==============================  ==================  ========  ==========================

(A LayerNorm's ``bias`` is labelled ``bias``, not ``norm``: the path does not tell the
two apart; both usually go to Adam.) A parameter outside this table is a ``ValueError``
naming it: write a ``role_fn`` for it, nothing is guessed. Both functions read paths as
``amemory.optim.routing`` gives them (``nnx.Variable`` ``value`` keys already removed),
and import nothing of Flax.

Example::

    tx = optim.routed(
        {"hidden": optim.muon(0.02, matrix_axes=optim.nnx_matrix_axes),
         "rest": optax.adam(3e-3)},
        optim.nnx_role,
    )
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

Source: the parameter names and kernel layouts of ``flax.nnx`` 0.12 (``Linear``,
``LinearGeneral``, ``MultiHeadAttention``, ``Embed``, ``LayerNorm``, ``RMSNorm``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from amemory.optim._paths import path_keys
from amemory.optim.routing import Roles

__all__ = ["nnx_matrix_axes", "nnx_per_head_matrix_axes", "nnx_role"]

_ATTENTION = {"query": "q", "key": "k", "value": "v", "out": "o"}
_HEADS = ("head", "lm_head")


def _keys(path: Any) -> tuple:
    if isinstance(path, str):
        return tuple(path.split("/"))
    return path_keys(tuple(path))


def _unknown(keys: tuple, shape: Any) -> ValueError:
    return ValueError(
        f"nnx_role: cannot classify parameter {'/'.join(map(str, keys))!r} with shape "
        f"{shape}; known: Linear/LinearGeneral 'kernel', MultiHeadAttention "
        f"{sorted(_ATTENTION)} kernels, Embed 'embedding', norm 'scale', any 'bias'; "
        "pass your own role_fn for other parameters"
    )


def _nnx_role(path: Any, leaf: Any = None) -> str:
    """The role (one of ``nnx_role.roles``) of a standard ``flax.nnx`` layer's parameter.

    Args:
      path: key path (tuple of keys or jax key entries, or ``"a/b/kernel"``).
      leaf: the parameter (its shape is used only in error messages).

    Returns:
      ``"q"``, ``"k"``, ``"v"``, ``"o"`` (attention kernels), ``"head"``, ``"dense"``
      (other kernels), ``"embed"``, ``"norm"`` or ``"bias"`` (see the module table).

    Raises:
      ValueError: a parameter outside the table (names it).
    """
    keys = _keys(path)
    name = keys[-1] if keys else None
    parent = keys[-2] if len(keys) >= 2 else None
    if name == "kernel":
        if parent in _ATTENTION:
            return _ATTENTION[parent]
        return "head" if parent in _HEADS else "dense"
    if name == "embedding":
        return "embed"
    if name == "scale":
        return "norm"
    if name == "bias":
        return "bias"
    raise _unknown(keys, np.shape(leaf) if leaf is not None else None)


#: :func:`_nnx_role` with its vocabulary (groups ``qk``, ``vo``, ``hidden``: every kernel
#: but the head), an ``amemory.optim.routing.Roles``.
nnx_role = Roles(
    _nnx_role,
    ("q", "k", "v", "o", "dense", "head", "embed", "norm", "bias"),
    {"qk": ("q", "k"), "vo": ("v", "o"), "hidden": ("q", "k", "v", "o", "dense")},
)


def nnx_matrix_axes(path: Any, leaf: Any) -> tuple[Any, Any] | None:
    """``matrix_axes`` for Muon on standard ``flax.nnx`` kernels (``MuonOptions.matrix_axes``).

    Args:
      path: key path of the leaf.
      leaf: the parameter (array or ``ShapeDtypeStruct``).

    Returns:
      ``(in_axes, out_axes)``: ``(0, 1)`` for 2-D kernels, ``(0, (1, 2))`` for
      ``MultiHeadAttention`` ``query|key|value`` kernels ``[d, H, d_h]``, ``((0, 1), 2)``
      for its ``out`` kernel ``[H, d_h, d]``; ``None`` for anything else (not a matrix:
      Muon then raises, naming the leaf, if routing sends it there).
    """
    keys = _keys(path)
    ndim = np.ndim(leaf)
    if not keys or keys[-1] != "kernel":
        return None
    if ndim == 2:
        return (0, 1)
    parent = keys[-2] if len(keys) >= 2 else None
    if ndim == 3 and parent in ("query", "key", "value"):
        return (0, (1, 2))
    if ndim == 3 and parent == "out":
        return ((0, 1), 2)
    return None


def nnx_per_head_matrix_axes(path: Any, leaf: Any) -> tuple[Any, Any] | None:
    """:func:`nnx_matrix_axes` with ``MultiHeadAttention`` kernels per head (the head axis
    ``H`` a batch axis): ``(0, 2)`` for ``[d, H, d_h]``, ``(1, 2)`` for ``out`` ``[H, d_h,
    d]``; Kimi K3's per-head Muon (arXiv 2607.24653, Sec. 2.5)."""
    axes = nnx_matrix_axes(path, leaf)
    return {(0, (1, 2)): (0, 2), ((0, 1), 2): (1, 2)}.get(axes, axes)
