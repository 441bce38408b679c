"""Leaves as stacks of matrices, and their batched orthogonalisation (Muon family internals).

:func:`leaf_layouts` maps every leaf to a stack ``[batch, fan_in, fan_out]`` under the
``matrix_axes`` rule of :mod:`amemory.optim.muon`; :func:`orthogonalize` is the one
dispatcher of the direction, one batched call per wide shape (same result as per-leaf
calls). Source: Jordan (2024) https://kellerjordan.github.io/posts/muon/ (NS on the wide
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
from amemory.optim.orthogonalize import norm_ball_lmo, orthogonality_error

#: The ``PartitionSpec`` of each leaf (flattening order) of the tree being traced, set by
#: ``distributed.auto_sharded`` while it runs ``init`` or ``update`` on ``Auto`` axes, where
#: the leaves' types no longer name the ``Explicit`` axes they arrived split along.
EXPLICIT_SPECS: contextvars.ContextVar[tuple | None] = contextvars.ContextVar(
    "EXPLICIT_SPECS", default=None
)

Axes = int | Sequence[int]
MatrixAxes = None | tuple[Axes, Axes] | Callable[[tuple, jax.Array], "tuple[Axes, Axes] | None"]


@dataclasses.dataclass(frozen=True)
class Layout:
    """How one leaf maps to a stack of matrices ``[batch, fan_in, fan_out]``."""

    path: str
    shape: tuple[int, ...]
    perm: tuple[int, ...]  # transpose of the view to (batch..., in..., out...)
    batch_shape: tuple[int, ...]
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    view: tuple[int, ...] = ()  # the leaf reshaped with one axis split into heads, if any
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
        x = x.reshape(self.view or self.shape)
        if self.perm != tuple(range(len(self.perm))):
            x = jnp.transpose(x, self.perm)
        return x.reshape((self.batch, self.fan_in, self.fan_out))

    def from_matrix(self, y: jax.Array) -> jax.Array:
        """``[batch, fan_in, fan_out]`` -> leaf of shape ``self.shape`` (inverse of to_matrix)."""
        y = y.reshape(self.batch_shape + self.in_shape + self.out_shape)
        if self.perm != tuple(range(len(self.perm))):
            y = jnp.transpose(y, np.argsort(self.perm))
        return y.reshape(self.shape)


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


def matrix_layout(x: Any, matrix_axes: MatrixAxes, path: tuple = (), spec: tuple = ()) -> Layout:
    """The :class:`Layout` of one array ``x`` under ``matrix_axes`` (see :func:`leaf_layouts`);
    ``spec``: its ``PartitionSpec`` where its type does not name it (``EXPLICIT_SPECS``).
    Raises ``ValueError`` if ``x`` is not a matrix under ``matrix_axes`` (names ``path`` and
    shape)."""
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
        in_axes, out_axes, *split = axes
        view = shape
        for axis, heads in split[:1]:  # a view: split one axis into [heads, size / heads]
            axis %= len(shape)
            if shape[axis] % heads or len(split) > 1:
                raise ValueError
            view = shape[:axis] + (heads, shape[axis] // heads) + shape[axis + 1 :]
    except (TypeError, ValueError):
        raise ValueError(
            f"{where}: matrix_axes must be (in_axes, out_axes) or (in_axes, out_axes, "
            f"(axis, heads)) with heads dividing that axis, got {axes!r}"
        ) from None
    shape, leaf_shape = view, shape
    in_ax = _norm_axes(in_axes, len(shape), where)
    out_ax = _norm_axes(out_axes, len(shape), where)
    if set(in_ax) & set(out_ax) or len(set(in_ax)) < len(in_ax) or len(set(out_ax)) < len(out_ax):
        raise ValueError(f"{where}: matrix_axes {axes!r} must name disjoint axes")
    batch_ax = tuple(a for a in range(len(shape)) if a not in in_ax and a not in out_ax)
    own = tuple(jax.typeof(x).sharding.spec)  # names mesh axes only where they are Explicit
    spec = own if any(own) else spec
    return Layout(
        path=name,
        shape=leaf_shape,
        perm=batch_ax + in_ax + out_ax,
        batch_shape=tuple(shape[a] for a in batch_ax),
        in_shape=tuple(shape[a] for a in in_ax),
        out_shape=tuple(shape[a] for a in out_ax),
        view=shape if shape != leaf_shape else (),
        spec=spec if any(spec) and shape == leaf_shape else None,  # a view: axes differ
    )


def leaf_layouts(tree: Any, matrix_axes: MatrixAxes) -> tuple[list[Any], Any, list[Layout]]:
    """Flatten ``tree`` and lay out every leaf as a matrix stack: ``(leaves, treedef,
    layouts)``, ``layouts[i]`` describing ``leaves[i]``. Raises ``ValueError`` (on shapes
    only, before any compilation) for a leaf that is not a matrix under ``matrix_axes``
    (names its path and shape) or a malformed ``matrix_axes``."""
    leaves_with_path, treedef = jax.tree_util.tree_flatten_with_path(tree)
    leaves = [x for _, x in leaves_with_path]
    specs = EXPLICIT_SPECS.get()
    specs = specs if specs and len(specs) == len(leaves) else [()] * len(leaves)
    layouts = [
        matrix_layout(x, matrix_axes, p, sp)
        for (p, x), sp in zip(leaves_with_path, specs, strict=True)
    ]
    return leaves, treedef, layouts


def wide(m: jax.Array, tall: bool) -> jax.Array:
    """``[b, p, q]`` -> ``[b, q, p]`` when ``tall`` (its own inverse)."""
    return jnp.swapaxes(m, 1, 2) if tall else m


def group_stacks(
    layouts: Sequence[Layout],
    *,
    batch_leaves: bool,
    by_orientation: bool = False,
    dtypes: Sequence[Any] | None = None,
) -> dict[tuple, list[int]]:
    """Group the leaves' matrix stacks for batched orthogonalisation (the one place where
    tall matrices join wide ones): ``{(rows, cols[, tall][, dtype]): [leaf index, ...]}``
    in leaf order, ``rows <= cols`` the wide shape, ``tall`` with ``by_orientation`` (a
    second moment per output neuron needs one orientation per stack), the dtype with
    ``dtypes``; ``batch_leaves=False``: one group per leaf, keyed ``(index,)``."""
    groups: dict[tuple, list[int]] = {}
    for i, lay in enumerate(layouts):
        rows, cols = sorted((lay.fan_in, lay.fan_out))
        key = (rows, cols, lay.fan_in > lay.fan_out) if by_orientation else (rows, cols)
        key += (dtypes[i],) if dtypes is not None else ()
        groups.setdefault(key if batch_leaves else (i,), []).append(i)
    return groups


def orthogonalize(
    mats: list[jax.Array],
    layouts: Sequence[Layout],
    opts: Any,
    post: Any = None,
    post_state: Any = None,
) -> tuple[list[jax.Array], list[jax.Array] | None, Any]:
    """The direction of every leaf: the LMO of ``opts.norm``'s ball, batched by shape.

    ``norm="spectral"`` orthogonalises (``opts.orth_fn``) in the owner layout when
    ``opts.layout`` is set, else one batched call per group of :func:`group_stacks`; other
    norms are elementwise. Then the nuclear scaling and the optional ``post`` step (NorMuon
    / AdaMuon: ``post(o [b, fan_in, fan_out], v, tall=False) -> (o', v')`` with ``v =
    post_state[i]``; in the owner layout it runs on each matrix's owner, with
    ``post_state`` an ``OwnerStacks``).

    Args:
      mats: one ``[b_i, fan_in_i, fan_out_i]`` stack per leaf (``Layout.to_matrix``).
      layouts: the leaves' :class:`Layout` (same order); ``opts``: a ``MuonOptions``.

    Returns:
      ``(directions per leaf [b, fan_in, fan_out], per-leaf [] float32 orthogonality error
      before scaling or None without ``opts.diagnostics``, new post state or None)``.

    Raises:
      ValueError: ``nuclear_scale="leaf"`` with ``post`` in the owner layout.
    """
    nuclear, new_post = opts.nuclear_scale, None
    if opts.layout is not None:
        if post is not None and nuclear == "leaf":
            raise ValueError(
                "nuclear_scale='leaf' cannot be combined with NorMuon/AdaMuon in the "
                "owner layout; use nuclear_scale='matrix' or distributed='gspmd'"
            )
        orth, errs, new_post = opts.layout.orthogonalize(mats, layouts, opts, post, post_state)
        nuclear = "leaf" if nuclear == "leaf" else "none"  # "matrix" ran on the owners
        post = None
    elif opts.norm == "spectral":
        orth: list[Any] = [None] * len(mats)
        dtypes = [m.dtype for m in mats]
        groups = group_stacks(layouts, batch_leaves=opts.batch_leaves, dtypes=dtypes)
        for members in groups.values():
            tall = [mats[i].shape[1] > mats[i].shape[2] for i in members]
            w = [wide(mats[i], t) for i, t in zip(members, tall, strict=True)]
            o = opts.orth_fn(jnp.concatenate(w))
            parts = jnp.split(o, np.cumsum([x.shape[0] for x in w])[:-1])
            for i, t, p in zip(members, tall, parts, strict=True):
                orth[i] = wide(p, t)
        errs = _errors(orth) if opts.diagnostics else None
    else:
        orth = [norm_ball_lmo(u, opts.norm, eps=opts.ns_eps) for u in mats]
        errs = _errors(orth) if opts.diagnostics else None
    if nuclear != "none":
        orth = [nuclear_scaled(u, o, nuclear) for u, o in zip(mats, orth, strict=True)]
    if post is not None:
        pairs = [post(o, v, False) for o, v in zip(orth, post_state, strict=True)]
        orth, new_post = [o for o, _ in pairs], [v for _, v in pairs]
    return orth, errs, new_post


def _errors(mats: list[jax.Array]) -> list[jax.Array]:
    return [jnp.mean(orthogonality_error(o)).astype(jnp.float32) for o in mats]


def nuclear_scaled(u: jax.Array, o: jax.Array, mode: str) -> jax.Array:
    """``O <U, O>`` per matrix (``"matrix"``) or leaf (``"leaf"``); ``<A, B> = sum conj(A) B``."""
    ip = jnp.sum(jnp.conj(u).astype(o.dtype) * o, axis=(-2, -1), keepdims=True)  # [b, 1, 1]
    if mode == "leaf":
        ip = jnp.sum(ip, axis=0, keepdims=True)
    return o * ip


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


def _resolve_dtype(ns_dtype: Any, ns_mesh: Any = None) -> Any:
    """``"auto"`` -> bf16 unless the target devices (``ns_mesh``'s, else the ``set_mesh``
    mesh's, else the default backend's) are CPUs (then None: fp32). Call at trace time."""
    if not (isinstance(ns_dtype, str) and ns_dtype == "auto"):
        return ns_dtype
    if ns_mesh is not None:
        platform = ns_mesh[0].devices.flat[0].platform
    else:
        device = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
        platform = device.platform if device is not None else jax.default_backend()
    return None if platform == "cpu" else jnp.bfloat16
