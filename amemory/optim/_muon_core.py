"""The Muon family's options object and the steps its ``update_fn`` s are written with.

:class:`MuonOptions` holds every option of the family once; the public factories take its
fields as keyword arguments through :func:`with_options` (adding an option is one field
here). Each ``update_fn`` reads, as optax's ``scale_by_muon`` does: :func:`momentum`,
``_matrices.orthogonalize``, its own normalisation (NorMuon / AdaMuon), :func:`scale`.

Sources: Jordan (2024) https://kellerjordan.github.io/posts/muon/ ; Liu et al., arXiv
2502.16982 (Moonlight); optax 0.2.8 ``optax.contrib.muon``; Wang et al., arXiv 2509.26030;
Lau, Long, Su, "PolarGrad", arXiv 2505.21799 (nuclear-norm scaling); Bernstein & Newhouse,
"Old Optimizer, New Norm", arXiv 2409.20325 (the same scaling as the dual norm); Pethick
et al., "Scion", arXiv 2502.07529 (norm balls); Si et al., "AdaMuon", arXiv 2507.11005.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from amemory.optim._matrices import Layout, MatrixAxes, _resolve_dtype, check_ns_mesh, leaf_layouts
from amemory.optim.distributed import DISTRIBUTED_MODES, OwnerLayout, resolve_layout
from amemory.optim.orthogonalize import (
    NORMS,
    NS_EPS_MODES,
    NS_METHODS,
    PRECONDITIONINGS,
    _check_choice,
    coefficient_table,
    newton_schulz,
    polar,
)

MOMENTUM_FORMS = ("ema", "sum")
ORTHOGONALIZERS = ("newton_schulz", "polar")
SHAPE_SCALES = ("none", "jordan", "rms_match", "spectral")
NUCLEAR_SCALES = ("none", "matrix", "leaf")


def shape_scale_factor(
    kind: str, fan_in: int, fan_out: int, rms_scale: float | jax.Array = 0.2
) -> float | jax.Array:
    """Multiplier applied to an orthogonalised update of a ``[fan_in, fan_out]`` matrix.

    - ``"none"``: 1 (Wang et al. 2025; Li et al. 2026).
    - ``"jordan"``: ``sqrt(max(1, fan_out / fan_in))`` (Keller Jordan's reference,
      torch.optim.Muon "original", optax.contrib.muon).
    - ``"rms_match"``: ``rms_scale * sqrt(max(fan_in, fan_out))`` (Moonlight; gives
      update RMS ~ ``rms_scale``, like AdamW's ~0.2; optax's ``consistent_rms``).
    - ``"spectral"``: ``sqrt(fan_out / fan_in)`` (spectral-norm / muP scaling, Dion,
      Scion's normalised ``Spectral``).

    Raises ``ValueError`` for an unknown ``kind`` (lists the allowed ones).
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


def check_unit_interval(name: str, value: Any) -> None:
    """Raise ``ValueError`` if a Python number ``value`` is outside ``[0, 1)`` (arrays, e.g.
    injected hyperparameters, may be traced: not checked)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{name} must be in [0, 1), got {value!r}")


@dataclasses.dataclass(frozen=True)
class MuonOptions:
    """Every option of the Muon family, validated once (frozen; raises ``ValueError``).

    ``momentum``, ``ns_eps`` and ``rms_scale`` may be arrays (injected hyperparameters);
    every other field is static.

    Attributes:
      momentum: ``beta`` in ``[0, 1)``.
      momentum_form: ``"ema"`` (``M <- beta M + (1 - beta) G``) or ``"sum"`` (``M <- beta M + G``).
      nesterov: use the Nesterov look-ahead ``U`` (see ``scale_by_muon``).
      bias_correction: optax.contrib.muon's Adam-style bias correction (``"ema"`` only).
      norm: the unit ball whose LMO gives the direction (Scion, arXiv 2502.07529):
        ``"spectral"`` (Muon: ``orth(U)``), ``"sign"`` (SignGD), ``"colnorm"``,
        ``"rownorm"`` (see ``orthogonalize.norm_ball_lmo``). Only ``"spectral"``
        orthogonalises; the NS options below apply to it.
      orthogonalizer: ``"newton_schulz"`` or ``"polar"`` (exact, SVD; float64 under x64).
      ns_coeffs: a name of ``COEFFICIENT_SETS`` or an array ``[steps, 3]``.
      ns_steps: NS steps; ``None``: 5, or the length of an array ``ns_coeffs``. Static.
      ns_eps: guards the norm division before NS (1e-7 Keller/torch, 1e-8 optax).
      ns_eps_mode: ``"relative"`` (the update does not depend on the gradient's scale),
        ``"add"`` (Keller, optax) or ``"clamp"`` (torch.optim.Muon): see ``newton_schulz``.
      ns_dtype: NS compute dtype: ``None`` (momentum's dtype, at least fp32), a dtype or
        its name (``"bfloat16"``), or ``"auto"`` (bf16 on GPU/TPU, fp32 on CPU).
      ns_method: ``"auto"``, ``"direct"`` or ``"gram"`` (see ``newton_schulz``).
      preconditioning: ``"frobenius"``, ``"spectral"``, ``"aol"`` or ``"schatten"`` (ditto).
      gram_restarts: steps before which the Gram form restarts; ``None``: ``(2,)``
        (Dao-AILab) below 32-bit compute, ``(2, 4)`` in float32 (see ``newton_schulz``).
      presign: orthogonalise ``sign(U)`` instead of ``U`` (AdaMuon's sign stabilisation).
      nuclear_scale: ``"none"``; ``"matrix"`` multiplies each matrix's direction by
        ``<U, O>`` (``= ||U||_*`` for the exact polar factor: PolarGrad, arXiv
        2505.21799; the dual-norm step of arXiv 2409.20325); ``"leaf"`` by the sum of
        ``<U_b, O_b>`` over a leaf's matrices (optax.contrib.muon's ``adaptive=True``).
      shape_scale: ``"none"``, ``"jordan"``, ``"rms_match"`` or ``"spectral"``.
      rms_scale: ``c`` of ``"rms_match"`` (0.2 matches AdamW's update RMS).
      mu_dtype: momentum dtype (``None``: parameter dtype).
      matrix_axes: ``None`` (2-D leaves ``[fan_in, fan_out]``), a pair ``(in_axes,
        out_axes)`` (other axes are batch axes), or a callable ``(path_keys, leaf) -> pair
        | None`` (:mod:`amemory.optim.muon`). A triple ``(in_axes, out_axes, (axis,
        heads))`` first splits ``axis`` into ``[heads, size / heads]`` (per-head Muon).
      batch_leaves: orthogonalise same-shape leaves in one batched call (same result).
      ns_mesh: ``(mesh, axis)`` for sharded ``jit``: the device mesh and the mesh axis
        name(s) along which parameters are split (FSDP), for the owner layout.
      distributed: ``"owner"`` (each device orthogonalises a share of whole matrices,
        :mod:`amemory.optim.distributed`), ``"gspmd"`` (XLA's partitioner: collectives in
        every NS step) or ``"auto"`` (``"owner"`` when ``ns_mesh`` has several devices).
      diagnostics: keep each leaf's orthogonality error and update RMS of the last update
        in the state (read with ``amemory.optim.collect_diagnostics``).
    """

    momentum: Any = 0.95
    momentum_form: str = "ema"
    nesterov: bool = True
    bias_correction: bool = False
    norm: str = "spectral"
    orthogonalizer: str = "newton_schulz"
    ns_coeffs: Any = "jordan"
    ns_steps: int | None = None
    ns_eps: Any = 1e-7
    ns_eps_mode: str = "relative"
    ns_dtype: Any = None
    ns_method: str = "auto"
    preconditioning: str = "frobenius"
    gram_restarts: tuple[int, ...] | None = None
    presign: bool = False
    nuclear_scale: str = "none"
    shape_scale: str = "jordan"
    rms_scale: Any = 0.2
    mu_dtype: Any = None
    matrix_axes: MatrixAxes = None
    batch_leaves: bool = True
    ns_mesh: Any = None
    distributed: str = "auto"
    diagnostics: bool = False

    def __post_init__(self):
        check_unit_interval("momentum", self.momentum)
        _check_choice("momentum_form", self.momentum_form, MOMENTUM_FORMS)
        _check_choice("norm", self.norm, NORMS)
        _check_choice("orthogonalizer", self.orthogonalizer, ORTHOGONALIZERS)
        _check_choice("ns_method", self.ns_method, NS_METHODS)
        _check_choice("ns_eps_mode", self.ns_eps_mode, NS_EPS_MODES)
        _check_choice("preconditioning", self.preconditioning, PRECONDITIONINGS)
        _check_choice("nuclear_scale", self.nuclear_scale, NUCLEAR_SCALES)
        _check_choice("shape_scale", self.shape_scale, SHAPE_SCALES)
        _check_choice("distributed", self.distributed, DISTRIBUTED_MODES)
        for name in ("nesterov", "bias_correction", "presign", "batch_leaves", "diagnostics"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.bias_correction and self.momentum_form != "ema":
            raise ValueError("bias_correction=True needs momentum_form='ema' (optax convention)")
        for name in ("ns_coeffs", "ns_steps", "gram_restarts", "ns_dtype", "mu_dtype"):
            if isinstance(getattr(self, name), jax.core.Tracer):
                raise ValueError(
                    f"{name} must be static (a Python value); with optax.inject_hyperparams "
                    f"pass static_args=({name!r},)"
                )
        if self.ns_steps is not None and (
            isinstance(self.ns_steps, bool) or not isinstance(self.ns_steps, int | np.integer)
        ):
            raise ValueError(f"ns_steps must be None or an int >= 1, got {self.ns_steps!r}")
        coefficient_table(self.ns_coeffs, self.steps)  # raises ValueError on a bad spec
        restarts = self.gram_restarts
        if restarts is not None and (
            not isinstance(restarts, tuple | list)
            or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in restarts)
        ):
            raise ValueError(
                f"gram_restarts must be None or a tuple of ints >= 0, got {restarts!r}"
            )
        if self.ns_dtype not in (None, "auto"):
            try:
                jnp.dtype(self.ns_dtype)
            except TypeError:
                raise ValueError(
                    f"ns_dtype={self.ns_dtype!r}; allowed: None, 'auto', or a dtype "
                    "(e.g. 'bfloat16')"
                ) from None
        check_ns_mesh(self.ns_mesh)
        resolve_layout(self.distributed, self.ns_mesh)  # raises for "owner" without a mesh

    @property
    def steps(self) -> int:
        """Number of NS steps: ``ns_steps``, else the rows of an array table, else 5."""
        if self.ns_steps is not None:
            return int(self.ns_steps)
        if not isinstance(self.ns_coeffs, str) and np.ndim(self.ns_coeffs) == 2:
            return int(np.shape(self.ns_coeffs)[0])
        return 5

    @property
    def orth_fn(self) -> Callable[[jax.Array], jax.Array]:
        """The ``[b, k, l] -> [b, k, l]`` orthogonaliser of ``norm="spectral"``: exact
        ``polar``, or ``newton_schulz`` with these options (``ns_dtype="auto"``: bf16 unless
        the target devices, ``ns_mesh``'s or the ``jax.sharding.set_mesh`` mesh's, are CPUs;
        read it at trace time, for the devices the update is compiled for)."""
        if self.orthogonalizer == "polar":
            return polar
        return functools.partial(
            newton_schulz, coeffs=self.ns_coeffs, steps=self.steps, eps=self.ns_eps,
            eps_mode=self.ns_eps_mode, method=self.ns_method,
            preconditioning=self.preconditioning, gram_restarts=self.gram_restarts,
            dtype=_resolve_dtype(self.ns_dtype, self.ns_mesh),
        )  # fmt: skip

    @functools.cached_property
    def layout(self) -> OwnerLayout | None:
        """The owner layout on ``ns_mesh`` (``distributed``), or None (XLA places NS)."""
        if self.norm != "spectral":
            return None
        return resolve_layout(self.distributed, self.ns_mesh)


def init_state(params: Any, opts: MuonOptions) -> tuple[list[Layout], Any, dict[str, Any]]:
    """Validate every leaf (``ValueError`` naming a non-matrix) and make the family's state
    fields: ``(layouts, treedef, fields)`` with ``fields`` = ``count`` ([] int32 zero),
    ``mu`` (zeros like ``params`` in ``mu_dtype``) and ``diagnostics`` (None, or
    ``{"ortho_error", "update_rms"}`` trees of [] float32 zeros)."""
    leaves, treedef, layouts = leaf_layouts(params, opts.matrix_axes)
    mu = treedef.unflatten([jnp.zeros_like(x, opts.mu_dtype or _dtype(x)) for x in leaves])
    diag = None
    if opts.diagnostics:
        zeros = treedef.unflatten([jnp.zeros([], jnp.float32) for _ in leaves])
        diag = {"ortho_error": zeros, "update_rms": zeros}
    return layouts, treedef, {"count": jnp.zeros([], jnp.int32), "mu": mu, "diagnostics": diag}


def _dtype(x: Any) -> Any:
    return x.dtype if hasattr(x, "dtype") else jnp.asarray(x).dtype


def momentum(
    grads: list[jax.Array], mu: list[jax.Array], count: jax.Array, opts: MuonOptions
) -> tuple[list[jax.Array], list[jax.Array]]:
    """Momentum and the matrix to orthogonalise, per leaf (compute dtype >= fp32).

    ``count`` is the incremented step count; the formulas are in
    :func:`amemory.optim.scale_by_muon`'s docstring (bias corrections in ``g``'s real dtype).

    Returns:
      ``(new momentum per leaf in its state dtype, U per leaf in the compute dtype)``.
    """
    beta, ema = opts.momentum, opts.momentum_form == "ema"
    new_mu, us = [], []
    for g, m in zip(grads, mu, strict=True):
        cdtype = jnp.promote_types(jnp.promote_types(g.dtype, m.dtype), jnp.float32)
        g, m_old = g.astype(cdtype), m.astype(cdtype)
        m_new = beta * m_old + (1.0 - beta) * g if ema else beta * m_old + g
        if opts.bias_correction:  # optax.contrib.muon: Adam-style correction, NAdam Nesterov
            t = count.astype(jnp.real(g).dtype)
            if opts.nesterov:
                u = beta * m_new / (1.0 - beta ** (t + 1)) + (1.0 - beta) * g / (1.0 - beta**t)
            else:
                u = m_new / (1.0 - beta**t)
        elif opts.nesterov:
            u = beta * m_new + (1.0 - beta) * g if ema else g + beta * m_new
        else:
            u = m_new
        new_mu.append(m_new.astype(m.dtype))
        us.append(jnp.sign(u) if opts.presign else u)
    return new_mu, us


def scale(
    mats: list[jax.Array],
    grads: list[jax.Array],
    layouts: list[Layout],
    opts: MuonOptions,
    errors: list[jax.Array] | None,
    treedef: Any,
) -> tuple[Any, dict[str, Any] | None]:
    """Shape-scale the directions ``[batch, fan_in, fan_out]`` back into updates: ``(updates
    tree in the gradients' shapes and dtypes, diagnostics or None)``."""
    out = []
    for o, g, lay in zip(mats, grads, layouts, strict=True):
        factor = shape_scale_factor(opts.shape_scale, lay.fan_in, lay.fan_out, opts.rms_scale)
        out.append((lay.from_matrix(o) * factor).astype(g.dtype))
    diag = None
    if opts.diagnostics:
        rms = [jnp.sqrt(jnp.mean(jnp.abs(x.astype(jnp.float32)) ** 2)) for x in out]
        diag = {"ortho_error": treedef.unflatten(errors), "update_rms": treedef.unflatten(rms)}
    return treedef.unflatten(out), diag


class _Unset:
    """Default of an option a preset may set: "the preset's value, else the default"."""

    def __repr__(self) -> str:
        return "<preset or MuonOptions default>"


UNSET = _Unset()


def with_options(*, defaults: dict[str, Any] | None = None, unset_defaults: bool = False):
    """Decorator: the factory ``fn(..., **options)`` takes every :class:`MuonOptions` field.

    The wrapped function's signature (``inspect.signature``) lists ``fn``'s own parameters
    followed by each field as a keyword-only parameter (default: ``defaults`` or the
    field's default, or :data:`UNSET` with ``unset_defaults``), so ``help`` shows them and
    ``optax.inject_hyperparams`` binds and injects them. ``fn`` receives every option as a
    keyword (unset ones as :data:`UNSET`); the wrapper raises ``ValueError`` for an unknown
    keyword (lists the allowed ones).
    """
    defaults = defaults or {}

    def deco(fn):
        sig = inspect.signature(fn)
        own = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
        taken = {p.name for p in own}
        extra = [
            inspect.Parameter(
                f.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=UNSET if unset_defaults else defaults.get(f.name, f.default),
                annotation=f.type,
            )
            for f in dataclasses.fields(MuonOptions)
            if f.name not in taken
        ]
        full = sig.replace(parameters=own + extra)
        allowed = list(full.parameters)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            unknown = sorted(set(kwargs) - set(allowed))
            if unknown:
                raise ValueError(f"{fn.__name__}: unknown option(s) {unknown}; allowed: {allowed}")
            bound = full.bind(*args, **kwargs)
            bound.apply_defaults()
            return fn(**bound.arguments)

        wrapper.__signature__ = full
        return wrapper

    return deco


def options_from(kwargs: dict[str, Any], base: dict[str, Any] | None = None) -> MuonOptions:
    """``MuonOptions`` from ``base`` (e.g. a preset) updated by the set ``kwargs``.

    An explicitly passed ``None`` counts as set (it overrides the base); :data:`UNSET`
    does not. Keys of ``kwargs`` that are not fields are ignored.
    """
    names = {f.name for f in dataclasses.fields(MuonOptions)}
    opts = {k: v for k, v in (base or {}).items() if k in names}
    opts.update({k: v for k, v in kwargs.items() if k in names and v is not UNSET})
    return MuonOptions(**opts)
