"""Owner layout: Newton-Schulz on parameters sharded across devices, with no collectives inside.

Under FSDP, Newton-Schulz (NS) on a split matrix makes XLA all-reduce a partial Gram
matrix ``X X^H`` in every NS step. The owner layout instead gives every device a share of
WHOLE matrices:

1. Same-shape matrices (wide ``[k, l]``, ``k <= l``, tall ones transposed; every leading
   axis of a leaf is a batch axis) are concatenated into one local stack ``[B, k, l]`` per
   shape, zero-padded to ``B_pad``, a multiple of the device count ``n`` (NS maps zero to
   zero).
2. Inside one ``jax.shard_map`` over the mesh, matrix ``t * n + o`` belongs to owner
   ``o = i * s + j`` (``i`` its index over the axes that replicate parameters, ``j`` over
   the ``s``-way axes that split them). A stack split along rows or columns reaches its
   owners by ONE ``all_to_all`` over the split axes; NS (and NorMuon's normalisation,
   whose second moment is stored in this layout, :class:`OwnerStacks`) runs with no
   collective; a second ``all_to_all`` returns the blocks, and with ``r = n / s > 1``
   replicas one ``all_gather`` over the replica axes completes them.
3. A stack every device holds whole takes its share and one ``all_gather`` returns the
   results (Jordan's DDP design). A leaf split along its leading batch axis with ``n``
   dividing its batch (experts split by expert) stays in place.

A leaf's split axis is the one its ``Explicit`` type names, else the FSDP convention of
``amemory.train``: its largest axis divisible by ``s`` (ties to the first); a stack's, its
larger matrix axis divisible by ``s`` (ties to rows). A leaf split differently still gets
the exact update, resharded by XLA at the ``shard_map`` boundary.

Communication per update (bytes summed over devices, element size ``e``, ``E_g`` the
padded element count of stack ``g``): ``e * sum_g [2 (s-1)/s + (r-1)] E_g`` for split
stacks, ``e (n-1) E_g`` for replicated ones; partitioned NS all-reduces a ``[k, k]``
Gram matrix per matrix and NS step instead.

Sources: Jordan (2024) https://kellerjordan.github.io/posts/muon/ ; Li et al.,
"NorMuon", arXiv 2510.05491, Sec. 4; Ahn et al., "Dion", arXiv 2504.05295; MaxText
``optimizers/muon`` (2026; all-to-all onto a stack axis).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from amemory.optim._matrices import (
    EXPLICIT_SPECS,
    check_ns_mesh,
    group_stacks,
    leaf_layouts,
    nuclear_scaled,
    wide,
)
from amemory.optim.orthogonalize import orthogonality_error

__all__ = [
    "DISTRIBUTED_MODES",
    "auto_sharded",
    "Group",
    "OwnerLayout",
    "OwnerStacks",
    "describe_layout",
    "owner_state_shardings",
    "resolve_layout",
]

#: ``"owner"``: the owner layout above (needs ``ns_mesh``); ``"gspmd"``: leave the
#: layout of Newton-Schulz to XLA's partitioner; ``"auto"``: owner iff ``ns_mesh`` is set
#: and its mesh has more than one device.
DISTRIBUTED_MODES = ("auto", "gspmd", "owner")

Post = Callable[[jax.Array, jax.Array, bool], tuple[jax.Array, jax.Array]]


class OwnerStacks(NamedTuple):
    """Optimizer state kept in the owner layout (NorMuon / AdaMuon's second moment).

    ``stacks[group name]`` is ``[B_pad, ...]``, split over ALL mesh devices along its first
    axis: a device holds the rows of the matrices it owns (row order internal to the
    layout), so an update reads and writes them without communication.
    """

    stacks: dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class Group:
    """One stack of same-shape matrices and how it reaches its owners."""

    name: str
    kind: str  # how the stack reaches its owners: "all_to_all", "gather" or "in_place"
    members: tuple[int, ...]  # leaf indices, in stack order
    tall: tuple[bool, ...]  # per member: transposed to wide
    counts: tuple[int, ...]  # per member: matrices (product of batch axes)
    rows: int  # of the wide matrices, rows <= cols
    cols: int
    split_dim: int | None  # all_to_all: 1 (rows) or 2 (columns) of [B, k, l]
    size: int  # B, matrices in the stack
    padded: int  # B_pad (== B for "in_place")

    @property
    def width(self) -> int:
        """Output neurons (fan_out) per matrix; the stack is orientation-uniform when used."""
        return self.rows if self.tall[0] else self.cols


@dataclasses.dataclass(frozen=True)
class OwnerLayout:
    """The owner layout on ``mesh``, with parameters split over ``split_axes``.

    ``split_axes`` name the mesh axes that split parameter matrices (FSDP); the other
    mesh axes replicate them. Every device of the mesh owns a share of the matrices.
    """

    mesh: Mesh
    split_axes: tuple[str, ...]

    @property
    def replica_axes(self) -> tuple[str, ...]:
        return tuple(a for a in self.mesh.axis_names if a not in self.split_axes)

    @property
    def n_devices(self) -> int:
        """Owners: every device of the mesh (``n`` in the module doc)."""
        return int(self.mesh.size)

    @property
    def n_splits(self) -> int:
        """Ways each parameter matrix is split (product of the split axes' sizes; ``s``)."""
        return math.prod(self.mesh.shape[a] for a in self.split_axes)

    @property
    def n_replicas(self) -> int:
        """Copies of each parameter shard (product of the replica axes' sizes; ``r``)."""
        return self.n_devices // self.n_splits

    def _split(self, lay: Any) -> tuple[int | None, int | None]:
        """``(leaf axis split over split_axes, the wide stack dim (1|2) it splits or None)``:
        from an ``Explicit`` sharding (a matrix dim splits into whole blocks when the axis
        is the first of the ``in`` or ``out`` axes), else the FSDP convention (module doc;
        the stack dim is then chosen in :meth:`plan`)."""
        s, nb, tall = self.n_splits, len(lay.batch_shape), lay.fan_in > lay.fan_out
        if lay.spec is None:
            cands = [i for i, d in enumerate(lay.shape) if d % s == 0 and d >= s]
            return (max(cands, key=lambda i: (lay.shape[i], -i)) if cands and s > 1 else None), None
        names = [(e,) if isinstance(e, str) else tuple(e or ()) for e in lay.spec]
        ax = next((i for i, e in enumerate(names) if e == self.split_axes), None)
        first = {lay.perm[nb]: 2 if tall else 1, lay.perm[nb + len(lay.in_shape)]: 1 if tall else 2}
        return ax, first.get(ax)

    def plan(self, layouts: Sequence[Any], *, batch_leaves: bool, by_orientation: bool):
        """Group the leaves (``_matrices.Layout`` objects) into a tuple of :class:`Group`.

        Groups are ``_matrices.group_stacks``' (keyed by the wide shape, plus the
        orientation with ``by_orientation``); a leaf split along its outermost batch axis
        with ``n_devices`` dividing its batch is its own ``"in_place"`` group.
        """
        n, s = self.n_devices, self.n_splits
        in_place, rest = [], {}  # rest: by the stack dim an Explicit sharding splits
        for i, lay in enumerate(layouts):
            ax, want = self._split(lay)
            split_batch = ax is not None and lay.batch_shape and lay.perm[0] == ax
            if split_batch and lay.batch % n == 0:
                in_place.append(i)
            else:
                rest.setdefault(want, []).append(i)
        groups, entries = [], []
        for want, idx in rest.items():
            keyed = group_stacks(
                [layouts[i] for i in idx], batch_leaves=batch_leaves, by_orientation=by_orientation
            )
            entries += [(key, want, [idx[m] for m in local]) for key, local in keyed.items()]
        for key, want, members in entries + [(None, None, [i]) for i in in_place]:
            lays = [layouts[i] for i in members]
            talls = tuple(lay.fan_in > lay.fan_out for lay in lays)
            rows, cols = sorted((lays[0].fan_in, lays[0].fan_out))
            counts = tuple(lay.batch for lay in lays)
            size = sum(counts)
            if key is None:
                kind, split_dim, padded = "in_place", None, size
            else:
                split = {d: dim for d, dim in ((1, rows), (2, cols)) if s > 1 and dim % s == 0}
                split_dim = max(split, key=split.get) if split else None  # larger; ties: rows
                split_dim = want if want in split else split_dim  # as the Explicit type says
                kind, padded = ("all_to_all" if split_dim else "gather"), -(-size // n) * n
            if key is None or not batch_leaves:
                name = f"leaf{members[0]}"
            else:
                name = f"{rows}x{cols}" + ("" if len(key) == 2 else ("_t" if key[2] else "_w"))
                name += {None: "", 1: "_r", 2: "_c"}[want]
            members = tuple(members)
            groups.append(
                Group(name, kind, members, talls, counts, rows, cols, split_dim, size, padded)
            )
        return tuple(groups)

    def bytes_moved(self, group: Group, itemsize: int = 4) -> float:
        """Bytes sent per update for ``group``, summed over devices (module doc's model)."""
        e = group.padded * group.rows * group.cols * itemsize
        n, r, s = self.n_devices, self.n_replicas, self.n_splits
        if group.kind == "all_to_all":
            return e * (2 * (s - 1) / s + (r - 1))
        if group.kind == "gather":
            return e * (n - 1)
        return e * (r - 1) / s

    def held(self, group: Group) -> np.ndarray:
        """``[n, c]`` int: stack index of the matrix each device holds at each owner slot."""
        n, s = self.n_devices, self.n_splits
        c = group.padded // n
        t = np.arange(c)

        def flat(at: dict, axes: tuple[str, ...]) -> int:  # index over ``axes``
            sizes = [self.mesh.shape[a] for a in axes]
            return int(np.ravel_multi_index([at[a] for a in axes], sizes))

        rows = []
        for idx in np.ndindex(self.mesh.devices.shape):  # devices in mesh order
            at = dict(zip(self.mesh.axis_names, idx, strict=True))
            i, j = flat(at, self.replica_axes), flat(at, self.split_axes)
            if group.kind == "in_place":
                rows.append(j * (group.size // s) + i * c + t)
            else:
                rows.append(t * n + i * s + j)
        return np.asarray(rows)

    def _group_fn(self, g: Group, opts: Any, post: Post | None):
        """The ``shard_map`` body for group ``g``: ``(x, v) -> (y, v', err)``."""
        n, r, s = self.n_devices, self.n_replicas, self.n_splits
        rep, spl = self.replica_axes, self.split_axes
        c = g.padded // n
        k, l = g.rows, g.cols  # noqa: E741

        def core(w, v):  # w: [c, k, l] whole matrices owned here
            o = opts.orth_fn(w)
            err = orthogonality_error(o) if opts.diagnostics else jnp.zeros(())  # [c] or []
            err = err.astype(jnp.float32)
            if opts.nuclear_scale == "matrix":
                o = nuclear_scaled(w, o, "matrix")
            if post is not None:
                o, v = post(o, v, g.tall[0])
            return o, v, err

        def take(x, index_axes, size, axis):  # my slice of a replicated axis
            if size == 1:
                return jnp.squeeze(x, axis)
            return jax.lax.dynamic_index_in_dim(
                x, jax.lax.axis_index(index_axes), axis, keepdims=False
            )

        def a2a(x, v):  # local x [B_pad, k', l'] (k' = k/s or l' = l/s)
            kk, ll = x.shape[1:]
            x = take(x.reshape(c, r, s, kk, ll), rep, r, 1)  # [c, s, k', l']
            x = jax.lax.all_to_all(x, spl, 1, 1)  # axis 1: which block of my matrices
            if g.split_dim == 1:
                w = x.reshape(c, k, l)
            else:
                w = jnp.moveaxis(x, 1, 2).reshape(c, k, l)
            o, v, err = core(w, v)
            if g.split_dim == 1:
                y = o.reshape(c, s, kk, l)
            else:
                y = jnp.moveaxis(o.reshape(c, k, s, ll), 2, 1)
            y = jax.lax.all_to_all(y, spl, 1, 1)  # axis 1: whose matrix (split index)
            y = jax.lax.all_gather(y, rep, axis=1) if r > 1 else y[:, None]
            return y.reshape(g.padded, kk, ll), v, err

        def gather(x, v):  # local x [B_pad, k, l], the same on every device
            owners = rep + spl
            w = take(x.reshape(c, n, k, l), owners, n, 1)
            o, v, err = core(w, v)
            y = jax.lax.all_gather(o, owners, axis=1) if n > 1 else o[:, None]
            return y.reshape(g.padded, k, l), v, err

        def in_place(x, v):  # local x [B/s, k, l]: my split-axis block of the batch
            w = take(x.reshape(r, c, k, l), rep, r, 0)
            o, v, err = core(w, v)
            y = jax.lax.all_gather(o, rep, axis=0) if r > 1 else o[None]
            return y.reshape(g.size // s, k, l), v, err

        body, spec = {
            "all_to_all": (a2a, P(None, spl, None) if g.split_dim == 1 else P(None, None, spl)),
            "gather": (gather, P()),
            "in_place": (in_place, P(spl, None, None)),
        }[g.kind]
        owned = P(self.mesh.axis_names)
        return body, spec, owned

    def orthogonalize(
        self,
        mats: list[jax.Array],
        layouts: Sequence[Any],
        opts: Any,
        post: Post | None = None,
        post_state: OwnerStacks | None = None,
    ) -> tuple[list[jax.Array], list[jax.Array] | None, OwnerStacks | None]:
        """Orthogonalise every ``[b_i, fan_in_i, fan_out_i]`` stack in the owner layout.

        Each owner runs ``opts.orth_fn`` on its ``[c, rows, cols]`` share, the ``"matrix"``
        nuclear scaling and ``post(o, v, tall) -> (o', v')`` on its rows of ``post_state``
        (groups are then split by orientation).

        Returns:
          as ``_matrices.orthogonalize`` (the caller), in leaf orientation.
        """
        groups = self.plan(layouts, batch_leaves=opts.batch_leaves, by_orientation=post is not None)
        out: list[Any] = [None] * len(mats)
        errs: list[Any] = [None] * len(mats)
        new_state: dict[str, jax.Array] = {}
        for g in groups:
            x = jnp.concatenate([wide(mats[i], t) for i, t in zip(g.members, g.tall, strict=True)])
            x = jnp.concatenate([x, jnp.zeros((g.padded - g.size,) + x.shape[1:], x.dtype)])
            body, spec, owned = self._group_fn(g, opts, post)
            v = post_state.stacks[g.name] if post else jnp.zeros((g.padded, 0), jnp.float32)
            v_spec = P(*owned, *([None] * (v.ndim - 1)))
            fn = jax.shard_map(
                body,
                mesh=self.mesh.update(axis_types=(AxisType.Auto,) * len(self.mesh.axis_names)),
                in_specs=(spec, v_spec),
                out_specs=(spec, v_spec, owned if opts.diagnostics else P()),
                check_vma=False,
            )
            y, v, e = fn(x, v)
            new_state[g.name] = v
            parts = jnp.split(y[: g.size], np.cumsum(g.counts)[:-1])
            for i, t, p in zip(g.members, g.tall, parts, strict=True):
                out[i] = wide(p, t).astype(mats[i].dtype)
            if opts.diagnostics:
                by_matrix = jnp.zeros((g.padded,), jnp.float32).at[self.held(g).ravel()].set(e)
                starts = np.concatenate([[0], np.cumsum(g.counts)])
                for m, i in enumerate(g.members):
                    errs[i] = jnp.mean(by_matrix[starts[m] : starts[m + 1]])
        return out, (errs if opts.diagnostics else None), (OwnerStacks(new_state) if post else None)

    def init_state(
        self,
        layouts: Sequence[Any],
        *,
        batch_leaves: bool,
        shape: Callable[[Group], tuple[int, ...]],
        dtype: Any,
    ) -> OwnerStacks:
        """Zero :class:`OwnerStacks` for a ``post`` hook: ``[B_pad, *shape(group)]`` per stack."""
        groups = self.plan(layouts, batch_leaves=batch_leaves, by_orientation=True)
        return OwnerStacks({g.name: jnp.zeros((g.padded, *shape(g)), dtype) for g in groups})


def _explicit_mesh(tree: Any) -> tuple[Any, tuple[str, ...]]:
    """The mesh in effect (context, else the leaves' types) and its ``Explicit`` axes."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:  # explicitly sharded arrays without jax.set_mesh (concrete ones: eager)
        concrete = lambda x: isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
        shs = (x.sharding if concrete(x) else jax.typeof(x).sharding for x in jax.tree.leaves(tree))
        meshes = (getattr(sh, "mesh", None) for sh in shs)
        mesh = next((m for m in meshes if m is not None and not m.empty), mesh)
    if mesh.empty:
        return mesh, ()
    types = dict(zip(mesh.axis_names, mesh.axis_types, strict=True))
    return mesh, tuple(a for a in mesh.axis_names if types[a] == AxisType.Explicit)


def auto_sharded(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """``tx`` run on ``Auto`` mesh axes, for parameters with ``Explicit`` ones.

    Under ``Explicit`` axes (``jax.make_mesh``'s default) every reshape and matmul must
    state its output sharding. The wrapper leaves ``init`` and ``update`` to XLA's
    partitioner (``jax.sharding.auto_axes``; the owner layout's ``shard_map`` overrides
    it): the same numbers as unsharded. ``update``'s outputs take their inputs' shardings;
    ``init``'s state leaves shaped like their parameter take its sharding (momenta), the
    others are replicated. Without ``Explicit`` axes ``tx`` is called unchanged.

    Args:
      tx: a transform whose update returns a state of the same structure as it gets.

    Source: JAX's explicit-sharding guide ("Explicit sharding", ``jax.sharding.auto_axes``).
    """

    def on_auto(fn, out_sharding):
        def call(*args, **kwargs):  # one frame around ``fn``
            args = (*args, *kwargs.values())  # update(updates, state, params=...) in order
            mesh, explicit = _explicit_mesh(args)
            if not explicit:
                return fn(*args)

            def spec(x):
                sh = jax.typeof(x).sharding
                return NamedSharding(mesh, sh.spec if isinstance(sh, NamedSharding) else P())

            token = EXPLICIT_SPECS.set(tuple(spec(x).spec for x in jax.tree.leaves(args[0])))
            try:  # the owner layout plans from the specs (the types inside no longer name them)
                run = lambda out: jax.sharding.auto_axes(fn, axes=explicit, out_sharding=out)(*args)
                return run(out_sharding(args, spec, NamedSharding(mesh, P()), run))
            finally:
                EXPLICIT_SPECS.reset(token)

        return call

    def init_out(args, spec, replicated, run):
        (params,) = args
        like = lambda n: jax.tree.structure(n) == jax.tree.structure(params)

        def pick(node):  # a params-like subtree (momenta, norms), or another leaf
            same = lambda s, p: spec(p) if s.shape == p.shape else replicated
            return jax.tree.map(same, node, params) if like(node) else replicated

        return jax.tree.map(pick, jax.eval_shape(lambda: run(replicated)), is_leaf=like)

    update_out = lambda args, spec, *_: jax.tree.map(spec, tuple(args[:2]))  # updates, state
    init_fn, update_fn = on_auto(tx.init, init_out), on_auto(tx.update, update_out)
    return optax.GradientTransformation(init_fn, update_fn)


def resolve_layout(distributed: str, ns_mesh: tuple[Mesh, Any] | None) -> OwnerLayout | None:
    """The :class:`OwnerLayout` chosen by the ``distributed`` option, or None (GSPMD).

    Args:
      distributed: one of :data:`DISTRIBUTED_MODES`.
      ns_mesh: None or ``(mesh, axis)`` with ``axis`` a mesh axis name (or a tuple of
        names) that splits the parameters (checked by ``_matrices.check_ns_mesh``).

    Raises:
      ValueError: unknown ``distributed``, or ``"owner"`` without ``ns_mesh``.
    """
    if distributed not in DISTRIBUTED_MODES:
        raise ValueError(f"distributed={distributed!r}; allowed: {DISTRIBUTED_MODES}")
    if distributed == "gspmd":
        return None
    if distributed == "auto" and (ns_mesh is None or ns_mesh[0].size == 1):
        return None
    if ns_mesh is None:
        raise ValueError("distributed='owner' needs ns_mesh=(mesh, axis name that splits params)")
    axis = ns_mesh[1]
    return OwnerLayout(ns_mesh[0], (axis,) if isinstance(axis, str) else tuple(axis))


def owner_state_shardings(state: Any, mesh: Mesh, default: Any, *, leading_axes: int = 0) -> Any:
    """``default`` shardings with every :class:`OwnerStacks` leaf put in the owner layout.

    Args:
      state: an optimizer state (arrays or ShapeDtypeStructs), any nesting.
      mesh: the ``ns_mesh`` mesh.
      default: same-structure tree of shardings for everything else.
      leading_axes: unsplit leading axes (e.g. a vmapped seed axis); the stack is split
        along the next one, ``P(*[None] * leading_axes, mesh.axis_names, None, ...)``.
    """
    is_stacks = lambda x: isinstance(x, OwnerStacks)
    ranks = jax.tree.map(  # same structure as state: a stack's rank, else -1
        lambda x: jax.tree.map(lambda y: len(y.shape), x) if is_stacks(x) else -1,
        state,
        is_leaf=is_stacks,
    )

    def pick(rank, d):
        if rank < 0:
            return d
        rest = [None] * (rank - leading_axes - 1)
        return NamedSharding(mesh, P(*([None] * leading_axes), mesh.axis_names, *rest))

    return jax.tree.map(pick, ranks, default)


def describe_layout(
    params: Any,
    *,
    ns_mesh: tuple[Mesh, Any] | None = None,
    distributed: str = "auto",
    matrix_axes: Any = None,
    batch_leaves: bool = True,
    by_orientation: bool = False,
) -> list[dict[str, Any]]:
    """Which layout each orthogonalisation group of ``params`` gets (JSON-ready rows).

    Args:
      params: the tree a Muon/NorMuon transform sees (arrays or ShapeDtypeStructs).
      ns_mesh, distributed, matrix_axes, batch_leaves: as given to the transform.
      by_orientation: True for NorMuon (its stacks are split by orientation).

    Returns:
      one dict per group: ``group``, ``layout`` (``"gspmd"`` or ``"owner/<Group.kind>"``),
      ``shape`` ``[k, l]`` (wide), ``matrices``, ``padded`` (stack length), ``split``
      (``"rows"``, ``"columns"``, ``"batch"`` or None), ``leaves`` (paths).

    Raises:
      ValueError: as the transform would (bad option, leaf that is not a matrix).
    """
    check_ns_mesh(ns_mesh)
    layout = resolve_layout(distributed, ns_mesh)
    _, _, layouts = leaf_layouts(params, matrix_axes)
    if layout is None:  # XLA places NS; the groups of _matrices.orthogonalize
        groups = group_stacks(layouts, batch_leaves=batch_leaves)
        return [
            {"group": f"{key[0]}x{key[1]}" if batch_leaves else f"leaf{key[0]}",
             "layout": "gspmd", "shape": sorted((layouts[m[0]].fan_in, layouts[m[0]].fan_out)),
             "matrices": sum(layouts[i].batch for i in m),
             "padded": sum(layouts[i].batch for i in m), "split": None,
             "leaves": [layouts[i].path for i in m]}
            for key, m in groups.items()
        ]  # fmt: skip
    groups = layout.plan(layouts, batch_leaves=batch_leaves, by_orientation=by_orientation)
    split = {1: "rows", 2: "columns", None: None}
    return [
        {"group": g.name, "layout": f"owner/{g.kind}", "shape": [g.rows, g.cols],
         "matrices": g.size, "padded": g.padded,
         "split": "batch" if g.kind == "in_place" else split[g.split_dim],
         "leaves": [layouts[i].path for i in g.members]}
        for g in groups
    ]  # fmt: skip
