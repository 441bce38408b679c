"""A drop-in for ``optax.contrib.muon`` (optax 0.2.8) on amemory's kernels.

Same names, signatures, defaults, state trees and semantics as ``optax.contrib``'s
``muon``, ``scale_by_muon``, ``scale_by_shape``, ``orthogonalize_via_newton_schulz``,
``MuonDimensionNumbers`` and ``MuonState`` (optax's own classes: dimension-number trees
and checkpoints move unchanged): switching is ``from amemory.optim import contrib``.
What differs: same-shape matrices are orthogonalised in one batched call (the Gram form
for aspect ratio >= 2), in at least float32 (optax iterates in the momentum's dtype).

Source: optax 0.2.8 ``optax/contrib/_muon.py`` (API and semantics); Jordan (2024)
https://kellerjordan.github.io/posts/muon/ ; Liu et al. arXiv 2502.16982
(``consistent_rms``); Bernstein & Newhouse arXiv 2409.20325 (``adaptive``); Boissin et
al. arXiv 2512.04632 (``aol``); Grishina et al. arXiv 2506.10935 (``schatten``).
"""

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax.contrib import MuonDimensionNumbers, MuonState

from amemory.optim._chain import weight_decay as _decay
from amemory.optim._matrices import leaf_layouts, matrix_layout, orthogonalize
from amemory.optim._muon_core import MuonOptions, init_state, momentum, scale, shape_scale_factor
from amemory.optim._paths import path_keys
from amemory.optim.distributed import auto_sharded
from amemory.optim.orthogonalize import COEFFICIENT_SETS, PRECONDITIONINGS, newton_schulz

__all__ = [
    "MuonDimensionNumbers", "MuonState", "muon", "orthogonalize_via_newton_schulz",
    "scale_by_muon", "scale_by_shape",
]  # fmt: skip

WeightDimNumOrFn = Any  # MuonDimensionNumbers | tree of them (None: Adam) | callable(params)

_DEFAULT_NS_COEFFS = COEFFICIENT_SETS["jordan"][0][0]
#: optax's ``ns_coeffs`` preset strings -> amemory's coefficient sets.
NS_COEFF_PRESETS = {"standard": "jordan", "dion": "dion"}


def _is_dim(x: Any) -> bool:
    return isinstance(x, MuonDimensionNumbers)


def _is_spec(x: Any) -> bool:
    return x is None or _is_dim(x) or isinstance(x, optax.MaskedNode)


def _axes(dims: MuonDimensionNumbers) -> tuple[Any, Any]:
    return dims.reduction_axis, dims.output_axis


def _resolve_table(ns_coeffs: Any, ns_steps: Any) -> tuple[np.ndarray | jax.Array, int]:
    """optax's coefficient semantics: ``[3]`` repeated ``ns_steps`` times, or all rows of
    an ``[n, 3]`` table (``n <= ns_steps`` required; ``ns_steps`` is then ignored)."""
    if isinstance(ns_coeffs, str):
        if ns_coeffs not in NS_COEFF_PRESETS:
            raise ValueError(
                f"Unknown ns_coeff preset string: {ns_coeffs!r}; allowed: "
                f"{sorted(NS_COEFF_PRESETS)} or an array of shape (3,) or (n, 3)"
            )
        triples = COEFFICIENT_SETS[NS_COEFF_PRESETS[ns_coeffs]][0]
        ns_coeffs = triples[0] if len(triples) == 1 else triples
    traced = isinstance(ns_coeffs, jax.core.Tracer)
    table = ns_coeffs if traced else np.asarray(ns_coeffs, np.float64)
    if table.ndim not in (1, 2) or table.shape[-1] != 3:
        raise ValueError(f"ns_coeffs must have shape (3,) or (n, 3), got {table.shape}")
    if table.ndim == 2:
        if not table.shape[0] <= ns_steps:
            raise ValueError(f"Not enough coeffs to perform {ns_steps} steps")
        return table, int(table.shape[0])
    return table, int(ns_steps)


def _axes_fn(dims_tree: Any) -> Callable[[tuple, Any], Any]:
    """``matrix_axes`` callable of ``MuonOptions`` reading a (prefix) tree of specs."""
    if dims_tree is None or _is_dim(dims_tree):
        flat = {(): dims_tree}
    else:
        pairs = jax.tree_util.tree_flatten_with_path(dims_tree, is_leaf=_is_spec)[0]
        flat = {path_keys(p): d for p, d in pairs}

    def axes(keys, leaf):
        keys = tuple(keys)  # the longest prefix in flat (dimension numbers: a prefix tree)
        spec = next((flat[keys[:n]] for n in range(len(keys), -1, -1) if keys[:n] in flat), None)
        if _is_dim(spec):
            return _axes(spec)
        if np.ndim(leaf) != 2:
            raise ValueError(
                f"Input must have shape (m, n) or weight dimension numbers must be provided. "
                f"Got leaf {'/'.join(map(str, keys))!r} with shape {np.shape(leaf)} and "
                f"dimension_numbers={spec}."
            )
        return (0, 1)

    return axes


def orthogonalize_via_newton_schulz(
    x: jax.Array,
    ns_coeffs: jax.Array,
    ns_steps: int = 5,
    preconditioning: Literal["frobenius", "spectral", "aol", "schatten"] = "frobenius",
    eps: float = 1e-8,
    dimension_numbers: MuonDimensionNumbers | None = None,
) -> jax.Array:
    r"""Orthogonalize ``x`` via Newton-Schulz (``optax.contrib.orthogonalize_via_newton_schulz``).

    Runs ``amemory.optim.newton_schulz`` on the ``[batch, reduction, output]`` view of
    ``x`` (all batch matrices in one call; Gram form for aspect ratio >= 2). Arguments as
    optax's: ``ns_coeffs`` ``(3,)`` (repeated ``ns_steps`` times) or ``(n, 3)``;
    ``dimension_numbers`` names the reduction (fan-in) and output axes of a non-2-D ``x``.

    Returns the orthogonalised array (shape and dtype of ``x``); raises ``ValueError``
    for ``x`` not 2-D without ``dimension_numbers``, a bad ``ns_coeffs`` shape or an unknown
    ``preconditioning``.
    """
    if x.ndim != 2 and not _is_dim(dimension_numbers):
        raise ValueError(
            f"Input must have shape (m, n) or weight dimension numbers must be provided. "
            f"Got shape={x.shape} and dimension_numbers={dimension_numbers}."
        )
    if preconditioning not in PRECONDITIONINGS:
        raise ValueError(
            f"Unknown preconditioning {preconditioning!r}; allowed: {PRECONDITIONINGS}"
        )
    dims = MuonDimensionNumbers(0, 1) if x.ndim == 2 else dimension_numbers
    table, steps = _resolve_table(ns_coeffs, ns_steps)
    lay = matrix_layout(x, _axes(dims))
    m = lay.to_matrix(x)
    o = newton_schulz(
        m, coeffs=table, steps=steps, eps=eps, eps_mode="add", method="auto",
        preconditioning=preconditioning,
    )  # fmt: skip
    return lay.from_matrix(o)


def scale_by_muon(
    ns_coeffs: Any = _DEFAULT_NS_COEFFS,
    ns_steps: int = 5,
    beta: Any = 0.95,
    eps: Any = 1e-8,
    mu_dtype: Any | None = None,
    *,
    nesterov: bool = True,
    adaptive: bool = False,
    preconditioning: Literal["frobenius", "spectral", "aol", "schatten"] = "frobenius",
    weight_dimension_numbers: WeightDimNumOrFn | None = None,
) -> optax.GradientTransformation:
    r"""Muon direction with optax.contrib.scale_by_muon's signature and semantics.

    ``M <- beta M + (1 - beta) G``; with Nesterov ``U = beta M / (1 - beta^(t+1)) +
    (1 - beta) G / (1 - beta^t)``, else ``U = M / (1 - beta^t)``; ``O = NS(U)``; with
    ``adaptive``, ``O <- <U, O> O`` summed over the leaf (arXiv 2409.20325). No shape
    scaling (that is :func:`scale_by_shape`). Arguments as optax's.

    Returns a transformation with state ``MuonState(count, mu, ns_coeffs)``; raises
    ``ValueError`` for bad ``ns_coeffs``/``preconditioning`` (at construction) or a leaf
    that is not a matrix under its dimension numbers (at ``init``, naming it).
    """
    table, steps = _resolve_table(ns_coeffs, ns_steps)
    opts = MuonOptions(
        momentum=beta, momentum_form="ema", nesterov=nesterov, bias_correction=True,
        ns_coeffs=table, ns_steps=steps, ns_eps=eps, ns_eps_mode="add",
        preconditioning=preconditioning, nuclear_scale="leaf" if adaptive else "none",
        shape_scale="none", mu_dtype=mu_dtype,
    )  # fmt: skip

    def with_axes(tree):
        dims = weight_dimension_numbers
        dims = dims(tree) if callable(dims) else dims
        return dataclasses.replace(opts, matrix_axes=_axes_fn(dims))

    def init_fn(params):
        fields = init_state(params, with_axes(params))[2]  # validates every leaf
        return MuonState(count=fields["count"], mu=fields["mu"], ns_coeffs=jnp.asarray(table))

    def update_fn(updates, state, params=None):
        del params
        o = with_axes(updates)
        grads, treedef, layouts = leaf_layouts(updates, o.matrix_axes)
        count = optax.safe_increment(state.count)
        mu, u = momentum(grads, treedef.flatten_up_to(state.mu), count, o)
        mats = [lay.to_matrix(x) for x, lay in zip(u, layouts, strict=True)]
        out, _ = scale(orthogonalize(mats, layouts, o)[0], grads, layouts, o, None, treedef)
        return out, MuonState(count=count, mu=treedef.unflatten(mu), ns_coeffs=state.ns_coeffs)

    return auto_sharded(optax.GradientTransformation(init_fn, update_fn))


def scale_by_shape(
    weight_dimension_numbers: WeightDimNumOrFn | None = None, consistent_rms: Any | None = None
) -> optax.GradientTransformation:
    """Scale each matrix update by a factor of its shape (``optax.contrib.scale_by_shape``).

    ``sqrt(max(1, fan_out / fan_in))`` (Jordan), or with ``consistent_rms = r``,
    ``r * sqrt(max(fan_in, fan_out))`` (Moonlight's RMS matching); fans are the products
    of the reduction and output axes of each leaf's dimension numbers. Stateless.
    """

    def update_fn(updates, state, params=None):
        del params
        dims = weight_dimension_numbers
        dims = dims(updates) if callable(dims) else dims
        leaves, treedef, layouts = leaf_layouts(updates, _axes_fn(dims))
        kind = "jordan" if consistent_rms is None else "rms_match"
        out = [
            (x * shape_scale_factor(kind, lay.fan_in, lay.fan_out, consistent_rms)).astype(x.dtype)
            for x, lay in zip(leaves, layouts, strict=True)
        ]
        return treedef.unflatten(out), state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)


def muon(
    learning_rate: optax.ScalarOrSchedule,
    ns_coeffs: Any = _DEFAULT_NS_COEFFS,
    ns_steps: int = 5,
    beta: Any = 0.95,
    eps: Any = 1e-8,
    weight_decay: Any = 0.0,
    weight_decay_mask: Any | None = None,
    mu_dtype: Any | None = None,
    *,
    nesterov: bool = True,
    adaptive: bool = False,
    preconditioning: Literal["frobenius", "spectral", "aol", "schatten"] = "frobenius",
    adam_b1: Any = 0.9,
    adam_b2: Any = 0.999,
    adam_eps_root: Any = 0.0,
    adam_weight_decay: Any = 0.0,
    adam_learning_rate: optax.ScalarOrSchedule | None = None,
    muon_weight_dimension_numbers: WeightDimNumOrFn | None = None,
    consistent_rms: Any | None = None,
) -> optax.GradientTransformation:
    r"""Muon with optax.contrib.muon's signature, defaults and semantics (optax 0.2.8).

    Leaves that Muon treats (every 2-D leaf by default, or the leaves whose
    ``muon_weight_dimension_numbers`` entry is not ``None``) get
    ``-lr * (scale_by_shape(scale_by_muon(G)) + weight_decay * theta)``; every other
    leaf gets ``optax.adamw`` with the ``adam_*`` arguments (``eps``, ``mu_dtype`` and
    ``nesterov`` shared), as in optax. The state is optax's: ``PartitionState`` with
    ``"muon"`` (``(MuonState, EmptyState, weight-decay state, lr state)``) and ``"adam"``.
    Arguments as optax's (``ns_coeffs`` may also be ``"standard"`` or ``"dion"``).

    Raises:
      ValueError: an unknown ``ns_coeffs`` preset or bad coefficient shape, an unknown
        ``preconditioning``, or a Muon leaf that is not a matrix.

    Example:
      >>> import jax.numpy as jnp
      >>> tx = muon(0.02)
      >>> state = tx.init({"w": jnp.zeros((4, 8)), "b": jnp.zeros(8)})  # b goes to Adam
    """
    if adam_learning_rate is None:
        adam_learning_rate = learning_rate
    wdn = muon_weight_dimension_numbers

    def labels(params):
        if wdn is None:
            return jax.tree.map(lambda x: "muon" if np.ndim(x) == 2 else "adam", params)
        dims = wdn(params) if callable(wdn) else wdn
        return jax.tree.map(
            lambda d, sub: jax.tree.map(lambda _: "adam" if d is None else "muon", sub),
            dims,
            params,
            is_leaf=lambda x: x is None or _is_dim(x),
        )

    def muon_dims(params):
        dims = MuonDimensionNumbers() if wdn is None else (wdn(params) if callable(wdn) else wdn)
        mask = jax.tree.map(lambda label: label == "muon", labels(params))
        return jax.tree.map(
            lambda d, sub: jax.tree.map(lambda m: d if m else optax.MaskedNode(), sub),
            dims,
            mask,
            is_leaf=_is_spec,
        )

    direction = scale_by_muon(
        ns_coeffs=ns_coeffs, ns_steps=ns_steps, beta=beta, eps=eps, mu_dtype=mu_dtype,
        nesterov=nesterov, adaptive=adaptive, preconditioning=preconditioning,
        weight_dimension_numbers=muon_dims,
    )  # fmt: skip
    adam = optax.adamw(
        learning_rate=adam_learning_rate, b1=adam_b1, b2=adam_b2, eps=eps,
        eps_root=adam_eps_root, weight_decay=adam_weight_decay, mu_dtype=mu_dtype,
        nesterov=nesterov,
    )  # fmt: skip
    return optax.partition(
        transforms={
            "muon": optax.chain(
                direction,
                scale_by_shape(weight_dimension_numbers=muon_dims, consistent_rms=consistent_rms),
                _decay(weight_decay, weight_decay_mask),
                optax.scale_by_learning_rate(learning_rate),
            ),
            "adam": adam,
        },
        param_labels=labels,
    )
