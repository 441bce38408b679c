"""``amemory coordcheck``: do activations and updates keep their size as the model widens?

A coordinate check (Yang et al., Tensor Programs V, arXiv 2203.03466, App. D): for each
optimizer variant and width d, ``amemory train``'s step trains the config's LM a few
steps (one seed, constant rate; head dimension and d_ff / d kept) and records on one
fixed batch, per step t (t = 0: the initialisation): ``activation``, the RMS of every
module's output (``"logits"``: the model's); ``change``, the RMS of its change
``h_t - h_{t-1}``; ``update``, of each matrix ``[..., fan_in, fan_out]`` the RMS->RMS norm
``sqrt(fan_in / fan_out) sigma_max(W_t - W_{t-1})`` (of a vector: the RMS of its update).
Features learn at every width when ``||dW||_* = Theta(sqrt(fan_out / fan_in))`` (Yang,
Simon & Bernstein, arXiv 2310.17813, Condition 1): slopes of log(value) against
log(width) near 0. Muon with ``shape_scale="spectral"`` meets it by construction; Adam's
per-coordinate step is a low-rank update whose norm grows like fan_in (slope near 1).
"""

from __future__ import annotations

import copy
import functools
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from amemory import atomic, optim
from amemory.cli import Parser
from amemory.models.roles import matrix_axes
from amemory.train import config as config_lib
from amemory.train import engine, parallel, tasks
from amemory.train.state import TrainState

#: Variants ``NAME[:FIELD=VALUE,...]``: ``optimizer.name=NAME`` and ``optimizer.FIELD=VALUE``
#: (names and values are the config's: validated by ``amemory.train.config.validate``).
VARIANTS = ("adam", "muon:shape_scale=spectral", "signgd")
QUANTITIES = ("activation", "change", "update")


def overrides(spec: str) -> list[str]:
    """``"NAME[:FIELD=VALUE,...]"`` -> ``["optimizer.name=NAME", "optimizer.FIELD=VALUE", ...]``."""
    name, _, fields = spec.partition(":")
    return [f"optimizer.name={name}"] + [f"optimizer.{f}" for f in fields.split(",") if f]


def variant_config(config: Any, spec: str, width: int, steps: int) -> Any:
    """A copy of the LM run ``config`` at ``width`` for the variant ``spec``, validated.

    Raises:
      ValueError: a task other than "lm", a width that is not a positive multiple of the
        head dimension, or a field / value the config rejects (names it).
    """
    if config.task != "lm":
        raise ValueError(f"coordcheck needs config.task='lm', got {config.task!r}")
    c = config_lib.with_engine_defaults(copy.deepcopy(config))
    model = tasks.model_config(c, 2)  # the preset with the config's overrides
    head = model.head_dim
    if width <= 0 or width % head:
        raise ValueError(f"coordcheck widths must be positive multiples of {head}, got {width}")
    config_lib.apply_overrides(c, overrides(spec))
    c.model.update(d_model=width, n_heads=width // head, scan_layers=False,
                   d_ff=round(model.d_ff * width / model.d_model))  # fmt: skip
    c.schedule.update(name="constant", warmup_steps=0)
    c.update(steps=int(steps), seeds=(), progress=False)
    c.optimizer.diagnostics = False
    config_lib.validate(c)
    return c


def _rms(x: jax.Array) -> jax.Array:
    return jnp.sqrt(jnp.mean(jnp.square(x.astype(jnp.float32))))


def op_norm(x: jax.Array, iters: int = 30) -> jax.Array:
    """RMS->RMS norm ``sqrt(fan_in / fan_out) sigma_max`` of ``x [..., fan_in, fan_out]``
    (largest over the leading axes), sigma_max by ``iters`` power iterations on x^T x."""
    x = x.astype(jnp.float32)
    v = jax.random.normal(jax.random.key(0), x.shape[:-2] + x.shape[-1:])

    def power(_, v):
        v = jnp.einsum("...io,...i->...o", x, jnp.einsum("...io,...o->...i", x, v))
        return v / (jnp.linalg.norm(v, axis=-1, keepdims=True) + 1e-30)

    v = jax.lax.fori_loop(0, iters, power, v)
    sigma = jnp.linalg.norm(jnp.einsum("...io,...o->...i", x, v), axis=-1)
    return jnp.sqrt(x.shape[-2] / x.shape[-1]) * jnp.max(sigma)


@functools.partial(jax.jit, static_argnums=0)
def _outputs(graphdef: Any, params: Any, tokens: jax.Array) -> dict[str, jax.Array]:
    """Module path -> its output ``[B, T, ...]`` (``"logits"``: the model's)."""
    model = nnx.merge(graphdef, params)
    logits, seen = nnx.capture(model, nnx.Intermediate, method_outputs=nnx.Intermediate)(tokens)
    out = {"logits": logits}
    for path, v in jax.tree_util.tree_flatten_with_path(seen)[0]:
        keys = [str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)]
        if v.shape[:2] == tokens.shape and keys != ["__call__"]:  # a block's x, not its aux
            out.setdefault("/".join(k for k in keys if k != "__call__"), v)
    return out


@jax.jit
def _sizes(new: dict, old: dict, params: Any, prev: Any) -> dict[str, dict[str, jax.Array]]:
    moved = jax.tree_util.tree_flatten_with_path(jax.tree.map(jnp.subtract, params, prev))[0]
    return {
        "activation": {k: _rms(v) for k, v in new.items()},
        "change": {k: _rms(v - old[k]) for k, v in new.items()},
        "update": {optim.path_str(p): op_norm(d) if matrix_axes(p) else _rms(d) for p, d in moved},
    }


def measure(config: Any) -> dict[str, dict[str, np.ndarray]]:
    """quantity -> name -> ``[config.steps + 1]`` values of one run of a validated
    :func:`variant_config` (step 0: the initialisation, where changes are 0), trained by
    ``amemory train``'s step (:func:`amemory.train.engine.make_train_step`)."""
    built = engine.build(config, parallel.placement(config.parallel))
    task, batches = built.task, built.task.train_input()
    k_init, k_rng = jax.random.split(jax.random.PRNGKey(int(config.seed)))  # as Engine
    params = task.init_params(k_init)
    state = TrainState(jnp.zeros((), jnp.int32), params, built.opt.tx.init(params), k_rng)
    step = jax.jit(engine.make_train_step(task.loss, built.opt, task.roles(params)))
    first = next(batches)
    tokens = jnp.asarray((first["tokens"] if isinstance(first, dict) else first)[:, :-1])
    batch, rows = jax.tree.map(jnp.asarray, first), []
    prev, old = state.params, None
    for t in range(config.steps + 1):
        new = _outputs(task.graphdef, state.params, tokens)
        rows.append(_sizes(new, new if old is None else old, state.params, prev))
        if t < config.steps:
            prev, old = state.params, new
            state, _ = step(state, batch)
            batch = jax.tree.map(jnp.asarray, next(batches))
    rows = jax.device_get(rows)
    return {q: {k: np.array([r[q][k] for r in rows]) for k in rows[0][q]} for q in QUANTITIES}


def slope(widths: Sequence[int], values: Any) -> float:
    """Least-squares slope of log(values) against log(widths); NaN if a value is not > 0."""
    v = np.asarray(values, float)
    return float(np.polyfit(np.log(widths), np.log(v), 1)[0]) if (v > 0).all() else np.nan


def coordcheck(config: Any, widths: Sequence[int], variants: Sequence[str] = VARIANTS,
               steps: int = 3) -> dict[str, Any]:  # fmt: skip
    """Coordinate check of the LM run ``config`` (module docstring); every variant and width
    is validated before anything compiles.

    Returns:
      ``{"widths", "steps", "values": {variant: {quantity: {name: [widths, steps + 1]}}},
      "slopes": {variant: {quantity: {name: slope at the last step}}}}``.

    Raises:
      ValueError: fewer than 2 widths, ``steps < 1``, or a bad variant (see
        :func:`variant_config`).
    """
    if len(widths) < 2:
        raise ValueError(f"--widths: coordcheck needs >= 2 widths, got {list(widths)}")
    if steps < 1:
        raise ValueError(f"--steps: must be >= 1, got {steps}")
    runs = {s: [variant_config(config, s, int(w), steps) for w in widths] for s in variants}
    out: dict[str, Any] = {"widths": list(widths), "steps": steps, "values": {}, "slopes": {}}
    for spec, cfgs in runs.items():
        m = [measure(c) for c in cfgs]
        out["values"][spec] = {q: {k: np.stack([x[q][k] for x in m]) for k in m[0][q]}
                               for q in QUANTITIES}  # fmt: skip
        out["slopes"][spec] = {q: {k: slope(widths, v[:, -1]) for k, v in vals.items()}
                               for q, vals in out["values"][spec].items()}  # fmt: skip
    return out


def figure(result: dict[str, Any], path: str | pathlib.Path) -> pathlib.Path:
    """Log-log panels (rows: variants; columns: quantities) of each module's value at the
    last step against width; the logits drawn thick and black."""
    from amemory.analysis import plots

    rows = result["values"]
    fig, axes = plots.plt.subplots(len(rows), 3, figsize=(11, 2.8 * len(rows)), squeeze=False)
    for ax_row, (spec, values) in zip(axes, rows.items(), strict=True):
        for ax, (q, curves) in zip(ax_row, values.items(), strict=True):
            for name, v in curves.items():
                logit = name == "logits"
                ax.plot(result["widths"], v[:, -1], "k" if logit else "-", lw=2.5 if logit else 0.7)
            med = np.nanmedian(list(result["slopes"][spec][q].values()))
            ax.set(xscale="log", yscale="log", xlabel="width d")
            ax.set_xticks(result["widths"], [str(w) for w in result["widths"]], minor=False)
            ax.minorticks_off()
            ax.set_title(f"{spec}\n{q} (median slope {med:.2f})", fontsize=9)
    return plots.save(fig, path, dpi=75)


def main(argv: list[str]) -> int:
    """``amemory coordcheck``: parse ``argv``, run :func:`coordcheck`, write
    ``coordcheck.json`` and ``coordcheck.png`` into ``--out``, print median slopes."""
    from amemory.train.cli import _split_overrides

    about = "Activation and update sizes against width, per optimizer variant."
    parser = Parser(prog="amemory coordcheck", description=about)
    parser.add_argument("--config", default="experiments/configs/lm.py", help="PATH[:ARG]")
    parser.add_argument("--widths", default="64,128,256,512", help="comma-separated d_model")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps recorded")
    parser.add_argument("--variant", action="append", help="NAME[:FIELD=VALUE,...] (repeatable)")
    parser.add_argument("--out", default="coordcheck", help="output directory")
    args, rest = parser.parse_known_args(argv)
    try:
        config = config_lib.load_config(args.config, _split_overrides(rest))
        if not args.widths.replace(",", "").isdigit():
            raise ValueError(f"--widths={args.widths!r}: expected integers joined by commas")
        widths = [int(w) for w in args.widths.split(",")]
        result = coordcheck(config, widths, args.variant or VARIANTS, args.steps)
    except ValueError as e:
        return parser.fail(e)
    out = pathlib.Path(args.out)
    from amemory.train.records import jsonable

    atomic.write_json(out / "coordcheck.json", jsonable(result))
    figure(result, out / "coordcheck.png")
    for spec, by_q in result["slopes"].items():
        print(spec, *(f"{q} {np.nanmedian(list(s.values())):+.2f}" for q, s in by_q.items()))
    return 0
