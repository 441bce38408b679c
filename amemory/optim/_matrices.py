"""Leaves as stacks of matrices, and their batched orthogonalisation (Muon family internals).

Three pieces shared by the Muon family (``muon``, ``normuon``, ``contrib``):

- Layouts. :func:`leaf_layouts` maps every leaf of a pytree to a stack of matrices
  ``[batch, fan_in, fan_out]`` under the ``matrix_axes`` rule documented in
  :mod:`amemory.optim.muon` (2-D leaves default to ``(0, 1)``; other axes are batch
  axes; a leaf that is not a matrix raises ``ValueError`` naming its path and shape).
- Grouping. :func:`orthogonalize_groups` transposes tall matrices to wide, groups the
  stacks by ``(rows, cols, dtype)`` and orthogonalises each group with ONE batched call,
  so ``[256, 1024]`` and ``[1024, 256]`` leaves share a group. The result is the same
  as per-leaf calls (orthogonalisation commutes with transposition and acts on each
  matrix of a batch independently).
- Kernel. :func:`make_orth_fn` builds the orthogonaliser (Newton-Schulz or exact
  polar); :func:`check_ns_mesh` validates the mesh option. Where the matrices sit on a
  device mesh is decided in :mod:`amemory.optim.distributed` (owner layout).

Sources: Jordan (2024) https://kellerjordan.github.io/posts/muon/ (NS on the wide
side).
"""

from __future__ import annotations

import contextvars
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from amemory.optim._paths import path_keys, path_str
from amemory.optim.orthogonalize import newton_schulz, orthogonality_error, polar

__all__ = [
    "Axes",
    "Layout",
    "MatrixAxes",
    "check_ns_mesh",
    "layout_of",
    "leaf_layouts",
    "make_orth_fn",
    "orthogonalize_groups",
    "orthogonalize_with_errors",
]

#: The ``PartitionSpec`` of each leaf (flattening order) of the update being traced, set by
#: ``distributed.auto_sharded`` while it runs an update on ``Auto`` axes, where the leaves'
#: types no longer name the ``Explicit`` axes they arrived split along.
EXPLICIT_SPECS: contextvars.ContextVar[tuple | None] = contextvars.ContextVar(
    "EXPLICIT_SPECS", default=None
)

Axes = int | Sequence[int]
MatrixAxes = None | tuple[Axes, Axes] | Callable[[tuple, jax.Array], "tuple[Axes, Axes] | None"]


# --------------------------------------------------------------------------- layouts


@dataclasses.dataclass(frozen=True)
class Layout:
    """How one leaf maps to a stack of matrices ``[batch, fan_in, fan_out]``."""

    path: str
    shape: tuple[int, ...]
    perm: tuple[int, ...]  # transpose to (batch..., in..., out...)
    batch_shape: tuple[int, ...]
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    spec: tuple | None = None  # the leaf's PartitionSpec where its type names mesh axes

    @property
    def fan_in(self) -> int:
        return math.prod(self.in_shape)

    @property
    def fan_out(self) -> int:
        return math.prod(self.out_shape)

    @property
    def batch(self) -> int:
        return math.prod(self.batch_shape)

    def to_matrix(self, x: jax.Array) -> jax.Array:
        """Leaf of shape ``self.shape`` -> ``[batch, fan_in, fan_out]``."""
        if self.perm != tuple(range(len(self.shape))):
            x = jnp.transpose(x, self.perm)
        return x.reshape((self.batch, self.fan_in, self.fan_out))

    def from_matrix(self, y: jax.Array) -> jax.Array:
        """``[batch, fan_in, fan_out]`` -> leaf of shape ``self.shape`` (inverse of to_matrix)."""
        y = y.reshape(self.batch_shape + self.in_shape + self.out_shape)
        if self.perm != tuple(range(len(self.shape))):
            y = jnp.transpose(y, np.argsort(self.perm))
        return y


def _norm_axes(axes: Any, ndim: int, where: str) -> tuple[int, ...]:
    axes = (axes,) if isinstance(axes, int | np.integer) else tuple(axes)
    if not axes:
        raise ValueError(f"{where}: matrix_axes entries must name at least one axis")
    out = []
    for a in axes:
        if not -ndim <= int(a) < ndim:
            raise ValueError(f"{where}: axis {a} out of range for ndim {ndim}")
        out.append(int(a) % ndim)
    return tuple(out)


def _layout(path: tuple, x: Any, matrix_axes: MatrixAxes, spec: tuple = ()) -> Layout:
    shape = tuple(int(d) for d in np.shape(x))
    name = path_str(path)
    where = f"Muon leaf {name!r} with shape {shape}"
    if callable(matrix_axes):
        axes = matrix_axes(path_keys(path), x)
        if axes is None:
            raise ValueError(
                f"{where}: matrix_axes returned None, so this leaf is not a matrix; "
                "route it to another transform (amemory.optim.routed)"
            )
    elif matrix_axes is None:
        if len(shape) != 2:
            raise ValueError(
                f"{where} is not a matrix: Muon needs 2-D leaves, or matrix_axes=(in_axes, "
                "out_axes) for leaves with more axes (the other axes are batch axes). Route "
                "vectors/scalars (norms, biases) to another transform (amemory.optim.routed)"
            )
        axes = (0, 1)
    else:
        axes = matrix_axes
    if len(shape) < 2:
        raise ValueError(f"{where} is not a matrix (ndim < 2); route it to another transform")
    try:
        in_axes, out_axes = axes
    except (TypeError, ValueError):
        raise ValueError(
            f"{where}: matrix_axes must be a pair (in_axes, out_axes), got {axes!r}"
        ) from None
    in_ax = _norm_axes(in_axes, len(shape), where)
    out_ax = _norm_axes(out_axes, len(shape), where)
    if set(in_ax) & set(out_ax) or len(set(in_ax)) < len(in_ax) or len(set(out_ax)) < len(out_ax):
        raise ValueError(f"{where}: matrix_axes {axes!r} must name disjoint axes")
    batch_ax = tuple(a for a in range(len(shape)) if a not in in_ax and a not in out_ax)
    own = tuple(jax.typeof(x).sharding.spec)  # names mesh axes only where they are Explicit
    spec = own if any(own) else spec
    return Layout(
        path=name,
        shape=shape,
        perm=batch_ax + in_ax + out_ax,
        batch_shape=tuple(shape[a] for a in batch_ax),
        in_shape=tuple(shape[a] for a in in_ax),
        out_shape=tuple(shape[a] for a in out_ax),
        spec=spec if any(spec) else None,
    )


def layout_of(x: Any, matrix_axes: MatrixAxes, path: tuple = ()) -> Layout:
    """The :class:`Layout` of one array ``x`` under ``matrix_axes`` (see :func:`leaf_layouts`).

    Raises:
      ValueError: ``x`` is not a matrix under ``matrix_axes`` (names ``path`` and shape).
    """
    return _layout(path, x, matrix_axes)


def leaf_layouts(tree: Any, matrix_axes: MatrixAxes) -> tuple[list[Any], Any, list[Layout]]:
    """Flatten ``tree`` and lay out every leaf as a matrix stack.

    Returns:
      ``(leaves, treedef, layouts)``; ``layouts[i]`` describes ``leaves[i]``.

    Raises:
      ValueError: a leaf that is not a matrix under ``matrix_axes`` (names its path
        and shape), or a malformed ``matrix_axes``. Runs on shapes only, so it
        raises before any compilation.
    """
    leaves_with_path, treedef = jax.tree_util.tree_flatten_with_path(tree)
    leaves = [x for _, x in leaves_with_path]
    specs = EXPLICIT_SPECS.get()
    specs = specs if specs and len(specs) == len(leaves) else [()] * len(leaves)
    layouts = [
        _layout(p, x, matrix_axes, sp) for (p, x), sp in zip(leaves_with_path, specs, strict=True)
    ]
    return leaves, treedef, layouts


# --------------------------------------------------------------------------- grouping


def orthogonalize_groups(
    mats: list[jax.Array], orth_fn: Callable[[jax.Array], jax.Array], batch_leaves: bool
) -> list[jax.Array]:
    """Orthogonalise a list of ``[b_i, p_i, q_i]`` stacks, batching same-shape ones.

    Tall stacks (``p > q``) are transposed to wide before grouping and back after.
    With ``batch_leaves=False`` every stack is its own group (one call per leaf).
    """
    groups: dict[tuple, list[tuple[int, bool, jax.Array]]] = {}
    for i, m in enumerate(mats):
        tall = m.shape[1] > m.shape[2]
        w = jnp.swapaxes(m, 1, 2) if tall else m  # wide: [b, k, l], k <= l
        key = (w.shape[1], w.shape[2], w.dtype) if batch_leaves else (i,)
        groups.setdefault(key, []).append((i, tall, w))
    out: list[Any] = [None] * len(mats)
    for members in groups.values():
        if len(members) == 1:
            parts = [orth_fn(members[0][2])]
        else:
            stacked = jnp.concatenate([w for _, _, w in members], axis=0)
            res = orth_fn(stacked)
            splits = np.cumsum([w.shape[0] for _, _, w in members])[:-1]
            parts = jnp.split(res, splits, axis=0)
        for (i, tall, _), p in zip(members, parts, strict=True):
            out[i] = jnp.swapaxes(p, 1, 2) if tall else p
    return out


def orthogonalize_with_errors(
    mats: list[jax.Array], orth_fn: Callable, batch_leaves: bool, diagnostics: bool
) -> tuple[list[jax.Array], list[jax.Array] | None]:
    """:func:`orthogonalize_groups`, plus each stack's mean orthogonality error.

    Returns:
      ``(orthogonalised stacks, errors)``; ``errors[i]`` is the ``[]`` float32 mean over
      the batch of ``orthogonalize.orthogonality_error``, or ``errors is None`` when
      ``diagnostics`` is False.
    """
    orth = orthogonalize_groups(mats, orth_fn, batch_leaves)
    errs = None
    if diagnostics:
        errs = [jnp.mean(orthogonality_error(o)).astype(jnp.float32) for o in orth]
    return orth, errs


# --------------------------------------------------------------------------- kernel


def check_ns_mesh(ns_mesh: Any) -> None:
    """Raise ``ValueError`` unless ``ns_mesh`` is None or ``(Mesh, axis name(s) in it)``."""
    if ns_mesh is None:
        return
    ok = isinstance(ns_mesh, tuple) and len(ns_mesh) == 2
    ok = ok and isinstance(ns_mesh[0], jax.sharding.Mesh)
    if ok:
        names = (ns_mesh[1],) if isinstance(ns_mesh[1], str) else ns_mesh[1]
        ok = isinstance(names, tuple) and bool(names)
        ok = ok and all(isinstance(a, str) and a in ns_mesh[0].axis_names for a in names)
    if not ok:
        raise ValueError(
            "ns_mesh must be None or (jax.sharding.Mesh, axis name or tuple of axis names "
            f"in the mesh), got {ns_mesh!r}"
        )


def _resolve_dtype(ns_dtype: Any) -> Any:
    if isinstance(ns_dtype, str) and ns_dtype == "auto":
        return None if jax.default_backend() == "cpu" else jnp.bfloat16
    return ns_dtype


def make_orth_fn(opts: Any) -> Callable[[jax.Array], jax.Array]:
    """The ``[b, k, l] -> [b, k, l]`` orthogonaliser chosen by ``opts`` (a ``MuonOptions``).

    ``orthogonalizer="polar"``: exact ``orthogonalize.polar``; otherwise
    ``orthogonalize.newton_schulz`` with the options' coefficients, steps, eps, method,
    pre-conditioning, Gram restarts and dtype (``"auto"``: bf16 off CPU, fp32 on CPU).
    The options are validated by ``MuonOptions``. Placement on a mesh is
    :mod:`amemory.optim.distributed`'s job.
    """
    if opts.orthogonalizer == "polar":
        return polar
    kw = dict(
        coeffs=opts.ns_coeffs,
        steps=opts.steps,
        eps=opts.ns_eps,
        eps_mode=opts.ns_eps_mode,
        dtype=_resolve_dtype(opts.ns_dtype),
        method=opts.ns_method,
        preconditioning=opts.preconditioning,
        gram_restarts=opts.gram_restarts,
    )

    def orth(x):
        return newton_schulz(x, **kw)

    return orth
