"""Scanned layers: one compiled block run over a stack of layer parameters.

A decoder of ``L`` identical blocks can hold its parameters in two layouts:

* per-layer (``scan_layers=False``): ``layers/i/attn/q/kernel [D, D]``, one set per
  layer; the program contains ``L`` copies of the block (compile time grows with ``L``);
* stacked (``scan_layers=True``): ``layers/attn/q/kernel [L, D, D]``, every parameter of
  the block with a leading layer axis; the program contains one block inside a
  ``jax.lax.scan`` over that axis (compile time independent of ``L``), as MaxText's
  ``scan_layers`` and the Flax NNX guide to scanning over layers do.

Both compute the same function: :func:`stack_layers` / :func:`unstack_layers` convert
parameters between them. Optimizers see the stacked kernels as ``[L, fan_in, fan_out]``;
Muon must treat the layer axis as a batch axis (``matrix_axes=(-2, -1)``), so that each
layer's matrix is orthogonalised on its own, as in the per-layer layout.

The machinery here knows nothing about what a block contains: :func:`stacked_modules`
builds ``L`` instances of any ``nnx.Module`` factory under ``nnx.vmap``, and
:func:`scan_blocks` splits the stacked module into its graph and state and scans
``nnx.merge(graph, state[i])`` over the layers; :func:`layer_views` gives the layers
one by one (decoding with a per-layer cache).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

# Names of ``jax.checkpoint_policies`` accepted as a remat policy (what the forward pass
# keeps for the backward pass of a rematerialised block).
REMAT_POLICIES = (
    "nothing_saveable",
    "everything_saveable",
    "dots_saveable",
    "dots_with_no_batch_dims_saveable",
)


def _policy(name: str) -> Callable[..., bool]:
    if name not in REMAT_POLICIES:
        raise ValueError(f"remat_policy must be one of {REMAT_POLICIES}, got {name!r}")
    return getattr(jax.checkpoint_policies, name)


def remat(enabled: bool, policy: str = "nothing_saveable") -> Callable:
    """``nnx.remat`` with ``jax.checkpoint_policies.<policy>``, or the identity when disabled.

    Raises:
      ValueError: for a policy outside :data:`REMAT_POLICIES`.
    """
    if not enabled:
        return lambda f: f
    return functools.partial(nnx.remat, policy=_policy(policy))


def stacked_modules(make: Callable[[nnx.Rngs], nnx.Module], n: int, rngs: nnx.Rngs) -> Any:
    """``n`` modules from ``make(rngs)`` as one module whose every variable is ``[n, ...]``.

    Each instance draws its own initialisation: ``nnx.split_rngs`` hands instance ``i`` its
    own key, and ``nnx.vmap`` stacks the results (Flax NNX, "scan over layers").
    """

    @nnx.split_rngs(splits=n)
    @nnx.vmap(in_axes=(0,), out_axes=0, axis_size=n)
    def create(r: nnx.Rngs) -> nnx.Module:
        return make(r)

    return create(rngs)


def scan_blocks(
    blocks: nnx.Module,
    x: jax.Array,
    keys: jax.Array | None,
    remat_enabled: bool = False,
    remat_policy: str = "nothing_saveable",
) -> tuple[jax.Array, Any]:
    """Apply stacked blocks in order: ``x, aux_i <- block_i(x, keys[i])``, one scan.

    Args:
      blocks: a module from :func:`stacked_modules` (every variable ``[L, ...]``) whose
        instances are called as ``block(x, key) -> (x, aux)``, ``aux`` a pytree of arrays
        (e.g. a dict of scalars; ``{}``).
      x: the carried activation, e.g. ``[B, T, D]``; its shape and dtype stay fixed.
      keys: per-layer keys ``[L]`` (dropout), or None.
      remat_enabled: rematerialise the scanned body (``jax.checkpoint``) with
        ``jax.checkpoint_policies.<remat_policy>``.

    Returns:
      ``(x, aux)``: the activation after the last block (shape of ``x``) and every
      layer's ``aux`` stacked on a leading ``[L]`` axis.

    Raises:
      ValueError: for a policy outside :data:`REMAT_POLICIES`.
    """
    graphdef, state = nnx.split(blocks)

    def body(h, xs):
        layer_state, key = xs
        return nnx.merge(graphdef, layer_state)(h, key)

    if remat_enabled:
        body = jax.checkpoint(body, policy=_policy(remat_policy))
    return jax.lax.scan(body, x, (state, keys))


def layer_views(blocks: nnx.Module, n: int) -> list[nnx.Module]:
    """The ``n`` layers of a stacked module as separate modules (slices of its variables),
    for code that walks the layers one by one (e.g. decoding with a per-layer KV cache)."""
    graphdef, state = nnx.split(blocks)
    return [nnx.merge(graphdef, jax.tree.map(lambda v, i=i: v[i], state)) for i in range(n)]


def is_scanned(params: Mapping[str, Any]) -> bool:
    """True for the stacked layout (``layers/attn/q/kernel [L, ...]``), False for the
    per-layer one (``layers/i/attn/q/kernel``).

    Raises:
      ValueError: if params has no non-empty ``layers`` entry.
    """
    layers = params.get("layers") if isinstance(params, Mapping) else None
    if not isinstance(layers, Mapping) or not layers:
        raise ValueError("params has no 'layers' entry; expected a Transformer parameter dict")
    return not all(isinstance(k, int) or str(k).isdigit() for k in layers)


def stack_layers(params: Mapping[str, Any]) -> dict:
    """Per-layer parameters (``scan_layers=False``) -> the stacked layout (``scan_layers=True``).

    ``layers/i/<path>`` leaves ``[...]`` become ``layers/<path>`` leaves ``[L, ...]`` (layer i
    at index i); every other entry is kept. One seed (no leading seed axis).

    Raises:
      ValueError: if params are not in the per-layer layout.
    """
    if is_scanned(params):
        raise ValueError("params are already in the stacked (scan_layers=True) layout")
    layers = [params["layers"][i] for i in sorted(params["layers"], key=int)]
    return {**params, "layers": jax.tree.map(lambda *xs: jnp.stack(xs), *layers)}


def unstack_layers(params: Mapping[str, Any]) -> dict:
    """Stacked parameters (``scan_layers=True``) -> the per-layer layout with integer keys
    ``0..L-1`` (inverse of :func:`stack_layers`). One seed (no leading seed axis).

    Raises:
      ValueError: if params are not in the stacked layout.
    """
    if not is_scanned(params):
        raise ValueError("params are already in the per-layer (scan_layers=False) layout")
    stacked = params["layers"]
    n = jax.tree.leaves(stacked)[0].shape[0]
    return {**params, "layers": {i: jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(n)}}
