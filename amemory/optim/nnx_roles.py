"""Roles and matrix axes of models built from standard ``flax.nnx`` layers (foreign models).

:func:`nnx_layers` reads each layer once and gives a ``role`` function (for
``optim.routed``) and a ``matrix_axes`` function (for Muon) that agree: a kernel with role
``dense``, ``head`` or ``q|k|v|o`` has a matrix ``(fan_in, fan_out)``, nothing else does.
``Linear`` ``[in, out]``; ``LinearGeneral`` ``[*batch, *in, *out]``; ``Einsum`` from its
string (kernel axes summed over are ``fan_in``, axes it adds to the output ``fan_out``:
``"BTD,NDH->BTNH"`` ``[N, D, H]`` is ``(D, N*H)``); ``Conv``/``ConvTranspose`` ``[*k, c_in,
c_out]`` is ``(prod(k) * c_in, c_out)``; ``MultiHeadAttention`` ``query|key|value`` ``[d,
H, d_h]`` are ``q|k|v`` ``(d, H*d_h)``, ``out`` ``[H, d_h, d]`` is ``o``; ``Embed``, norm
``scale`` and ``bias`` have roles but no matrix; ``nnx.LoRA`` ``lora_a [in, r]`` / ``lora_b
[r, out]`` are matrices with roles ``lora_a`` / ``lora_b`` (in no group); any other
parameter is a ``ValueError`` naming it. Layers stacked by ``nnx.vmap`` / ``nnx.scan`` get
their leading axes as batch axes (one matrix per layer); other extra axes raise.

The output layer gets role ``head``: the ``Linear``/``LinearGeneral``/``Einsum`` defined
last among the model's own attributes, one under :data:`HEAD_NAMES` at the top, or those
named by ``heads=``; when none is found a warning names the kernel that goes to Muon.
:func:`nnx_role` / :func:`nnx_matrix_axes` read the table from a path alone. Example:
docs/own-models.md.

Source: the parameter names and kernel layouts of ``flax.nnx`` 0.12; Jordan (2024),
https://kellerjordan.github.io/posts/muon/ (output layer and embeddings to Adam; conv
kernels flattened).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np

from amemory.optim._paths import path_keys
from amemory.optim.routing import Roles

__all__ = [
    "HEAD_NAMES", "NnxLayers", "nnx_layers", "nnx_matrix_axes", "nnx_per_head_matrix_axes",
    "nnx_role",
]  # fmt: skip

_ATTENTION = {"query": "q", "key": "k", "value": "v", "out": "o"}
#: The roles this module gives, and the groups a routing spec may name (``hidden``: every
#: kernel but the head).
_LORA = ("lora_a", "lora_b")
_VOCAB = (
    ("q", "k", "v", "o", "dense", "head", "embed", "norm", "bias", *_LORA),
    {"qk": ("q", "k"), "vo": ("v", "o"), "hidden": ("q", "k", "v", "o", "dense"), "lora": _LORA},
)
#: Layer names of a model's output layer at the model top (``head``/``lm_head`` anywhere).
HEAD_NAMES = ("head", "lm_head", "output_layer", "classifier", "logits", "out_proj")


def _keys(path: Any) -> tuple:
    return tuple(path.split("/")) if isinstance(path, str) else path_keys(tuple(path))


def _classify(keys: tuple, shape: tuple) -> tuple[str, Any]:
    """``(role, matrix axes or None)`` of a parameter from its path and shape alone."""
    name, parent = keys[-1] if keys else None, keys[-2] if len(keys) >= 2 else None
    where = f"parameter {'/'.join(map(str, keys))!r} with shape {shape}"
    if name in ("embedding", "scale", "bias"):
        return {"embedding": "embed", "scale": "norm", "bias": "bias"}[name], None
    if name in _LORA and len(shape) == 2:
        return name, (0, 1)
    if name != "kernel":
        raise ValueError(
            f"nnx_role: cannot classify {where}; known: Linear, LinearGeneral, Einsum, Conv, "
            f"ConvTranspose and MultiHeadAttention kernels, Embed 'embedding', norm 'scale', "
            "any 'bias', LoRA 'lora_a'/'lora_b' (stacked ones: use optim.nnx_layers); pass "
            "your own role_fn for other parameters"
        )
    if len(shape) == 3 and parent in _ATTENTION:
        return _ATTENTION[parent], ((0, 1), 2) if parent == "out" else (0, (1, 2))
    if len(shape) == 2:
        head = parent in HEAD_NAMES[:2] or (len(keys) == 2 and parent in HEAD_NAMES)
        return ("head" if head else "dense"), (0, 1)
    raise ValueError(
        f"nnx_role: the matrix of {where} is not readable from its path (a Conv, "
        "LinearGeneral or Einsum kernel): use optim.nnx_layers(model).role / .matrix_axes"
    )


@dataclasses.dataclass(frozen=True)
class NnxLayers:
    """Roles and matrix axes of a model's parameters: ``kernels`` maps ``"path/to/kernel"``
    to ``(role, (in_axes, out_axes))`` as :func:`nnx_layers` read it; any other parameter
    is classified from its path and shape."""

    kernels: dict[str, tuple[str, Any]]

    @property
    def role(self) -> Roles:
        """``role_fn`` for ``optim.routed`` (an ``optim.routing.Roles`` with the vocabulary:
        roles ``q k v o dense head embed norm bias``, groups ``qk``, ``vo``, ``hidden``)."""
        return Roles(self._role, *_VOCAB)

    def _role(self, path: Any, leaf: Any = None) -> str:
        """The role of one parameter (``path``: a key path or ``"a/b/kernel"``); a 2-D kernel
        at the model top read from its path alone is ``"dense"`` with a warning.

        Raises:
          ValueError: a parameter outside the table, or a kernel whose matrix its path
            cannot tell (Conv, LinearGeneral, Einsum; names it, points to nnx_layers).
        """
        keys = _keys(path)
        role, _ = self._lookup(keys, leaf if leaf is not None else np.zeros((0, 0)))
        name = "/".join(map(str, keys))
        if role == "dense" and len(keys) == 2 and name not in self.kernels:
            warnings.warn(
                f"nnx_role: {name!r} is a kernel at the model top labelled 'dense' (Muon); "
                f"if it computes the logits, name its layer one of {HEAD_NAMES} or use "
                "optim.nnx_layers(model), which finds the output layer",
                stacklevel=2,
            )
        return role

    def matrix_axes(self, path: Any, leaf: Any) -> tuple[Any, Any] | None:
        """``matrix_axes`` for Muon: a kernel's ``(in_axes, out_axes)``, else None (raises
        ``ValueError`` as :meth:`_role`)."""
        return self._lookup(_keys(path), leaf)[1]

    def per_head_matrix_axes(self, path: Any, leaf: Any) -> tuple[Any, Any] | None:
        """:meth:`matrix_axes` with attention kernels per head: the head axis (the first of
        ``q|k|v``'s output axes ``[.., d, H, d_h]``, of ``o``'s input axes ``[.., H, d_h,
        d]``; its size is the layer's own head count) becomes a batch axis; Kimi K3's
        per-head Muon (arXiv 2607.24653, Sec. 2.5)."""
        role, axes = self._lookup(_keys(path), leaf)
        if axes is None or role not in _ATTENTION.values():
            return axes
        split = 0 if role == "o" else 1  # o: heads on the input side
        if isinstance(axes[split], tuple) and len(axes[split]) == 2:
            return (axes[0], axes[1][1]) if split else (axes[0][1], axes[1])
        return axes

    def _lookup(self, keys: tuple, leaf: Any) -> tuple[str, Any]:
        hit = self.kernels.get("/".join(map(str, keys)))
        return hit if hit is not None else _classify(keys, tuple(np.shape(leaf)))


#: The module table read from a path alone (no model): enough for Linear ``(0, 1)``,
#: MultiHeadAttention (``(0, (1, 2))`` for ``query|key|value`` ``[d, H, d_h]``,
#: ``((0, 1), 2)`` for ``out`` ``[H, d_h, d]``; per head ``(0, 2)`` and ``(1, 2)``),
#: Embed, norms, biases and unstacked LoRA.
_PATH_ONLY = NnxLayers({})
nnx_role, nnx_matrix_axes = _PATH_ONLY.role, _PATH_ONLY.matrix_axes
nnx_per_head_matrix_axes = _PATH_ONLY.per_head_matrix_axes


def _stacked(axes: Any, extra: int) -> Any:
    """``(in_axes, out_axes)`` of one layer's kernel shifted past ``extra`` leading axes."""
    return tuple(a + extra if isinstance(a, int) else tuple(i + extra for i in a) for a in axes)


def _extra(name: str, shape: tuple, declared: tuple) -> int:
    """How many leading (stacked-layer) axes ``shape`` has beyond the layer's ``declared``;
    ``ValueError`` naming the leaf if its trailing axes are not ``declared``."""
    extra = len(shape) - len(declared)
    if extra < 0 or tuple(shape[extra:]) != tuple(declared):
        raise ValueError(
            f"nnx_layers: {name!r} has shape {tuple(shape)} but its layer declares "
            f"{tuple(declared)}; stacked layers (nnx.vmap / nnx.scan) must put their layer "
            "axes first (out_axes=0), or pass your own matrix_axes for this leaf"
        )
    return extra


def _declared(mod: Any, nnx: Any) -> tuple[tuple[int, ...], Any] | None:
    """``(kernel shape one layer declares, its (in_axes, out_axes))``, or None (another
    layer: classified by its path)."""
    if isinstance(mod, nnx.Conv | nnx.ConvTranspose):
        n = len(mod.kernel_shape)
        return tuple(mod.kernel_shape), (tuple(range(n - 1)), n - 1)
    if isinstance(mod, nnx.LinearGeneral):
        shape = (*mod.batch_axis.values(), *mod.in_features, *mod.out_features)
        nb, ni = len(mod.batch_axis), len(mod.in_features)
        return shape, (tuple(range(nb, nb + ni)), tuple(range(nb + ni, len(shape))))
    if isinstance(mod, nnx.Einsum):
        return tuple(mod.kernel_shape), _einsum_axes(mod.einsum_str, len(mod.kernel_shape))
    if isinstance(mod, nnx.Linear):
        return (mod.in_features, mod.out_features), (0, 1)
    return None


def _einsum_axes(spec: str, ndim: int) -> tuple[Any, Any] | None:
    """``(in_axes, out_axes)`` of an Einsum kernel (the second operand), or None."""
    lhs, _, out = spec.replace(" ", "").partition("->")
    x, _, w = lhs.partition(",")
    if len(w) != ndim or "." in w:
        return None
    fan_in = tuple(i for i, c in enumerate(w) if c in x and c not in out)
    fan_out = tuple(i for i, c in enumerate(w) if c in out and c not in x)
    return (fan_in, fan_out) if fan_in and fan_out else None


def _in_order(node: Any, path: tuple, nnx: Any):
    """``(path, module)`` of every module under ``node`` (``nnx.List``/``nnx.Dict``
    included: Flax 0.12 stores containers of modules only so), in definition order."""
    if isinstance(node, nnx.Module):
        yield path, node
        for key, child in vars(node).items():
            if not key.startswith("_"):
                yield from _in_order(child, path + (key,), nnx)


def nnx_layers(model: Any, *, heads: tuple[str, ...] | None = None) -> NnxLayers:
    """Read the role and matrix of every kernel of a ``flax.nnx`` model (module table).

    Args:
      model: an ``nnx.Module``.
      heads: layer paths (``"decoder/proj"``) of the output layer(s); ``None`` finds it
        (module doc), ``()`` declares there is none (a tied embedding).

    Returns:
      :class:`NnxLayers` (``.role`` is a ``role_fn``, ``.matrix_axes`` Muon's).

    Raises:
      ValueError: ``heads`` names a layer without a kernel (lists those with one); an
        Einsum kernel with no matrix view; a kernel (or LoRA matrix) whose trailing axes
        are not its layer's declared shape (names it).
    """
    from flax import nnx  # only here: amemory.optim imports no Flax at module level

    kernels, order, attention = {}, [], set()
    for path, mod in _in_order(model, (), nnx):
        if isinstance(mod, nnx.MultiHeadAttention):
            attention.add(path)
        if isinstance(mod, nnx.LoRA):  # lora_a [.., in, r], lora_b [.., r, out]
            a, b = np.shape(mod.lora_a), np.shape(mod.lora_b)
            wants = ((a, (mod.in_features, a[-1])), (b, (a[-1], mod.out_features)))
            for leaf, (shape, want) in zip(_LORA, wants, strict=True):
                name = "/".join(map(str, path + (leaf,)))
                kernels[name] = (leaf, _stacked((0, 1), _extra(name, shape, want)))
        declared = _declared(mod, nnx)
        if declared is None or not isinstance(getattr(mod, "kernel", None), nnx.Param):
            continue
        name = "/".join(map(str, path + ("kernel",)))
        if declared[1] is None:
            raise ValueError(
                f"nnx_layers: Einsum kernel {name!r} ({mod.einsum_str!r}) has no matrix view "
                "(no axis summed over or added to the output); pass your own role_fn for it"
            )
        axes = _stacked(declared[1], _extra(name, np.shape(mod.kernel), declared[0]))
        attn = path[:-1] in attention
        kernels[name] = (_ATTENTION.get(path[-1], "dense") if attn else "dense", axes)
        order.append((path, mod))
    if heads is None:
        named = [p for p, _ in order if p and p[-1] in HEAD_NAMES[: 2 if len(p) > 1 else None]]
        top = [
            p for p, m in order if len(p) == 1 and not isinstance(m, nnx.Conv | nnx.ConvTranspose)
        ]
        heads = tuple("/".join(map(str, p)) for p in (named or top[-1:]))
        if not heads and order and order[-1][0]:  # (a bare layer is no model)
            last = "/".join(map(str, order[-1][0]))
            warnings.warn(
                f"nnx_layers: no output layer at the model top (a Linear, LinearGeneral or "
                f"Einsum attribute, or a layer named one of {HEAD_NAMES}); the kernel defined "
                f"last, {last + '/kernel'!r}, goes to Muon as 'dense'. If it computes the "
                f"logits pass heads=({last!r},); with a tied embedding pass heads=()",
                stacklevel=2,
            )
    for h in heads:
        if h + "/kernel" not in kernels:
            layers = sorted(k.rsplit("/", 1)[0] for k in kernels)
            raise ValueError(f"heads: {h!r} is not a layer with a kernel; layers: {layers}")
        kernels[h + "/kernel"] = ("head", kernels[h + "/kernel"][1])
    return NnxLayers(kernels)
