"""Muon and NorMuon as Optax gradient transformations.

Muon (MomentUm Orthogonalized by Newton-Schulz) keeps a momentum buffer per
matrix parameter and replaces each update by (an approximation of) its polar
factor, rescaled by a shape-dependent factor:

    M_t = beta M_{t-1} + (1 - beta) G_t     ("ema")   or   beta M_{t-1} + G_t  ("sum")
    U_t = Nesterov(G_t, M_t) or M_t
    O_t = orth(U_t)                           (Newton-Schulz or exact polar)
    update = -lr * (scale(fan_in, fan_out) * O_t + wd * theta)

Matrix convention. Every leaf is seen as a matrix ``[fan_in, fan_out]`` (plus
optional batch axes), the layout of Flax ``Dense``/``nnx.Linear`` kernels
(``y = x @ W``). ``matrix_axes=(in_axes, out_axes)`` picks the axes: the
default for 2-D leaves is ``(0, 1)``; a PyTorch-style ``[d_out, d_in]`` weight
(e.g. amemory.models.memory's ``W``) takes ``matrix_axes=(1, 0)``. Only the
shape scaling depends on which side is fan_in: orthogonalisation commutes with
transposition. All other axes of a leaf are batch axes (independent matrices).
A leaf that is not a matrix under this rule raises ``ValueError`` naming its
path and shape: Muon never falls back to Adam; routing (``amemory.optim.routing``)
decides which leaves reach it.

Speed. Inside ``update`` leaves are grouped by matrix shape (tall matrices are
transposed to wide first, so ``[256, 1024]`` and ``[1024, 256]`` share a group)
and each group is orthogonalised by ONE batched call. Wide groups with
``fan_max >= 2 fan_min`` use the Gram form of Newton-Schulz (see
``orthogonalize.newton_schulz(method="gram")``) in fp32. Under sharded ``jit``,
``ns_mesh=(mesh, axis)`` shards each stack along its batch axis so every device
orthogonalises whole matrices instead of all-gathering inside each NS matmul.

Sources: Jordan (2024) https://kellerjordan.github.io/posts/muon/ ; Liu et al.,
"Muon is Scalable for LLM Training" (Moonlight), arXiv 2502.16982; optax
0.2.8 ``optax.contrib.muon``; Wang et al. 2025, arXiv 2509.26030 (sum momentum,
no Nesterov); Li et al., "NorMuon", arXiv 2510.05491.
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

from amemory.optim._paths import path_keys, path_str
from amemory.optim.orthogonalize import (
    coefficient_table,
    newton_schulz,
    orthogonality_error,
    polar,
)
from amemory.optim.presets import preset_options

__all__ = [
    "MOMENTUM_FORMS",
    "ORTHOGONALIZERS",
    "SHAPE_SCALES",
    "MuonState",
    "NorMuonState",
    "collect_diagnostics",
    "muon",
    "normuon",
    "scale_by_muon",
    "scale_by_normuon",
    "shape_scale_factor",
]

MOMENTUM_FORMS = ("ema", "sum")
ORTHOGONALIZERS = ("newton_schulz", "polar")
SHAPE_SCALES = ("none", "jordan", "rms_match", "spectral")
NS_METHODS = ("auto", "direct", "gram")

Axes = int | Sequence[int]
MatrixAxes = None | tuple[Axes, Axes] | Callable[[tuple, jax.Array], "tuple[Axes, Axes] | None"]


class MuonState(NamedTuple):
    """State of :func:`scale_by_muon`."""

    count: jax.Array  # [] int32: number of updates applied so far
    mu: optax.Updates  # momentum, same tree/shapes as params, dtype mu_dtype (default param dtype)
    # None, or {"ortho_error": tree of [] float32, "update_rms": tree of [] float32}: the last
    # update's NS orthogonality error and the RMS of the returned direction (before lr)
    diagnostics: Any


class NorMuonState(NamedTuple):
    """State of :func:`scale_by_normuon`."""

    count: jax.Array  # [] int32
    mu: optax.Updates  # momentum, same tree/shapes as params
    nu: optax.Updates  # per-output-neuron second moment, [*batch_shape, fan_out] float32 per leaf
    diagnostics: Any  # None, or {"ortho_error": ..., "update_rms": ...} as in MuonState


# --------------------------------------------------------------------------- layouts


@dataclasses.dataclass(frozen=True)
class _Layout:
    """How one leaf maps to a stack of matrices ``[batch, fan_in, fan_out]``."""

    path: str
    shape: tuple[int, ...]
    perm: tuple[int, ...]  # transpose to (batch..., in..., out...)
    batch_shape: tuple[int, ...]
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]

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
        if self.perm != tuple(range(len(self.shape))):
            x = jnp.transpose(x, self.perm)
        return x.reshape((self.batch, self.fan_in, self.fan_out))

    def from_matrix(self, y: jax.Array) -> jax.Array:
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


def _layout(path: tuple, x: Any, matrix_axes: MatrixAxes) -> _Layout:
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
    return _Layout(
        path=name,
        shape=shape,
        perm=batch_ax + in_ax + out_ax,
        batch_shape=tuple(shape[a] for a in batch_ax),
        in_shape=tuple(shape[a] for a in in_ax),
        out_shape=tuple(shape[a] for a in out_ax),
    )


def _layouts(tree: Any, matrix_axes: MatrixAxes) -> tuple[list[tuple], list[Any], Any, list]:
    leaves_with_path, treedef = jax.tree_util.tree_flatten_with_path(tree)
    paths = [p for p, _ in leaves_with_path]
    leaves = [x for _, x in leaves_with_path]
    layouts = [_layout(p, x, matrix_axes) for p, x in zip(paths, leaves, strict=True)]
    return paths, leaves, treedef, layouts


def shape_scale_factor(
    kind: str, fan_in: int, fan_out: int, rms_scale: float | jax.Array = 0.2
) -> float | jax.Array:
    """Multiplier applied to an orthogonalised update of a ``[fan_in, fan_out]`` matrix.

    - ``"none"``: 1 (Wang et al. 2025; Li et al. 2026).
    - ``"jordan"``: ``sqrt(max(1, fan_out / fan_in))`` (Keller Jordan's reference,
      torch.optim.Muon "original", optax.contrib.muon).
    - ``"rms_match"``: ``rms_scale * sqrt(max(fan_in, fan_out))`` (Moonlight; gives
      update RMS ~ ``rms_scale``, like AdamW's ~0.2).
    - ``"spectral"``: ``sqrt(fan_out / fan_in)`` (spectral-norm / muP scaling, Dion).

    Raises:
      ValueError: unknown ``kind`` (lists the allowed ones).
    """
    if kind == "none":
        return 1.0
    if kind == "jordan":
        return math.sqrt(max(1.0, fan_out / fan_in))
    if kind == "rms_match":
        return rms_scale * math.sqrt(max(fan_in, fan_out))
    if kind == "spectral":
        return math.sqrt(fan_out / fan_in)
    raise ValueError(f"shape_scale={kind!r}; allowed: {SHAPE_SCALES}")


# --------------------------------------------------------------------------- pieces


def _check_choice(name: str, value: Any, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r}; allowed: {tuple(allowed)}")


def _check_unit_interval(name: str, value: Any, upper_open: bool = True) -> None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        ok = 0.0 <= value < 1.0 if upper_open else 0.0 <= value <= 1.0
        if not ok:
            raise ValueError(f"{name} must be in [0, 1), got {value!r}")


def _resolve_dtype(ns_dtype: Any) -> Any:
    if ns_dtype == "auto":
        return None if jax.default_backend() == "cpu" else jnp.bfloat16
    return ns_dtype


def _static_steps(ns_steps: Any, ns_coeffs: Any) -> int:
    if ns_steps is None:
        if not isinstance(ns_coeffs, str) and np.ndim(ns_coeffs) == 2:
            return int(np.shape(ns_coeffs)[0])
        return 5
    if isinstance(ns_steps, jax.core.Tracer):
        raise ValueError(
            "ns_steps must be a static Python int; with optax.inject_hyperparams pass "
            "static_args=('ns_steps',)"
        )
    return int(ns_steps)


def _momentum(g, m, count_inc, beta, form, nesterov, bias_correction):
    """Return (new momentum, matrix to orthogonalise), both in the compute dtype."""
    if form == "ema":
        m_new = beta * m + (1.0 - beta) * g
    else:
        m_new = beta * m + g
    if bias_correction:  # optax.contrib.muon: Adam-style bias correction, NAdam Nesterov
        t = count_inc.astype(g.dtype)
        if nesterov:
            u = beta * m_new / (1.0 - beta ** (t + 1)) + (1.0 - beta) * g / (1.0 - beta**t)
        else:
            u = m_new / (1.0 - beta**t)
    elif nesterov:
        u = beta * m_new + (1.0 - beta) * g if form == "ema" else g + beta * m_new
    else:
        u = m_new
    return m_new, u


def _orthogonalize_groups(
    mats: list[jax.Array], orth_fn: Callable[[jax.Array], jax.Array], batch_leaves: bool
) -> list[jax.Array]:
    """Orthogonalise a list of ``[b_i, p_i, q_i]`` stacks, batching same-shape ones."""
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


def _check_ns_mesh(ns_mesh: Any) -> None:
    if ns_mesh is None:
        return
    ok = (
        isinstance(ns_mesh, tuple)
        and len(ns_mesh) == 2
        and isinstance(ns_mesh[0], jax.sharding.Mesh)
        and ns_mesh[1] in ns_mesh[0].axis_names
    )
    if not ok:
        raise ValueError(
            f"ns_mesh must be None or (jax.sharding.Mesh, axis name in the mesh), got {ns_mesh!r}"
        )


def _batch_sharded(orth_fn: Callable, ns_mesh: tuple[Any, str]) -> Callable:
    """Run ``orth_fn`` on a ``[b, k, l]`` stack with whole matrices per device.

    The stack is zero-padded to a multiple of the mesh axis size (NS and polar map
    zero to zero) and constrained to be sharded along its batch axis, so GSPMD
    moves each matrix to one device once instead of all-reducing every NS matmul
    of a matrix sharded across devices (the Levanter/MaxText layout).
    """
    mesh, axis = ns_mesh
    n = mesh.shape[axis]
    spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(axis, None, None))

    def orth(x):
        b = x.shape[0]
        pad = (-b) % n
        if pad:
            x = jnp.concatenate([x, jnp.zeros((pad,) + x.shape[1:], x.dtype)], axis=0)
        x = jax.lax.with_sharding_constraint(x, spec)
        y = jax.lax.with_sharding_constraint(orth_fn(x), spec)
        return y[:b] if pad else y

    return orth


def _make_orth_fn(orthogonalizer, ns_coeffs, steps, ns_eps, ns_dtype, ns_method, ns_mesh=None):
    if orthogonalizer == "polar":
        orth = polar
    else:
        dtype = _resolve_dtype(ns_dtype)

        def orth(x):
            return newton_schulz(
                x, coeffs=ns_coeffs, steps=steps, eps=ns_eps, dtype=dtype, method=ns_method
            )

    return orth if ns_mesh is None else _batch_sharded(orth, ns_mesh)


def _validate_common(
    momentum, momentum_form, nesterov, bias_correction, orthogonalizer, ns_coeffs, ns_steps,
    ns_method, shape_scale,
) -> int:  # fmt: skip
    _check_unit_interval("momentum", momentum)
    _check_choice("momentum_form", momentum_form, MOMENTUM_FORMS)
    _check_choice("orthogonalizer", orthogonalizer, ORTHOGONALIZERS)
    _check_choice("shape_scale", shape_scale, SHAPE_SCALES)
    _check_choice("ns_method", ns_method, NS_METHODS)
    if not isinstance(nesterov, bool):
        raise ValueError(f"nesterov must be a bool, got {nesterov!r}")
    if bias_correction and momentum_form != "ema":
        raise ValueError("bias_correction=True needs momentum_form='ema' (optax convention)")
    steps = _static_steps(ns_steps, ns_coeffs)
    coefficient_table(ns_coeffs, steps)  # raises ValueError on a bad spec
    return steps


def _zero_diagnostics(params: Any) -> dict[str, Any]:
    zero = lambda _: jnp.zeros([], jnp.float32)  # noqa: E731
    return {"ortho_error": jax.tree.map(zero, params), "update_rms": jax.tree.map(zero, params)}


def _rms_tree(leaves: list[jax.Array], treedef: Any) -> Any:
    rms = [jnp.sqrt(jnp.mean(jnp.square(x.astype(jnp.float32)))) for x in leaves]
    return treedef.unflatten(rms)


def _orthogonalize_with_errors(
    mats_u: list[jax.Array], orth_fn: Callable, batch_leaves: bool, diagnostics: bool
) -> tuple[list[jax.Array], list[jax.Array] | None]:
    orth = _orthogonalize_groups(mats_u, orth_fn, batch_leaves)
    errs = None
    if diagnostics:
        errs = [jnp.mean(orthogonality_error(o)).astype(jnp.float32) for o in orth]
    return orth, errs


# --------------------------------------------------------------------------- Muon


def scale_by_muon(
    momentum: float = 0.95,
    *,
    momentum_form: str = "ema",
    nesterov: bool = True,
    bias_correction: bool = False,
    orthogonalizer: str = "newton_schulz",
    ns_coeffs: Any = "jordan",
    ns_steps: int | None = None,
    ns_eps: float = 1e-7,
    ns_dtype: Any = None,
    ns_method: str = "auto",
    shape_scale: str = "jordan",
    rms_scale: float = 0.2,
    mu_dtype: Any = None,
    matrix_axes: MatrixAxes = None,
    batch_leaves: bool = True,
    ns_mesh: tuple[Any, str] | None = None,
    diagnostics: bool = False,
) -> optax.GradientTransformation:
    r"""Muon direction: momentum, orthogonalisation, shape scaling (no learning rate).

    Per matrix leaf ``G`` (seen as ``[batch, fan_in, fan_out]``, see module doc)::

        ema: M <- beta M + (1 - beta) G          sum: M <- beta M + G
        Nesterov (ema): U = beta M + (1 - beta) G   (Keller Jordan: lerp(G, M, beta))
        Nesterov (sum): U = G + beta M              (Moonlight)
        no Nesterov:    U = M
        bias_correction (ema only, optax.contrib.muon):
            U = beta M / (1 - beta^(t+1)) + (1 - beta) G / (1 - beta^t)   (Nesterov)
            U = M / (1 - beta^t)                                        (otherwise)
        O = orth(U) * shape_scale_factor(shape_scale, fan_in, fan_out)

    ``momentum=0`` with ``orthogonalizer="polar"`` and ``shape_scale="none"`` is the
    papers' ``W <- W - lr msgn(G)``.

    Args:
      momentum: ``beta`` in ``[0, 1)`` (may be injected by ``optax.inject_hyperparams``).
      momentum_form: ``"ema"`` or ``"sum"``.
      nesterov: use the Nesterov look-ahead ``U`` above.
      bias_correction: optax.contrib.muon's Adam-style bias correction (``"ema"`` only).
      orthogonalizer: ``"newton_schulz"`` or ``"polar"`` (exact, SVD; slow but exact,
        and float64 under ``jax_enable_x64``).
      ns_coeffs: ``"jordan"``, ``"polar_express"`` or an array ``[steps, 3]``.
      ns_steps: NS steps; ``None`` means 5 (or the length of an array ``ns_coeffs``).
        Must be static (``static_args=("ns_steps",)`` under inject_hyperparams).
      ns_eps: added to the Frobenius norm before NS (1e-7 Keller/torch, 1e-8 optax).
      ns_dtype: NS compute dtype: ``None`` (momentum's dtype, at least fp32),
        ``jnp.bfloat16``, or ``"auto"`` (bf16 on GPU/TPU, fp32 on CPU).
      ns_method: ``"auto"``, ``"direct"`` or ``"gram"`` (see ``newton_schulz``).
      shape_scale: ``"none"``, ``"jordan"``, ``"rms_match"`` or ``"spectral"``.
      rms_scale: ``c`` of ``"rms_match"`` (0.2 matches AdamW's update RMS).
      mu_dtype: momentum dtype (``None``: parameter dtype).
      matrix_axes: ``None`` (every leaf must be 2-D ``[fan_in, fan_out]``), a pair
        ``(in_axes, out_axes)`` of ints or int tuples applied to every leaf, or a
        callable ``(path_keys, leaf) -> pair | None``.
      batch_leaves: orthogonalise same-shape leaves in one batched call (exactly the
        same result; disable to keep per-leaf sharding untouched).
      ns_mesh: ``(mesh, axis_name)`` for sharded ``jit``: each same-shape stack is
        sharded along its batch axis over ``axis_name`` during orthogonalisation, so
        every device works on whole matrices (one reshard per stack instead of
        collectives inside every NS matmul of FSDP-sharded matrices). Same result;
        ``None`` leaves the layout to XLA.
      diagnostics: store each leaf's orthogonality error and update RMS (of the
        returned direction, before the learning rate) of the last update in
        ``state.diagnostics`` (read with :func:`collect_diagnostics`); the update
        itself is unchanged.

    Returns:
      ``optax.GradientTransformation`` with state :class:`MuonState`. Updates have
      the gradient's shapes and dtypes.

    Raises:
      ValueError: bad option (lists allowed values); a leaf that is not a matrix
        (names path and shape), raised by ``init`` before any compilation.

    Example:
      >>> import jax.numpy as jnp, optax
      >>> tx = optax.chain(scale_by_muon(), optax.scale_by_learning_rate(0.02))
      >>> params = {"w": jnp.ones((4, 8))}
      >>> u, state = tx.update({"w": jnp.eye(4, 8)}, tx.init(params))
      >>> u["w"].shape
      (4, 8)

    References:
      Jordan (2024); Liu et al. arXiv 2502.16982; optax.contrib.muon (0.2.8);
      Wang et al. arXiv 2509.26030.
    """
    steps = _validate_common(
        momentum, momentum_form, nesterov, bias_correction, orthogonalizer, ns_coeffs,
        ns_steps, ns_method, shape_scale,
    )  # fmt: skip
    _check_ns_mesh(ns_mesh)
    orth_fn = _make_orth_fn(orthogonalizer, ns_coeffs, steps, ns_eps, ns_dtype, ns_method, ns_mesh)

    def init_fn(params):
        _, leaves, treedef, _ = _layouts(params, matrix_axes)  # validates every leaf
        mu = optax.tree.zeros_like(params, dtype=mu_dtype)
        diag = None
        if diagnostics:
            diag = _zero_diagnostics(params)
        return MuonState(count=jnp.zeros([], jnp.int32), mu=mu, diagnostics=diag)

    def update_fn(updates, state, params=None):
        del params
        _, g_leaves, treedef, layouts = _layouts(updates, matrix_axes)
        m_leaves = treedef.flatten_up_to(state.mu)
        count_inc = optax.safe_increment(state.count)
        new_m, mats_u = [], []
        for g, m, lay in zip(g_leaves, m_leaves, layouts, strict=True):
            cdtype = jnp.promote_types(jnp.promote_types(g.dtype, m.dtype), jnp.float32)
            m_new, u = _momentum(
                g.astype(cdtype), m.astype(cdtype), count_inc, momentum, momentum_form,
                nesterov, bias_correction,
            )  # fmt: skip
            new_m.append(m_new.astype(m.dtype))
            mats_u.append(lay.to_matrix(u))
        orth, errs = _orthogonalize_with_errors(mats_u, orth_fn, batch_leaves, diagnostics)
        out = []
        for o, g, lay in zip(orth, g_leaves, layouts, strict=True):
            scale = shape_scale_factor(shape_scale, lay.fan_in, lay.fan_out, rms_scale)
            out.append((lay.from_matrix(o) * scale).astype(g.dtype))
        diag = None
        if diagnostics:
            diag = {"ortho_error": treedef.unflatten(errs), "update_rms": _rms_tree(out, treedef)}
        new_state = MuonState(count=count_inc, mu=treedef.unflatten(new_m), diagnostics=diag)
        return treedef.unflatten(out), new_state

    return optax.GradientTransformation(init_fn, update_fn)


# --------------------------------------------------------------------------- NorMuon


def scale_by_normuon(
    momentum: float = 0.95,
    beta2: float = 0.95,
    *,
    normuon_eps: float = 1e-10,
    momentum_form: str = "ema",
    nesterov: bool = True,
    orthogonalizer: str = "newton_schulz",
    ns_coeffs: Any = "jordan",
    ns_steps: int | None = None,
    ns_eps: float = 1e-7,
    ns_dtype: Any = None,
    ns_method: str = "auto",
    shape_scale: str = "jordan",
    rms_scale: float = 0.2,
    mu_dtype: Any = None,
    matrix_axes: MatrixAxes = None,
    batch_leaves: bool = True,
    ns_mesh: tuple[Any, str] | None = None,
    diagnostics: bool = False,
) -> optax.GradientTransformation:
    r"""NorMuon direction: Muon followed by per-neuron second-moment normalisation.

    After ``O = orth(U)`` (as in :func:`scale_by_muon`), per matrix ``[fan_in, fan_out]``::

        v <- beta2 v + (1 - beta2) mean_{fan_in}(O * O)      # [fan_out], one per output neuron
        O' = O / (sqrt(v) + normuon_eps)                      # row-wise in PyTorch's [out, in]
        O' <- O' * ||O||_F / (||O'||_F + normuon_eps)         # keep the pre-normalisation norm
        update = O' * shape_scale_factor(shape_scale, fan_in, fan_out)

    This is the official NorMuon update (its ``normuon_update``: EMA momentum with
    Nesterov, Frobenius norm preserved, Keller's ``"jordan"`` scaling).

    Args:
      momentum: first-moment decay ``beta``.
      beta2: second-moment decay in ``[0, 1)``.
      normuon_eps: added to ``sqrt(v)`` and to the norm in the rescale.
      others: as in :func:`scale_by_muon`.

    Returns:
      ``optax.GradientTransformation`` with state :class:`NorMuonState`.

    Raises:
      ValueError: as :func:`scale_by_muon`, or ``beta2`` outside ``[0, 1)``.

    References:
      Li et al., "NorMuon: Making Muon more efficient and scalable", arXiv 2510.05491.
    """
    steps = _validate_common(
        momentum, momentum_form, nesterov, False, orthogonalizer, ns_coeffs, ns_steps,
        ns_method, shape_scale,
    )  # fmt: skip
    _check_unit_interval("beta2", beta2)
    _check_ns_mesh(ns_mesh)
    orth_fn = _make_orth_fn(orthogonalizer, ns_coeffs, steps, ns_eps, ns_dtype, ns_method, ns_mesh)

    def init_fn(params):
        paths, leaves, treedef, layouts = _layouts(params, matrix_axes)
        mu = optax.tree.zeros_like(params, dtype=mu_dtype)
        nu = treedef.unflatten(
            [jnp.zeros(lay.batch_shape + (lay.fan_out,), jnp.float32) for lay in layouts]
        )
        diag = None
        if diagnostics:
            diag = _zero_diagnostics(params)
        return NorMuonState(count=jnp.zeros([], jnp.int32), mu=mu, nu=nu, diagnostics=diag)

    def update_fn(updates, state, params=None):
        del params
        _, g_leaves, treedef, layouts = _layouts(updates, matrix_axes)
        m_leaves = treedef.flatten_up_to(state.mu)
        v_leaves = treedef.flatten_up_to(state.nu)
        count_inc = optax.safe_increment(state.count)
        new_m, mats_u = [], []
        for g, m, lay in zip(g_leaves, m_leaves, layouts, strict=True):
            cdtype = jnp.promote_types(jnp.promote_types(g.dtype, m.dtype), jnp.float32)
            m_new, u = _momentum(
                g.astype(cdtype), m.astype(cdtype), count_inc, momentum, momentum_form,
                nesterov, False,
            )  # fmt: skip
            new_m.append(m_new.astype(m.dtype))
            mats_u.append(lay.to_matrix(u))
        orth, errs = _orthogonalize_with_errors(mats_u, orth_fn, batch_leaves, diagnostics)
        out, new_v = [], []
        for o, v, g, lay in zip(orth, v_leaves, g_leaves, layouts, strict=True):
            o = o.astype(jnp.promote_types(o.dtype, jnp.float32))  # [b, fan_in, fan_out]
            norm = jnp.sqrt(jnp.sum(o * o, axis=(1, 2), keepdims=True))
            v_mean = jnp.mean(o * o, axis=1)  # [b, fan_out]
            v = beta2 * v.reshape(v_mean.shape) + (1.0 - beta2) * v_mean
            o2 = o / (jnp.sqrt(v)[:, None, :] + normuon_eps)
            norm2 = jnp.sqrt(jnp.sum(o2 * o2, axis=(1, 2), keepdims=True))
            o2 = o2 * (norm / (norm2 + normuon_eps))
            scale = shape_scale_factor(shape_scale, lay.fan_in, lay.fan_out, rms_scale)
            out.append((lay.from_matrix(o2) * scale).astype(g.dtype))
            new_v.append(v.reshape(lay.batch_shape + (lay.fan_out,)))
        diag = None
        if diagnostics:
            diag = {"ortho_error": treedef.unflatten(errs), "update_rms": _rms_tree(out, treedef)}
        new_state = NorMuonState(
            count=count_inc,
            mu=treedef.unflatten(new_m),
            nu=treedef.unflatten(new_v),
            diagnostics=diag,
        )
        return treedef.unflatten(out), new_state

    return optax.GradientTransformation(init_fn, update_fn)


# --------------------------------------------------------------------------- aliases

_MUON_OPTIONS = (
    "momentum",
    "momentum_form",
    "nesterov",
    "bias_correction",
    "orthogonalizer",
    "ns_coeffs",
    "ns_steps",
    "ns_eps",
    "ns_dtype",
    "ns_method",
    "shape_scale",
    "rms_scale",
    "mu_dtype",
    "matrix_axes",
    "batch_leaves",
    "ns_mesh",
    "diagnostics",
)
_NORMUON_OPTIONS = tuple(o for o in _MUON_OPTIONS if o != "bias_correction") + (
    "beta2",
    "normuon_eps",
)


def _flatten_injected(extra: dict[str, Any]) -> dict[str, Any]:
    # optax.inject_hyperparams binds **kwargs as one argument named after the
    # VAR_KEYWORD parameter and passes it back as a keyword: unwrap it.
    nested = extra.pop("overrides", None)
    if isinstance(nested, dict):
        extra.update(nested)
    return extra


def _resolve(preset, explicit, allowed, weight_decay):
    unknown = sorted(set(explicit) - set(allowed))
    if unknown:
        names = sorted(allowed) + ["weight_decay", "weight_decay_mask"]
        raise ValueError(f"unknown option(s) {unknown}; allowed: {names}")
    opts: dict[str, Any] = {}
    wd = 0.0
    if preset is not None:
        base = preset_options(preset)
        wd = base.pop("weight_decay", 0.0)
        opts.update({k: v for k, v in base.items() if k in allowed})
    opts.update({k: v for k, v in explicit.items() if v is not None})
    if weight_decay is not None:
        wd = weight_decay
    return opts, wd


def _weight_decay(wd: Any, mask: Any) -> optax.GradientTransformation:
    """``optax.add_decayed_weights`` that tolerates ``params=None`` when ``wd == 0``."""
    inner = optax.add_decayed_weights(wd, mask)

    def update_fn(updates, state, params=None):
        if params is None and isinstance(wd, int | float) and wd == 0:
            return updates, state
        return inner.update(updates, state, params)

    return optax.GradientTransformation(inner.init, update_fn)


def muon(
    learning_rate: optax.ScalarOrSchedule,
    *,
    preset: str | None = None,
    weight_decay: float | None = None,
    weight_decay_mask: Any = None,
    **overrides: Any,
) -> optax.GradientTransformation:
    r"""Muon optimizer: :func:`scale_by_muon`, decoupled weight decay, learning rate.

    ``theta <- theta - lr * (O + wd * theta) = theta (1 - lr wd) - lr O`` where ``O`` is
    the :func:`scale_by_muon` output (the Keller Jordan / torch / optax convention).

    Args:
      learning_rate: float or optax schedule (units: spectral-norm-ish step per
        update for ``shape_scale="none"``; see ``shape_scale_factor``).
      preset: ``None`` (the :func:`scale_by_muon` defaults) or a name in
        ``amemory.optim.PRESETS`` (``"jordan"``, ``"moonlight"``, ``"torch"``,
        ``"optax"``, ``"wang2025"``); explicit options override the preset.
      weight_decay: decoupled weight decay ``wd`` (``None``: the preset's, else 0).
      weight_decay_mask: optax mask tree/callable for the decay.
      **overrides: any :func:`scale_by_muon` option.

    Returns:
      ``optax.GradientTransformation`` (a ``chain``); works with
      ``optax.inject_hyperparams(muon)(learning_rate=...)``, which injects
      ``learning_rate`` (and ``weight_decay`` when given); options passed through
      ``**overrides`` stay static. To inject ``momentum`` or ``rms_scale``, wrap
      :func:`scale_by_muon` instead: ``optax.inject_hyperparams(scale_by_muon)(momentum=0.9)``.

    Raises:
      ValueError: unknown preset or option name (lists the allowed ones), or a
        bad option value.

    Example:
      >>> import jax.numpy as jnp
      >>> tx = muon(0.02, preset="jordan", weight_decay=0.01)
      >>> state = tx.init({"w": jnp.zeros((8, 8))})
    """
    overrides = _flatten_injected(dict(overrides))
    opts, wd = _resolve(preset, overrides, _MUON_OPTIONS, weight_decay)
    return optax.chain(
        scale_by_muon(**opts),
        _weight_decay(wd, weight_decay_mask),
        optax.scale_by_learning_rate(learning_rate),
    )


def normuon(
    learning_rate: optax.ScalarOrSchedule,
    *,
    weight_decay: float | None = None,
    weight_decay_mask: Any = None,
    **overrides: Any,
) -> optax.GradientTransformation:
    """NorMuon optimizer: :func:`scale_by_normuon`, decoupled weight decay, learning rate.

    Args:
      learning_rate: float or optax schedule.
      weight_decay: decoupled weight decay (default 0), applied as in :func:`muon`.
      weight_decay_mask: optax mask for the decay.
      **overrides: any :func:`scale_by_normuon` option.

    Returns:
      ``optax.GradientTransformation``.

    Raises:
      ValueError: unknown option name (lists the allowed ones) or bad value.
    """
    overrides = _flatten_injected(dict(overrides))
    opts, wd = _resolve(None, overrides, _NORMUON_OPTIONS, weight_decay)
    return optax.chain(
        scale_by_normuon(**opts),
        _weight_decay(wd, weight_decay_mask),
        optax.scale_by_learning_rate(learning_rate),
    )


# --------------------------------------------------------------------------- diagnostics


def collect_diagnostics(opt_state: Any) -> dict[str, jax.Array]:
    """Flatten the diagnostics stored in every Muon/NorMuon state inside ``opt_state``.

    Walks any nesting (``chain``, ``partition``/``routed``, ``inject_hyperparams``)
    and returns ``{"ortho_error/<leaf path>": [] float32, "update_rms/<leaf path>": ...}``
    for every matrix leaf whose transform was built with ``diagnostics=True``:
    the orthogonality error (``orthogonalize.orthogonality_error``, averaged over
    batch axes) of the last update before shape scaling, and the RMS of the
    transform's output (before learning rate and weight decay). Empty dict when
    none is enabled. Update RMS per role of the final updates is left to the
    training loop (it sees them).
    """
    out: dict[str, jax.Array] = {}

    def is_state(x):
        return isinstance(x, MuonState | NorMuonState)

    for _, node in jax.tree_util.tree_flatten_with_path(opt_state, is_leaf=is_state)[0]:
        if not is_state(node) or node.diagnostics is None:
            continue
        for name, tree in node.diagnostics.items():
            for path, value in jax.tree_util.tree_flatten_with_path(tree)[0]:
                out[f"{name}/{path_str(path)}"] = value
    return out
