"""The update path shared by Muon and NorMuon (momentum, orthogonalisation, scaling).

Both transforms run the same steps per matrix leaf and differ only between
orthogonalisation and shape scaling (NorMuon normalises per output neuron there):

    1. validate options (:meth:`MuonCore.build`, before any compilation);
    2. momentum and the Nesterov look-ahead ``U`` (:func:`momentum_update`);
    3. ``O = orth(U)`` for all leaves, batched by shape (``_matrices``);
    4. ``update = O * shape_scale_factor(...)`` cast to the gradient dtype, plus the
       optional diagnostics (orthogonality error, update RMS) (:meth:`MuonCore.finish`).

Also the optimizer wrappers' shared glue (preset/override resolution, decoupled
weight decay, learning rate): :func:`optimizer`.

Sources: Jordan (2024) https://kellerjordan.github.io/posts/muon/ ; Liu et al.,
arXiv 2502.16982 (Moonlight); optax 0.2.8 ``optax.contrib.muon``; Wang et al.,
arXiv 2509.26030; Li et al., arXiv 2510.05491 (NorMuon).
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

from amemory.optim._matrices import (
    Layout,
    MatrixAxes,
    check_ns_mesh,
    leaf_layouts,
    make_orth_fn,
    orthogonalize_with_errors,
)
from amemory.optim.distributed import OwnerLayout, OwnerStacks, Post, resolve_layout
from amemory.optim.orthogonalize import coefficient_table
from amemory.optim.presets import preset_options

__all__ = [
    "MOMENTUM_FORMS",
    "MUON_OPTIONS",
    "NS_METHODS",
    "ORTHOGONALIZERS",
    "SHAPE_SCALES",
    "MuonCore",
    "Orthogonalized",
    "check_unit_interval",
    "momentum_update",
    "optimizer",
    "shape_scale_factor",
]

MOMENTUM_FORMS = ("ema", "sum")
ORTHOGONALIZERS = ("newton_schulz", "polar")
SHAPE_SCALES = ("none", "jordan", "rms_match", "spectral")
NS_METHODS = ("auto", "direct", "gram")


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


# --------------------------------------------------------------------------- validation


def _check_choice(name: str, value: Any, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r}; allowed: {tuple(allowed)}")


def check_unit_interval(name: str, value: Any, upper_open: bool = True) -> None:
    """Raise ``ValueError`` if a Python number ``value`` is outside ``[0, 1)``.

    Arrays (e.g. hyperparameters injected by ``optax.inject_hyperparams``) are not
    checked: they may be traced.
    """
    if isinstance(value, int | float) and not isinstance(value, bool):
        ok = 0.0 <= value < 1.0 if upper_open else 0.0 <= value <= 1.0
        if not ok:
            raise ValueError(f"{name} must be in [0, 1), got {value!r}")


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


# --------------------------------------------------------------------------- update path


def momentum_update(g, m, count_inc, beta, form, nesterov, bias_correction):
    """Return (new momentum, matrix to orthogonalise), both in the compute dtype.

    The formulas are listed in :func:`amemory.optim.scale_by_muon`'s docstring.
    """
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


class Orthogonalized(NamedTuple):
    """One update's state after step 3 (see module doc), input to :meth:`MuonCore.finish`."""

    count: jax.Array  # [] int32, incremented
    mu: Any  # new momentum tree (state dtype)
    mats: list[jax.Array]  # orth(U) per leaf, [batch, fan_in, fan_out]
    errors: list[jax.Array] | None  # [] float32 orthogonality error per leaf, or None
    post_state: OwnerStacks | None  # owner layout: the post hook's new state, else None
    grads: list[jax.Array]  # gradient leaves (for the output dtype)
    layouts: list[Layout]
    treedef: Any


def _rms_tree(leaves: list[jax.Array], treedef: Any) -> Any:
    rms = [jnp.sqrt(jnp.mean(jnp.square(x.astype(jnp.float32)))) for x in leaves]
    return treedef.unflatten(rms)


@dataclasses.dataclass(frozen=True)
class MuonCore:
    """Validated options and the shared steps of a Muon-family transform.

    ``momentum`` and ``rms_scale`` may be arrays (injected hyperparameters); every
    other field is static.
    """

    momentum: Any
    momentum_form: str
    nesterov: bool
    bias_correction: bool
    orth_fn: Callable[[jax.Array], jax.Array]
    shape_scale: str
    rms_scale: Any
    mu_dtype: Any
    matrix_axes: MatrixAxes
    batch_leaves: bool
    diagnostics: bool
    layout: OwnerLayout | None  # owner layout on a mesh (amemory.optim.distributed), or GSPMD

    @classmethod
    def build(
        cls,
        *,
        momentum: Any,
        momentum_form: str,
        nesterov: bool,
        bias_correction: bool,
        orthogonalizer: str,
        ns_coeffs: Any,
        ns_steps: int | None,
        ns_eps: float,
        ns_dtype: Any,
        ns_method: str,
        shape_scale: str,
        rms_scale: Any,
        mu_dtype: Any,
        matrix_axes: MatrixAxes,
        batch_leaves: bool,
        ns_mesh: tuple[Any, Any] | None,
        distributed: str,
        diagnostics: bool,
    ) -> MuonCore:
        """Validate the :func:`amemory.optim.scale_by_muon` options and build the core.

        Raises:
          ValueError: a bad option (names it and lists the allowed values).
        """
        check_unit_interval("momentum", momentum)
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
        check_ns_mesh(ns_mesh)
        layout = resolve_layout(distributed, ns_mesh)
        orth_fn = make_orth_fn(orthogonalizer, ns_coeffs, steps, ns_eps, ns_dtype, ns_method)
        return cls(
            momentum=momentum,
            momentum_form=momentum_form,
            nesterov=nesterov,
            bias_correction=bias_correction,
            orth_fn=orth_fn,
            shape_scale=shape_scale,
            rms_scale=rms_scale,
            mu_dtype=mu_dtype,
            matrix_axes=matrix_axes,
            batch_leaves=batch_leaves,
            diagnostics=diagnostics,
            layout=layout,
        )

    def init(self, params: Any) -> tuple[list[Layout], Any, dict[str, Any]]:
        """Validate every leaf and make the common state fields.

        Returns:
          ``(layouts, treedef, fields)`` with ``fields`` = ``count`` ([] int32 zero),
          ``mu`` (zeros like ``params`` in ``mu_dtype``) and ``diagnostics`` (None, or
          ``{"ortho_error", "update_rms"}`` trees of [] float32 zeros).

        Raises:
          ValueError: a leaf that is not a matrix (names path and shape).
        """
        _, treedef, layouts = leaf_layouts(params, self.matrix_axes)
        mu = optax.tree.zeros_like(params, dtype=self.mu_dtype)
        diag = None
        if self.diagnostics:
            zero = lambda _: jnp.zeros([], jnp.float32)  # noqa: E731
            diag = {
                "ortho_error": jax.tree.map(zero, params),
                "update_rms": jax.tree.map(zero, params),
            }
        return layouts, treedef, {"count": jnp.zeros([], jnp.int32), "mu": mu, "diagnostics": diag}

    def orthogonalize(
        self,
        updates: Any,
        mu: Any,
        count: jax.Array,
        post: Post | None = None,
        post_state: OwnerStacks | None = None,
    ) -> Orthogonalized:
        """Steps 2-3: momentum (compute dtype >= fp32), then batched ``orth(U)``.

        With an owner layout, ``post``/``post_state`` (see
        ``distributed.OwnerLayout.orthogonalize``) run on each matrix's owner right after
        orthogonalisation; without one they are ignored (the caller applies its own step).
        """
        g_leaves, treedef, layouts = leaf_layouts(updates, self.matrix_axes)
        m_leaves = treedef.flatten_up_to(mu)
        count_inc = optax.safe_increment(count)
        new_m, mats_u = [], []
        for g, m, lay in zip(g_leaves, m_leaves, layouts, strict=True):
            cdtype = jnp.promote_types(jnp.promote_types(g.dtype, m.dtype), jnp.float32)
            m_new, u = momentum_update(
                g.astype(cdtype), m.astype(cdtype), count_inc, self.momentum,
                self.momentum_form, self.nesterov, self.bias_correction,
            )  # fmt: skip
            new_m.append(m_new.astype(m.dtype))
            mats_u.append(lay.to_matrix(u))
        new_post = None
        if self.layout is None:
            orth, errs = orthogonalize_with_errors(
                mats_u, self.orth_fn, self.batch_leaves, self.diagnostics
            )
        else:
            orth, errs, new_post = self.layout.orthogonalize(
                mats_u, layouts, self.orth_fn, batch_leaves=self.batch_leaves, post=post,
                post_state=post_state, diagnostics=self.diagnostics,
            )  # fmt: skip
        return Orthogonalized(
            count=count_inc,
            mu=treedef.unflatten(new_m),
            mats=orth,
            errors=errs,
            post_state=new_post,
            grads=g_leaves,
            layouts=layouts,
            treedef=treedef,
        )

    def finish(
        self, step: Orthogonalized, mats: list[jax.Array]
    ) -> tuple[Any, dict[str, Any] | None]:
        """Step 4: shape-scale ``mats`` (``[batch, fan_in, fan_out]`` per leaf) into updates.

        Returns:
          ``(updates tree in the gradients' shapes and dtypes, diagnostics or None)``.
        """
        out = []
        for o, g, lay in zip(mats, step.grads, step.layouts, strict=True):
            scale = shape_scale_factor(self.shape_scale, lay.fan_in, lay.fan_out, self.rms_scale)
            out.append((lay.from_matrix(o) * scale).astype(g.dtype))
        diag = None
        if self.diagnostics:
            diag = {
                "ortho_error": step.treedef.unflatten(step.errors),
                "update_rms": _rms_tree(out, step.treedef),
            }
        return step.treedef.unflatten(out), diag


# --------------------------------------------------------------------------- optimizers

MUON_OPTIONS = (
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
    "distributed",
    "diagnostics",
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


def optimizer(
    scale_fn: Callable[..., optax.GradientTransformation],
    allowed: Sequence[str],
    learning_rate: optax.ScalarOrSchedule,
    *,
    preset: str | None,
    weight_decay: float | None,
    weight_decay_mask: Any,
    overrides: dict[str, Any],
) -> optax.GradientTransformation:
    """``chain(scale_fn(**opts), decoupled weight decay, scale_by_learning_rate)``.

    ``opts`` = the preset's options (if any) updated by the non-None ``overrides``;
    the weight decay is ``weight_decay`` if given, else the preset's, else 0.

    Raises:
      ValueError: an override not in ``allowed``, or an unknown preset.
    """
    overrides = _flatten_injected(dict(overrides))
    opts, wd = _resolve(preset, overrides, allowed, weight_decay)
    return optax.chain(
        scale_fn(**opts),
        _weight_decay(wd, weight_decay_mask),
        optax.scale_by_learning_rate(learning_rate),
    )
