"""The hidden matrices of a :mod:`amemory.models.transformer` parameter tree, for spectra,
and the head layout of its attention kernels (:func:`head_view`, for per-head Muon and
QK-Clip). The readers take either parameter layout (per-layer ``layers/i/...`` or stacked
``layers/... [L, ...]``, :mod:`amemory.models.scan`), carry leading seed axes through and
return matrices ``[..., d_out, d_in]`` (``y = W x``: the Flax kernel transposed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from amemory.models.roles import FFN_ROLES, HIDDEN_ROLES, matrix_axes, role_of
from amemory.models.scan import is_scanned

#: Attention roles whose kernel concatenates the heads (head-major) along an axis -> (that
#: axis, the power of QK-Clip's ``gamma`` its heads take): MHA ``q``, ``k`` 0.5 each (Kimi
#: K2, arXiv 2507.20534, Sec. 2.1); MLA 0.5 on the no-RoPE ``q``/``q_up`` and ``k_up``, 1 on
#: ``q_rope``, 0 on values (MaxText ``qk_clip_utils.py``); the shared ``k_rope`` has no heads.
HEADS = {
    **dict.fromkeys(("q", "k", "q_up", "k_up"), (-1, 0.5)), "q_rope": (-1, 1.0),
    **dict.fromkeys(("v", "v_up"), (-1, 0.0)), "o": (-2, 0.0),
}  # fmt: skip
#: MQA / GQA (a K head shared by query heads, as MLA's RoPE key): all of ``gamma`` on the
#: query head, the shared key untouched (MaxText ``qk_clip_utils.py``'s rule for it).
GROUPED = {"q": 1.0, "k": 0.0}
KV_ROLES = ("k", "v")  # roles whose kernels hold the config.kv_heads K/V heads


def head_view(config: Any):
    """``(path, leaf) -> (layer, head axis, heads, QK-Clip power) | None`` (:data:`HEADS`;
    ``heads``: ``config.kv_heads`` for :data:`KV_ROLES`, else ``n_heads``; :data:`GROUPED`
    powers when ``kv_heads < n_heads``; ``layer`` None for a stacked leaf ``[L, ...]``), the
    model side of ``amemory.optim.qk_clip`` and of :func:`per_head_axes`."""
    grouped = config.kv_heads < config.n_heads

    def view(path: Any, leaf: Any = None):
        role = role_of(path)
        axis, power = HEADS.get(role, (None, 0.0))
        if axis is None:
            return None
        layer = [int(k) for k in path[1:2] if isinstance(k, int) or str(k).isdigit()]
        heads = config.kv_heads if role in KV_ROLES else config.n_heads
        power = GROUPED.get(role, power) if grouped else power
        return (layer[0] if layer else None), axis, heads, power

    return view


def per_head_axes(config: Any, roles: Any = HEADS):
    """Muon's ``matrix_axes`` with the kernels of ``roles`` (of :data:`HEADS`) per head
    (``[..., d_in, H w] -> [..., H] x [d_in, w]``; ``o``: ``[..., H] x [w, D]``), others as
    ``roles.matrix_axes``. Kimi K3 (arXiv 2607.24653, Sec. 2.5); GLM-5's "Muon Split"
    (arXiv 2602.15763)."""
    view = head_view(config)

    def axes(path: Any, leaf: Any = None):
        heads = view(path, leaf)
        if heads is None or role_of(path) not in roles:
            return matrix_axes(path, leaf)
        return (-3 if heads[1] == -1 else -2, -1, heads[1:3])

    return axes


def _kernels(params: Mapping[str, Any], group: str, role: str) -> jax.Array | None:
    """Kernels of one role over layers ``[..., L, d_in, d_out]`` (either layout), or None.

    In the stacked layout the layer axis sits after any leading seed axes already.
    """
    if is_scanned(params):
        module = params["layers"][group].get(role)
        return None if module is None else module["kernel"]
    layers = params["layers"]
    ids = sorted(layers, key=int)
    if role not in layers[ids[0]][group]:
        return None
    return jnp.stack([layers[i][group][role]["kernel"] for i in ids], axis=-3)


def _math(kernel: jax.Array) -> jax.Array:
    """Flax kernel ``[..., d_in, d_out]`` -> matrix ``[..., d_out, d_in]``."""
    return jnp.swapaxes(kernel, -1, -2)


def _per_query_head(wv: jax.Array, config: Any) -> jax.Array:
    """Value matrix ``[..., H_kv d_h, D]`` -> ``[..., H d_h, D]``: each K/V head's rows
    repeated for the ``H / H_kv`` query heads that read it (MQA / GQA; identity for MHA)."""
    h_kv = config.kv_heads if config is not None else None
    if h_kv is None or h_kv == config.n_heads:
        return wv
    lead, dh = wv.shape[:-2], config.head_dim
    heads = jnp.repeat(wv.reshape(*lead, h_kv, dh, wv.shape[-1]), config.n_heads // h_kv, -3)
    return heads.reshape(*lead, config.n_heads * dh, wv.shape[-1])


def vo_maps(params: Mapping[str, Any], config: Any, *, per_head: bool = True):
    """Value-output maps of every layer, in the ``y = M x`` convention.

    Head h maps the (normalised) residual stream through ``W_O^h W_V^h``, with
    ``W_V^h = W_V[h rows]`` ``[Dh, D]`` and ``W_O^h = W_O[:, h cols]`` ``[D, Dh]``
    (W = kernel.T). The full-layer map is ``W_O W_V = Σ_h W_O^h W_V^h``. Paper A (A.3)
    measures isotropy of VO.

    Args:
      params: parameter dict from :func:`init`, either layout (seed axes carried through).
      config: its ``TransformerConfig`` (for the head split).
      per_head: return per-head maps (rank <= Dh each) or the per-layer sum.

    Returns ``[..., n_layers, n_heads, D, D]`` if ``per_head`` else ``[..., n_layers, D,
    D]``; raises ``ValueError`` for ``attention`` other than ``"mha"`` or params that are
    not a Transformer parameter dict.
    """
    if config.attention != "mha":
        raise ValueError(f"vo_maps needs attention='mha', got {config.attention!r}")
    h, dh = config.n_heads, config.head_dim
    wv = _per_query_head(_math(_kernels(params, "attn", "v")), config)  # [..., L, D, D(in)]
    wo = _math(_kernels(params, "attn", "o"))
    if not per_head:
        return wo @ wv  # [..., L, D, D]
    lead = wv.shape[:-2]
    wv_h = wv.reshape(*lead, h, dh, wv.shape[-1])  # [..., L, H, Dh, D]
    wo_h = jnp.moveaxis(wo.reshape(*lead, wo.shape[-2], h, dh), -2, -3)  # [..., L, H, D, Dh]
    return wo_h @ wv_h  # [..., L, H, D, D]


def ffn_matrices(params: Mapping[str, Any]) -> dict[str, jax.Array]:
    """FFN matrices stacked over layers (either layout): ``{"w_in": [..., L, F, D], "w_out":
    [..., L, D, F]}`` plus ``"w_gate": [..., L, F, D]`` for SwiGLU models. Raises
    ``ValueError`` if params is not a Transformer parameter dict."""
    out = {r: _kernels(params, "mlp", r) for r in FFN_ROLES}
    return {r: _math(k) for r, k in out.items() if k is not None}


def hidden_matrices(
    params: Mapping[str, Any], *, include_vo: bool = True, config: Any = None
) -> dict[str, jax.Array]:
    """Every hidden matrix by name, for spectrum logging (either layout).

    ``config`` (the ``TransformerConfig``) pairs each query head's ``W_O^h`` with its K/V
    head's ``W_V`` for ``"vo"`` when ``n_kv_heads < n_heads``.

    Returns:
      ``{"layers/i/<role>": [..., d_out, d_in]}`` for every role of :data:`HIDDEN_ROLES`
      present (routed experts ``[..., E, d_out, d_in]``), plus ``"layers/i/vo"`` ``[..., D,
      D]`` when ``include_vo``: the value-output product paper A analyses, ``W_O W_V``
      (MHA) or ``W_O W_uv W_dkv`` (MLA; not a role).

    Raises:
      ValueError: if params is not a Transformer parameter dict, or ``include_vo`` with
        grouped K/V heads and no ``config``.
    """
    out = {}
    for i, path, leaf in _block_leaves(params):
        role = role_of(("layers", i, *path))
        if role in HIDDEN_ROLES:
            out[f"layers/{i}/{role}"] = _math(leaf)
    if include_vo:
        for i in sorted({int(k.split("/")[1]) for k in out}):
            v, o = out.get(f"layers/{i}/v"), out[f"layers/{i}/o"]
            if v is None:  # MLA: values are v_up(kv_down(x))
                v = out[f"layers/{i}/v_up"] @ out[f"layers/{i}/kv_down"]
            if v.shape[-2] != o.shape[-1] and config is None:
                raise ValueError(
                    f"hidden_matrices: v {v.shape} and o {o.shape} of layer {i} have different "
                    "head counts (n_kv_heads < n_heads): pass config= to pair them per head"
                )
            out[f"layers/{i}/vo"] = o @ _per_query_head(v, config)
    return out


def _block_leaves(params: Mapping[str, Any]):
    """``(layer index, path inside the block, leaf)`` of every block parameter, either
    layout; a stacked leaf is sliced at its layer axis (after any leading seed axes: the
    axes of one layer's leaf are 3 for routed experts, 1 for norms and biases, else 2)."""
    layers = params["layers"]
    if not is_scanned(params):
        for i in sorted(layers, key=int):
            for path, leaf in jax.tree_util.tree_flatten_with_path(layers[i])[0]:
                yield int(i), path, leaf
        return
    for path, leaf in jax.tree_util.tree_flatten_with_path(layers)[0]:
        role = role_of(("layers", *path))
        per_layer = 3 if role.startswith("expert_") else 1 if role in ("norm", "bias") else 2
        axis = jnp.ndim(leaf) - per_layer - 1
        for i in range(jnp.shape(leaf)[axis]):
            yield i, path, leaf[(slice(None),) * axis + (i,)]
