"""Route parameters to transformations by role (built on ``optax.partition``).

Every trainable parameter has one role, given by ``role_fn(path, leaf)`` or
``role_fn(path)`` with ``path`` a tuple of keys such as ``("layers", 3, "attn", "v",
"kernel")`` (``_paths.path_keys``: the same at ``init`` and ``update`` under
``flax.nnx.Optimizer``). A rule set maps role specs to transformations::

    routed({"vo+ffn": muon(0.02), "rest": optax.adam(3e-4)}, role_fn)

A spec is a role, a group, or several joined with ``+``; ``"none"`` names no role;
``"rest"`` claims every role no other rule claims. The vocabulary (roles and groups) is
the model's: a :class:`Roles` role function carries it (``amemory.models.roles.role_of``,
``amemory.optim.nnx_role``) and specs and roles are checked against it; with a plain
function a role is any string and a rule that claims no parameter is an error. A parameter
whose role no rule claims, or a role claimed by two rules, is a ``ValueError``: nothing is
ever routed by a silent default.

Source: Wang et al. 2025 (arXiv 2509.26030) Sec. 6 component ablation (Muon on Q, K,
V, O, W_in, W_out, W_gate, the rest Adam).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import numpy as np
import optax

from amemory.optim._paths import path_keys, path_str

__all__ = [
    "REST", "Roles", "RoutingRow", "format_routing_table", "label_params", "parse_roles",
    "parse_spec", "routed", "routing_table",
]  # fmt: skip

REST = "rest"
NONE = "none"


def _arity_one(fn: Callable) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
    return len(positional) == 1 and not varargs


@dataclasses.dataclass(frozen=True)
class Roles:
    """A role function with its vocabulary; call it as ``roles(path, leaf=None) -> role``.

    Attributes:
      fn: ``fn(path)`` or ``fn(path, leaf)`` -> a role in ``roles``.
      roles: every role ``fn`` may return.
      groups: group name -> roles, usable in specs (``"none"`` is always ``()``).
    """

    fn: Callable[..., str]
    roles: tuple[str, ...]
    groups: Mapping[str, tuple[str, ...]]

    def __call__(self, path: Any, leaf: Any = None) -> str:
        return self.fn(path) if _arity_one(self.fn) else self.fn(path, leaf)


RoleFn = Callable[[tuple, Any], str] | Roles


class RoutingRow(NamedTuple):
    """One row of :func:`routing_table`."""

    path: str  # "layers/0/attn/q/kernel"
    shape: tuple[int, ...]
    role: str
    transform: str  # the rule key that claims the role
    wd: float | None = None  # its weight decay (0: not decayed), where routing_table got it


def parse_spec(spec: str, vocab: Roles | None = None) -> tuple[str, ...]:
    """Roles named by a spec: ``"vo+ffn" -> ("v", "o", "w_in", "w_gate", "w_out")``.

    Groups are ``vocab.groups``; without ``vocab`` every token is a role. ``"none"``
    names no role. ``"rest"`` is not a spec (see :func:`routed`). Raises ``ValueError`` for
    a token outside ``vocab`` (lists roles and groups).
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"a routing spec must be a non-empty string, got {spec!r}")
    groups = {NONE: (), **(vocab.groups if vocab else {})}
    roles: list[str] = []
    for token in spec.split("+"):
        token = token.strip()
        if token in groups:
            roles.extend(groups[token])
        elif vocab is None or token in vocab.roles:
            roles.append(token)
        else:
            raise ValueError(
                f"unknown role or group {token!r} in spec {spec!r}; roles: {list(vocab.roles)}; "
                f"groups: {sorted(groups)}; joined with '+', plus {REST!r}"
            )
    return tuple(dict.fromkeys(roles))


def parse_roles(spec: str, vocab: Roles, field: str = "optimizer.muon_roles") -> tuple[str, ...]:
    """Expand a config role spec like ``"vo+ffn"`` into a tuple of roles of ``vocab``.

    As :func:`parse_spec`; a config spec may also name ``"all"`` (every role of ``vocab``).
    Raises ``ValueError`` naming ``field``, the unknown name and the allowed roles and
    groups, on an unknown name or a non-string spec.
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"{field}={spec!r}: expected a role spec string like 'vo+ffn'")
    tokens = [t.strip() for t in spec.split("+")]
    known = (*vocab.roles, *vocab.groups, NONE, "all")
    bad = [t for t in tokens if t not in known]
    if bad:
        raise ValueError(
            f"{field}={spec!r}: unknown role or group {bad[0]!r}; allowed roles "
            f"{vocab.roles}, groups {(*vocab.groups, 'all')} (join with '+')"
        )
    if "all" in tokens:
        return tuple(vocab.roles)
    return parse_spec("+".join(tokens), vocab)


def _claims(rules: Mapping[str, Any], vocab: Roles | None) -> dict[str, str]:
    """role -> rule key (``rest`` not expanded); raises on double claims."""
    if not isinstance(rules, Mapping) or not rules:
        raise ValueError(f"rules must be a non-empty dict spec -> transform, got {rules!r}")
    owner: dict[str, str] = {}
    for key in rules:
        if key == REST:
            continue
        for role in parse_spec(key, vocab):
            if role in owner:
                raise ValueError(
                    f"role {role!r} is claimed by two rules, {owner[role]!r} and {key!r}; "
                    "each role may be claimed at most once"
                )
            owner[role] = key
    return owner


def _roles(params: Any, role_fn: RoleFn) -> tuple[list, list, Any, list[str]]:
    leaves_with_path, treedef = jax.tree_util.tree_flatten_with_path(params)
    vocab = role_fn if isinstance(role_fn, Roles) else None
    call = role_fn if vocab or not _arity_one(role_fn) else (lambda p, x: role_fn(p))
    roles = []
    for path, leaf in leaves_with_path:
        role = call(path_keys(path), leaf)
        if not isinstance(role, str) or (vocab is not None and role not in vocab.roles):
            allowed = list(vocab.roles) if vocab is not None else "a string"
            raise ValueError(
                f"role_fn gave role {role!r} for parameter {path_str(path)!r}; "
                f"allowed roles: {allowed}"
            )
        roles.append(role)
    paths = [p for p, _ in leaves_with_path]
    leaves = [x for _, x in leaves_with_path]
    return paths, leaves, treedef, roles


def label_params(params: Any, role_fn: RoleFn) -> Any:
    """Same-structure pytree of role strings of ``params`` (arrays or ShapeDtypeStructs)
    under ``role_fn`` (``(path keys tuple, leaf) -> role``, or a :class:`Roles`).

    Raises:
      ValueError: a role outside the vocabulary of a :class:`Roles` (names the parameter).
    """
    _, _, treedef, roles = _roles(params, role_fn)
    return treedef.unflatten(roles)


def _labels_and_paths(params, rules, role_fn):
    vocab = role_fn if isinstance(role_fn, Roles) else None
    owner = _claims(rules, vocab)
    paths, leaves, treedef, roles = _roles(params, role_fn)
    labels = [owner.get(r, REST if REST in rules else None) for r in roles]
    unclaimed: dict[str, str] = {}
    for path, role, label in zip(paths, roles, labels, strict=True):
        if label is None:
            unclaimed.setdefault(role, path_str(path))
    if unclaimed:
        detail = ", ".join(f"{r!r} (e.g. {p!r})" for r, p in unclaimed.items())
        raise ValueError(
            f"no rule claims the role(s) {detail}; rules {list(rules)} claim "
            f"{sorted(owner)}; add them to a rule or add a {REST!r} rule"
        )
    return labels, treedef, paths, leaves, roles


def _check_claimed(rules, labels, roles, role_fn, paths=()) -> None:
    """Without a vocabulary, a typo in a spec would route to "rest" silently: raise."""
    idle = [k for k in rules if k not in (REST, NONE) and k not in labels]
    if idle and not isinstance(role_fn, Roles):
        got = f" (it got e.g. {path_keys(paths[0])!r})" if paths else ""
        raise ValueError(
            f"rule(s) {idle} claim no parameter (roles present: {sorted(set(roles))}); "
            "role_fn has no vocabulary to check specs against: pass an "
            "amemory.optim.routing.Roles. role_fn(path, leaf) is called with path a tuple "
            f"of str/int keys whose entries also have .key/.name/.idx{got}"
        )


def routed(
    rules: Mapping[str, optax.GradientTransformation], role_fn: RoleFn
) -> optax.GradientTransformation:
    """One transformation per role spec, combined with ``optax.partition``.

    Args:
      rules: ``{spec: transform}``; specs as in :func:`parse_spec`, or ``"rest"``.
      role_fn: ``(path keys tuple, leaf) -> role``, or a :class:`Roles` (whose vocabulary
        checks the specs and roles); ``path`` as :func:`amemory.optim.path_keys` gives it.

    Returns a transformation with ``optax.partition``'s state. Raises ``ValueError`` for
    an unknown spec token, a role claimed twice (at construction), a parameter whose role
    no rule claims (at ``init``, before compilation), a parameter that ``role_fn`` labels
    differently at ``update`` than at ``init`` (names it), or, with a plain ``role_fn``, a
    rule that claims no parameter (at ``init``).

    Example:
      >>> import jax.numpy as jnp, optax
      >>> role = lambda path, leaf: "norm" if path[-1] == "scale" else "q"
      >>> tx = routed({"q": optax.sgd(0.1), "rest": optax.adam(1e-3)}, role)
      >>> state = tx.init({"q": jnp.zeros((2, 2)), "scale": jnp.ones(2)})
    """
    _claims(rules, role_fn if isinstance(role_fn, Roles) else None)  # validate early
    transforms = dict(rules)
    first_labels: dict[tuple, tuple[str, ...]] = {}  # (paths, shapes) -> labels of the 1st call

    def param_labels(params):
        labels, treedef, paths, _, roles = _labels_and_paths(params, rules, role_fn)
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
        _check_claimed(rules, labels, roles, role_fn, paths)
        return treedef.unflatten(labels)

    return optax.partition(transforms, param_labels)


def routing_table(
    params: Any, rules: Mapping[str, Any], role_fn: RoleFn, weight_decay: Any = None
) -> list[RoutingRow]:
    """The resolved routing, one :class:`RoutingRow` per parameter leaf, for logs.

    ``weight_decay``: a same-structure tree of each leaf's decay coefficient (0 where the
    decay mask leaves it out), shown as the rows' ``wd``; None leaves ``wd`` None. Raises
    ``ValueError`` as :func:`routed`.
    """
    labels, treedef, paths, leaves, roles = _labels_and_paths(params, rules, role_fn)
    _check_claimed(rules, labels, roles, role_fn)
    wds = [None] * len(leaves) if weight_decay is None else treedef.flatten_up_to(weight_decay)
    return [
        RoutingRow(path_str(p), tuple(int(d) for d in np.shape(x)), r, lab, wd)
        for p, x, r, lab, wd in zip(paths, leaves, roles, labels, wds, strict=True)
    ]


def format_routing_table(rows: list[RoutingRow]) -> str:
    """Plain-text table of :func:`routing_table` rows (one line per parameter), with a
    ``wd`` column where the rows carry weight decay."""
    width = max([len(r.path) for r in rows] + [4])
    wd = any(r.wd is not None for r in rows)
    lines = [f"{'path':<{width}}  {'shape':<16} {'role':<7} {'transform':<10}" + " wd" * wd]
    for r in rows:
        cell = f" {r.wd:g}" if wd and r.wd is not None else ""
        lines.append(f"{r.path:<{width}}  {str(r.shape):<16} {r.role:<7} {r.transform!s:<10}{cell}")
    return "\n".join(line.rstrip() for line in lines)
