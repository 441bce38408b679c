"""Route parameters to transformations by role (built on ``optax.partition``).

Every trainable parameter has one role from :data:`ROLES`; a ``role_fn(path,
leaf) -> role`` supplies it (a one-argument ``role_fn(path)`` such as
``amemory.models.transformer.role_of`` is accepted too; ``path`` is a tuple of
``str``/``int`` keys such as ``("layers", 3, "attn", "v", "kernel")``, normalised by
``amemory.optim._paths.path_keys``: the trailing ``value`` key of an ``nnx.Variable`` is
dropped, so ``flax.nnx.Optimizer`` gives the same path at ``init`` and ``update``).
A rule set maps role specs to transformations::

    routed({"vo+ffn": muon(0.02), "rest": optax.adam(3e-4)}, role_fn)

A spec is a role, a group from :data:`GROUPS`, or several joined with ``+``;
``"rest"`` claims every role no other rule claims. A parameter whose role no
rule claims, or a role claimed by two rules, is a ``ValueError`` listing the
roles: nothing is ever routed by a silent default.

Source: Wang et al. 2025 (arXiv 2509.26030) Sec. 6 component ablation (Muon on Q, K,
V, O, W_in, W_out, W_gate, the rest Adam), whose roles this vocabulary names.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import numpy as np
import optax

from amemory.optim._paths import path_keys, path_str

__all__ = [
    "GROUPS",
    "REST",
    "ROLES",
    "RoutingRow",
    "format_routing_table",
    "label_params",
    "parse_roles",
    "parse_spec",
    "routed",
    "routing_table",
]

# The role vocabulary, defined here once (amemory.models.roles classifies paths into it).
# Adding a role is one line; adding a group is one entry of GROUPS.
ROLES: tuple[str, ...] = (
    "q",  # attention query kernel
    "k",  # attention key kernel
    "v",  # attention value kernel
    "o",  # attention output kernel
    "w_in",  # FFN input (up) kernel
    "w_gate",  # FFN gate kernel (gated FFNs)
    "w_out",  # FFN output (down) kernel
    "dense",  # a Linear kernel whose place the path does not tell (foreign models)
    "embed",  # token / position embedding table
    "head",  # untied output (LM head) kernel
    "norm",  # scale (and bias) of a normalisation layer
    "bias",  # bias of a Linear layer
    # multi-head latent attention (DeepSeek-V2, arXiv 2405.04434)
    "q_down",
    "q_up",
    "q_rope",
    "kv_down",
    "k_up",
    "v_up",
    "k_rope",
    # mixture of experts: router, routed experts (stacked [E, ...]), shared experts
    "router",
    "expert_w_in",
    "expert_w_gate",
    "expert_w_out",
    "shared_w_in",
    "shared_w_gate",
    "shared_w_out",
)
_QK = ("q", "k", "q_down", "q_up", "q_rope", "kv_down", "k_up", "k_rope")
_VO = ("v", "o", "v_up")
_FFN = ("w_in", "w_gate", "w_out", "expert_w_in", "expert_w_gate", "expert_w_out",
        "shared_w_in", "shared_w_gate", "shared_w_out")  # fmt: skip
# qk: query/key paths (MLA's kv_down feeds keys and values; it is counted with qk);
# vo: value/output; ffn: dense, routed-expert and shared-expert FFN matrices; hidden:
# all of them. The MoE router is in no group: it goes to the "rest" rule (Adam).
GROUPS: dict[str, tuple[str, ...]] = {
    "qk": _QK,
    "vo": _VO,
    "ffn": _FFN,
    "hidden": _QK + _VO + _FFN + ("dense",),
    "none": (),
}
REST = "rest"

RoleFn = Callable[[tuple, Any], str]


class RoutingRow(NamedTuple):
    """One row of :func:`routing_table`."""

    path: str  # "layers/0/attn/q/kernel"
    shape: tuple[int, ...]
    role: str
    transform: str  # the rule key that claims the role


def parse_spec(spec: str) -> tuple[str, ...]:
    """Roles named by a spec: ``"vo+ffn" -> ("v", "o", "w_in", "w_gate", "w_out")``.

    ``"none"`` names no role. ``"rest"`` is not a spec (see :func:`routed`).

    Raises:
      ValueError: an unknown token (lists roles and groups).
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"a routing spec must be a non-empty string, got {spec!r}")
    roles: list[str] = []
    for token in spec.split("+"):
        token = token.strip()
        if token in GROUPS:
            roles.extend(GROUPS[token])
        elif token in ROLES:
            roles.append(token)
        else:
            raise ValueError(
                f"unknown role or group {token!r} in spec {spec!r}; roles: {list(ROLES)}; "
                f"groups: {sorted(GROUPS)}; joined with '+', plus {REST!r}"
            )
    return tuple(dict.fromkeys(roles))


def parse_roles(spec: str, field: str = "optimizer.muon_roles") -> tuple[str, ...]:
    """Expand a role spec like ``"vo+ffn"`` or ``"q+w_out"`` into a tuple of roles.

    The roles and groups of :func:`parse_spec`; a config spec may also name ``"all"``
    (every role in :data:`ROLES`).

    Raises:
      ValueError: naming ``field``, the unknown name and the allowed roles and groups,
        on an unknown name or a non-string spec.
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"{field}={spec!r}: expected a role spec string like 'vo+ffn'")
    tokens = [t.strip() for t in spec.split("+")]
    rest = [t for t in tokens if t != "all"]
    other = "+".join(rest)
    try:
        roles = parse_spec(other) if rest else ()
    except ValueError:
        known = (*ROLES, *GROUPS)
        bad = next((t for t in other.split("+") if t.strip() not in known), other)
        raise ValueError(
            f"{field}={spec!r}: unknown role or group {bad.strip()!r}; allowed roles "
            f"{ROLES}, groups {(*GROUPS, 'all')} (join with '+')"
        ) from None
    return tuple(ROLES) if "all" in tokens else roles


def _claims(rules: Mapping[str, Any]) -> dict[str, str]:
    """role -> rule key, with ``rest`` expanded; raises on double claims."""
    if not isinstance(rules, Mapping) or not rules:
        raise ValueError(f"rules must be a non-empty dict spec -> transform, got {rules!r}")
    owner: dict[str, str] = {}
    for key in rules:
        if key == REST:
            continue
        for role in parse_spec(key):
            if role in owner:
                raise ValueError(
                    f"role {role!r} is claimed by two rules, {owner[role]!r} and {key!r}; "
                    f"each of the roles {list(ROLES)} may be claimed at most once"
                )
            owner[role] = key
    if REST in rules:
        for role in ROLES:
            owner.setdefault(role, REST)
    return owner


def _arity_one(fn: Callable) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
    return len(positional) == 1 and not varargs


def _roles(params: Any, role_fn: RoleFn) -> tuple[list, list, Any, list[str]]:
    leaves_with_path, treedef = jax.tree_util.tree_flatten_with_path(params)
    one = _arity_one(role_fn)
    roles = []
    for path, leaf in leaves_with_path:
        role = role_fn(path_keys(path)) if one else role_fn(path_keys(path), leaf)
        if role not in ROLES:
            raise ValueError(
                f"role_fn gave role {role!r} for parameter {path_str(path)!r}; "
                f"allowed roles: {list(ROLES)}"
            )
        roles.append(role)
    paths = [p for p, _ in leaves_with_path]
    leaves = [x for _, x in leaves_with_path]
    return paths, leaves, treedef, roles


def label_params(params: Any, role_fn: RoleFn) -> Any:
    """Same-structure pytree of role strings.

    Args:
      params: parameter pytree (arrays or ``jax.ShapeDtypeStruct``).
      role_fn: ``(path keys tuple, leaf) -> role`` in :data:`ROLES`.

    Raises:
      ValueError: a role outside :data:`ROLES` (names the parameter).
    """
    _, _, treedef, roles = _roles(params, role_fn)
    return treedef.unflatten(roles)


def _labels(params: Any, rules: Mapping[str, Any], role_fn: RoleFn) -> tuple[list, Any]:
    labels, treedef, _ = _labels_and_paths(params, rules, role_fn)
    return labels, treedef


def _labels_and_paths(params, rules, role_fn):
    owner = _claims(rules)
    paths, leaves, treedef, roles = _roles(params, role_fn)
    unclaimed: dict[str, str] = {}
    for path, role in zip(paths, roles, strict=True):
        if role not in owner:
            unclaimed.setdefault(role, path_str(path))
    if unclaimed:
        detail = ", ".join(f"{r!r} (e.g. {p!r})" for r, p in unclaimed.items())
        raise ValueError(
            f"no rule claims the role(s) {detail}; rules {list(rules)} claim "
            f"{sorted(owner)}; add them to a rule or add a {REST!r} rule"
        )
    return [owner[r] for r in roles], treedef, paths


def routed(
    rules: Mapping[str, optax.GradientTransformation], role_fn: RoleFn
) -> optax.GradientTransformation:
    """One transformation per role spec, combined with ``optax.partition``.

    Args:
      rules: ``{spec: transform}``; specs as in :func:`parse_spec`, or ``"rest"``.
      role_fn: ``(path keys tuple, leaf) -> role``.

    Returns:
      ``optax.GradientTransformation`` whose state is ``optax.partition``'s.

    Raises:
      ValueError: unknown spec token, a role claimed twice (at construction), a
        parameter whose role no rule claims (at ``init``, before compilation), or a
        parameter that ``role_fn`` labels differently at ``update`` than at ``init``
        (names it; ``role_fn`` sees the same normalised path at both, nnx ``value``
        keys removed, so only a ``role_fn`` that depends on more than the path can).

    Example:
      >>> import jax.numpy as jnp, optax
      >>> role = lambda path, leaf: "norm" if path[-1] == "scale" else "q"
      >>> tx = routed({"qk": optax.sgd(0.1), "rest": optax.adam(1e-3)}, role)
      >>> state = tx.init({"q": jnp.zeros((2, 2)), "scale": jnp.ones(2)})
    """
    _claims(rules)  # validate early
    transforms = dict(rules)
    first_labels: dict[tuple, tuple[str, ...]] = {}  # (paths, shapes) -> labels of the 1st call

    def param_labels(params):
        labels, treedef, paths = _labels_and_paths(params, rules, role_fn)
        names = tuple(path_str(p) for p in paths)
        key = (names, tuple(tuple(np.shape(x)) for x in treedef.flatten_up_to(params)))
        seen = first_labels.setdefault(key, tuple(labels))
        for name, before, now in zip(names, seen, labels, strict=True):
            if before != now:
                raise ValueError(
                    f"role_fn labels parameter {name!r} {now!r} now but {before!r} at init "
                    "(optax.partition would mix the two transforms' states); make role_fn a "
                    "function of the path alone (amemory.optim normalises nnx paths)"
                )
        return treedef.unflatten(labels)

    return optax.partition(transforms, param_labels)


def routing_table(params: Any, rules: Mapping[str, Any], role_fn: RoleFn) -> list[RoutingRow]:
    """The resolved routing, one :class:`RoutingRow` per parameter leaf, for logs.

    Raises:
      ValueError: as :func:`routed`.
    """
    labels, _ = _labels(params, rules, role_fn)
    paths, leaves, _, roles = _roles(params, role_fn)
    return [
        RoutingRow(path_str(p), tuple(int(d) for d in np.shape(x)), r, lab)
        for p, x, r, lab in zip(paths, leaves, roles, labels, strict=True)
    ]


def format_routing_table(rows: list[RoutingRow]) -> str:
    """Plain-text table of :func:`routing_table` rows (one line per parameter)."""
    width = max([len(r.path) for r in rows] + [4])
    lines = [f"{'path':<{width}}  {'shape':<16} {'role':<7} transform"]
    for r in rows:
        lines.append(f"{r.path:<{width}}  {str(r.shape):<16} {r.role:<7} {r.transform}")
    return "\n".join(lines)
