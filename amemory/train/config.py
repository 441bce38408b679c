"""Run configs: load a config file, apply ``--config.a.b=value`` overrides, validate.

A config file is a Python file with ``get_config(scale="quick") -> ConfigDict``
(``experiments/configs/lm.py``, ``memory.py``). ``path:arg`` passes ``arg`` to
``get_config``, as ``ml_collections.config_flags`` does. Overrides are parsed
here (no absl flags) so that ``amemory train`` keeps one argparse parser.

:func:`validate` runs once, at the start of ``amemory.train.loop.run`` (and of ``amemory
plan`` and ``--print-config``), before any JAX compilation; it raises a ``ValueError``
naming the dotted field and the allowed values. It checks run-level fields itself and
the fields a component owns by building that component (``MuonOptions``,
``TransformerConfig``, the schedule), re-raising its error with the dotted name.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import io
import json
import math
import pathlib
import re
import tokenize
import traceback
from collections.abc import Sequence
from typing import Any

from ml_collections import ConfigDict

# Options of the training engine itself, added to a run config that lacks them
# (`with_engine_defaults`), so they are named once, here, and still overridable and printed
# (--print-config): dotted name -> (default, comment). A field is added only where its
# parent group exists (the memory task has no `model` or `data` group).
ENGINE_DEFAULTS: dict[str, tuple[Any, str]] = {
    "model.scan_layers": (False, "stack the blocks [L, ...], run them in one lax.scan"),
    "model.remat_policy": ("nothing_saveable", "with model.remat: jax.checkpoint_policies name"),
    "optimizer.ns_dtype": ("auto", "Newton-Schulz: auto (bf16 GPU/TPU, fp32 CPU) | float32 | bf16"),
    "profile_steps": ((), "(first, last): jax.profiler trace of these steps into the workdir"),
    "gradient_accumulation_steps": (1, "k: the batch runs as k microbatches, then one update"),
    "data.eval_batch_size": (0, "validation rows per batch; 0: data.batch_size, clipped to split"),
    "optimizer.adam_weight_decay": (0.0, "decoupled weight decay of the Adam half's matrices"),
    "optimizer.decay_embeddings": (False, "decay embedding tables too (else matrices only)"),
    "optimizer.weight_decay_scaling": ("lr", "lr: lr (u + wd theta) | independent: s(t) wd r"),
    "optimizer.parametrization": ("sp", "sp | mup: Adam's matrix rates x r, head init x sqrt(r)"),
    "optimizer.base_width": (0, "width rates were tuned at: r = base_width / d_model; 0: r = 1"),
}  # fmt: skip

# Enumerated fields: dotted name -> allowed values (checked when the field exists). The
# fields of registries (optimizer, schedule, task, memory) are derived by optimizer_choices().
CHOICES: dict[str, tuple] = {
    "scale": ("quick", "full"),
    "parallel.mode": ("single", "pmap", "sharded"),
    "parallel.cpu_collectives": ("gloo", "mpi"),
    "data.kind": ("corpus", "biographies"),
    "data.tokenizer": ("bpe", "word"),
}

# Fields that accept None ("keep the preset's value" / "auto-detect").
NULLABLE = frozenset(
    "model.d_model model.n_layers model.n_heads model.n_kv_heads model.d_ff model.ffn "
    "model.norm model.position model.qk_norm model.tied_head model.mla.kv_rank "
    "model.mla.rope_dim model.moe.d_expert optimizer.preset optimizer.lr memory.d "
    "parallel.coordinator_address parallel.num_processes parallel.process_id".split()
)

# Integer fields with their minimum value.
MINIMUMS: dict[str, int] = {
    **dict.fromkeys(
        "steps log_every eval_every keep_checkpoints data.seq_len data.batch_size data.n_buckets "
        "data.eval_batches gradient_accumulation_steps divergence.patience".split(),
        1,
    ),
    **dict.fromkeys(
        "spectrum_every checkpoint_every data.eval_batch_size optimizer.base_width "
        "schedule.warmup_steps batch_size".split(),
        0,
    ),
    "data.vocab_size": 2,
    "memory.K": 2,
}


def optimizer_choices() -> dict[str, tuple]:
    """Allowed values of ``task``, ``optimizer.name``, ``optimizer.preset``,
    ``memory.embeddings`` and ``prior.kind``, read from their registries
    (``amemory.train.tasks.TASKS``, ``amemory.train.optimizers.names()``,
    ``amemory.optim.PRESETS``, ``amemory.train.memory_task``; imported lazily: jax)."""
    from amemory import optim
    from amemory.train import memory_task
    from amemory.train.optimizers import DECAY_SCALINGS, PARAMETRIZATIONS, names
    from amemory.train.tasks import TASKS

    return {
        "task": TASKS, "optimizer.name": names(), "optimizer.preset": (None, *optim.PRESETS),
        "memory.embeddings": memory_task.EMBEDDINGS, "prior.kind": memory_task.PRIORS,
        "optimizer.parametrization": PARAMETRIZATIONS,
        "optimizer.weight_decay_scaling": DECAY_SCALINGS,
    }  # fmt: skip


def load_config(path: str, overrides: Sequence[str] = ()) -> ConfigDict:
    """Load ``path[:arg]`` (a file defining ``get_config``) and apply overrides.

    Args:
      path: config file path, optionally ``path:arg`` (``arg`` passed to ``get_config``).
      overrides: strings ``"a.b=value"`` (the ``--config.`` prefix already removed).

    Returns:
      the locked ``ConfigDict``, not yet validated (:func:`validate`, at ``run()``).

    Raises:
      ValueError: file not found, no ``get_config``, unknown field, unparsable value, or
        an override of an option ``optimizer.preset`` sets.
    """
    file, _, arg = path.partition(":")
    p = pathlib.Path(file)
    if not p.is_file():
        raise ValueError(f"--config: file {file!r} not found")
    loader = importlib.machinery.SourceFileLoader(f"_amemory_config_{p.stem}", file)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    try:  # a Python error in the config file is a bad config: one line naming file and line
        loader.exec_module(module)
        if not hasattr(module, "get_config"):
            raise ValueError(f"--config: {file!r} defines no get_config()")
        config = module.get_config(arg) if arg else module.get_config()
    except Exception as e:  # noqa: BLE001 - the user's code: any error
        if str(e).startswith("--config:"):
            raise
        where = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == file]
        line = getattr(e, "lineno", None) if isinstance(e, SyntaxError) else (where or [None])[-1]
        first = (str(e).splitlines() or [""])[0]
        where = f" line {line}" if line else ""
        raise ValueError(f"--config: {file}{where}: {type(e).__name__}: {first}") from None
    if not isinstance(config, ConfigDict):
        raise ValueError(f"--config: {file}: get_config() returned {type(config).__name__}, "
                         "not an ml_collections ConfigDict")  # fmt: skip
    with_engine_defaults(config)
    apply_overrides(config, overrides)
    check_preset_overrides(config, overrides)
    config.lock()
    return config


def with_engine_defaults(config: ConfigDict) -> ConfigDict:
    """Add every :data:`ENGINE_DEFAULTS` field the config lacks (in place; returns it).

    A field is added only where its parent group exists; existing values are kept.
    """
    for dotted, (default, _) in ENGINE_DEFAULTS.items():
        *parents, name = dotted.split(".")
        present, node = _get(config, ".".join(parents)) if parents else (True, config)
        if present and isinstance(node, ConfigDict) and name not in node:
            with node.unlocked():
                node[name] = default
    return config


def _parse_value(field: str, text: str, current: Any, typ: type | None) -> Any:
    typ = typ or (type(current) if current is not None else None)
    try:
        if typ is bool:
            low = text.strip().lower()
            if low in ("true", "1", "yes"):
                return True
            if low in ("false", "0", "no"):
                return False
            raise ValueError
        if text.strip().lower() == "none" and (current is None or field in NULLABLE):
            return None
        if typ is int:
            return int(text)
        if typ is float:
            return float(text)
        if typ in (tuple, list):
            t = text.strip()
            if t in ("", "()", "[]"):
                return ()
            v = ast.literal_eval(t if t[0] in "([" else f"({t},)")
            return tuple(v) if isinstance(v, (list, tuple)) else (v,)
        if typ is str or typ is None:
            return text
    except (ValueError, SyntaxError) as e:
        raise ValueError(
            f"--config.{field}={text!r}: cannot parse as {typ.__name__} (current value {current!r})"
        ) from e
    raise ValueError(f"--config.{field}: cannot override a field of type {typ}")


def apply_overrides(config: ConfigDict, overrides: Sequence[str]) -> ConfigDict:
    """Apply ``["a.b=value", ...]`` to ``config`` in place (types follow the existing field).

    Raises:
      ValueError: unknown field (listing the fields of its parent) or unparsable value.
    """
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r}: expected --config.field=value")
        key, text = item.split("=", 1)
        parts = key.split(".")
        node = config
        for i, name in enumerate(parts):
            if not isinstance(node, ConfigDict) or name not in node:
                parent = ".".join(parts[:i]) or "<root>"
                fields = sorted(node.keys()) if isinstance(node, ConfigDict) else []
                raise ValueError(
                    f"--config.{key}: unknown field {name!r} in {parent}; fields: {fields}"
                )
            if i < len(parts) - 1:
                node = node[name]
        name = parts[-1]
        current = node[name]
        if isinstance(current, ConfigDict):
            raise ValueError(f"--config.{key}: is a group; set one of {sorted(current.keys())}")
        typ = node.get_type(name)
        value = _parse_value(key, text, current, typ)
        with node.unlocked():
            node[name] = value
    return config


def _get(config: ConfigDict, dotted: str) -> tuple[bool, Any]:
    node = config
    for name in dotted.split("."):
        if not isinstance(node, ConfigDict) or name not in node:
            return False, None
        node = node[name]
    return True, node


# Real-valued fields: dotted name -> (low, high, low included, high included); a value must
# be a finite number in that interval (checked when the field exists and is not None).
_INF = float("inf")
_F32_MAX = 3.4028234663852886e38
_F32_TINY = 1.1754943508222875e-38  # the smallest normal float32
INTERVALS: dict[str, tuple[float, float, bool, bool]] = {
    "optimizer.lr": (0.0, _INF, False, False),
    "optimizer.adam_lr": (0.0, _INF, False, False),
    "optimizer.b1": (0.0, 1.0, True, False),
    "optimizer.b2": (0.0, 1.0, True, False),
    "optimizer.signum_beta": (0.0, 1.0, True, False),
    "optimizer.eps": (0.0, _INF, False, False),  # 0: 0/0 = NaN on a zero gradient entry
    "optimizer.weight_decay": (0.0, _INF, True, False),
    "optimizer.adam_weight_decay": (0.0, _INF, True, False),
    "optimizer.grad_clip": (0.0, _INF, True, False),
    "optimizer.qk_clip": (0.0, _INF, True, False),
    "schedule.final_fraction": (0.0, 1.0, True, True),
    "schedule.decay_fraction": (0.0, 1.0, True, True),
    "memory.coherence": (0.0, 1.0, True, False),
    "model.moe.lb_coef": (0.0, _INF, True, False),
    "divergence.loss_factor": (1.0, _INF, False, False),
}


def _interval(lo: float, hi: float, lo_in: bool, hi_in: bool) -> str:
    if hi == _INF:
        return f"{'>=' if lo_in else '>'} {lo:g}"
    return f"in {'[' if lo_in else '('}{lo:g}, {hi:g}{']' if hi_in else ')'}"


def validate_numbers(config: ConfigDict) -> None:
    """Check the real-valued fields of ``INTERVALS`` and ``schedule.warmup_steps <= steps``.

    Catches what would otherwise compile and train silently or blow up later:
    ``lr=inf`` or ``nan``, ``lr=0`` or ``1e-46`` (0 in float32, the precision the optimizer
    computes in: nothing trains), ``b1=1.5`` (Adam's moment estimates diverge), a warmup
    longer than the run (the peak rate is never reached).

    Raises:
      ValueError: naming the field, its value and the allowed interval.
    """
    for field, (lo, hi, lo_in, hi_in) in INTERVALS.items():
        present, value = _get(config, field)
        if not present or value is None:
            continue
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok:
            v = float(value)
            # finite in float32, the precision the optimizer computes in (1e39 would be inf)
            ok = math.isfinite(v) and abs(v) <= _F32_MAX and (v >= lo if lo_in else v > lo)
            ok = ok and (v <= hi if hi_in else v < hi)
        if not ok:
            raise ValueError(
                f"config.{field}={value!r}; must be a finite float32 number "
                f"{_interval(lo, hi, lo_in, hi_in)}"
            )
        if lo == 0 and not lo_in and 0 < value < _F32_TINY:
            raise ValueError(
                f"config.{field}={value!r} is 0 or subnormal in float32, the precision the "
                f"optimizer computes in; must be >= {_F32_TINY:.4g}"
            )
    present, warmup = _get(config, "schedule.warmup_steps")
    if present and isinstance(warmup, int) and warmup > int(config.steps):
        raise ValueError(
            f"config.schedule.warmup_steps={warmup} exceeds config.steps={config.steps}; the "
            "learning rate would never reach its peak (use warmup_steps <= steps)"
        )


def validate(config: ConfigDict) -> None:
    """Check a run config once, before compiling: enumerated fields, integer ranges,
    intervals, role specs, and the fields a component owns, by building it
    (``optimizer.*`` of ``MuonOptions``, ``model`` as ``TransformerConfig``, ``schedule``).

    Raises:
      ValueError: naming the dotted field and the allowed values.
    """
    import dataclasses

    from amemory import optim
    from amemory.models.roles import role_of  # lazy, as every registry: loading imports no jax
    from amemory.train.optimizers import multiplier

    for field, allowed in {**CHOICES, **optimizer_choices()}.items():
        present, value = _get(config, field)
        if present and value not in allowed:
            raise ValueError(f"config.{field}={value!r}; allowed values: {allowed}")
    for field, lo in MINIMUMS.items():
        present, value = _get(config, field)
        if present and (not isinstance(value, int) or isinstance(value, bool) or value < lo):
            raise ValueError(f"config.{field}={value!r}; must be an integer >= {lo}")
    validate_numbers(config)
    missing = [g for g in TASK_GROUPS.get(config.get("task"), ()) if g not in config]
    if missing:
        raise ValueError(
            f"config.task={config.task!r} reads config groups {missing} that this config "
            f"lacks; it must match the config file ({', '.join(TASK_GROUPS)})"
        )
    for field in ("optimizer.muon_roles", "spectrum_roles"):
        present, roles = _get(config, field)
        if present and config.task == "lm":
            optim.parse_roles(roles, role_of, field)
    for field in (f.name for f in dataclasses.fields(optim.MuonOptions)):
        if field in config.optimizer:  # MuonOptions owns these fields' ranges and choices
            try:
                optim.MuonOptions(**{field: config.optimizer[field]})
            except ValueError as e:
                raise ValueError(f"config.optimizer.{field}: {e}") from None
    multiplier(config.schedule, int(config.steps))  # SCHEDULES owns schedule.name
    if "model" in config:  # the model's own config validates its fields, translated once
        from amemory.train.tasks import model_config

        model_config(config, vocab_size=2)
    prof = tuple(config.get("profile_steps", ()))
    if prof and not (
        len(prof) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in prof)
        and 1 <= prof[0] <= prof[1]
    ):
        raise ValueError(
            f"config.profile_steps={prof!r}; must be () or (first, last) with 1 <= first <= last"
        )
    seeds = config.get("seeds", ())
    if not all(isinstance(s, int) for s in seeds) or len(set(seeds)) != len(seeds):
        raise ValueError(f"config.seeds={seeds!r}; must be distinct integers (or empty)")
    for name, s in [("seed", config.get("seed", 0))] + [("seeds", s) for s in seeds]:
        if not 0 <= s < 2**32:  # a PRNG key holds 32 bits: larger seeds overflow or repeat
            raise ValueError(
                f"config.{name}: {s} is out of range; seeds are integers in [0, 2**32)"
            )
    noise = config.get("noise", 0.0)
    if not 0.0 <= float(noise) < 1.0:
        raise ValueError(f"config.noise={noise!r}; must be in [0, 1)")


_ASSIGN_RE = re.compile(r"^\s*[A-Za-z_]\w*\.([A-Za-z_][\w.]*)\s*=(?!=)")


def field_comments(path: str | pathlib.Path) -> dict[str, tuple[tuple[str, ...], str, int]]:
    """Comments of the fields a config file assigns, read from its source.

    For every line ``c.a.b = value  # trailing`` the result holds
    ``"a.b": (block, trailing, line)``: ``block`` are the full-line comments directly
    above the assignment (no blank line in between; section rules such as
    ``# ---- data ----`` excluded), ``trailing`` the comment at the end of the
    (possibly multi-line) statement, ``line`` its first line number (file order).

    Raises:
      OSError: the file cannot be read.
    """
    src = pathlib.Path(path).read_text(encoding="utf-8")
    lines = src.splitlines()
    out: dict[str, tuple[tuple[str, ...], str, int]] = {}
    block: list[str] = []
    code_start: int | None = None
    trailing = ""
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        kind, text, (row, _), _, _ = tok
        if kind == tokenize.COMMENT:
            body = text.lstrip("#").strip()
            if code_start is None:  # a full-line comment
                if not body.startswith("-"):
                    block.append(body)
            else:
                trailing = body if not trailing else f"{trailing} {body}"
        elif kind == tokenize.NL and code_start is None:
            if not lines[row - 1].strip():  # a blank line ends a comment block
                block = []
        elif kind == tokenize.NEWLINE:
            m = _ASSIGN_RE.match(lines[code_start - 1]) if code_start else None
            if m and m.group(1) not in out:
                out[m.group(1)] = (tuple(block), trailing, code_start)
            block, code_start, trailing = [], None, ""
        elif kind not in (tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING):
            if code_start is None:
                code_start = row
    return out


def format_config(config: ConfigDict, path: str | pathlib.Path | None = None) -> str:
    """The config as indented ``name: value  # comment`` lines (``--print-config``).

    Values are JSON (strings quoted, ``null`` for None); fields appear in the order
    of the config file ``path`` (``path[:arg]`` accepted), each with its comments from
    that file (:func:`field_comments`); fields the file does not assign follow,
    sorted, with their :data:`ENGINE_DEFAULTS` comment where they have one.
    """
    comments = field_comments(str(path).partition(":")[0]) if path is not None else {}
    order = {name: i for i, (name, (_, _, i)) in enumerate(comments.items())}
    out: list[str] = []

    def walk(node: ConfigDict, prefix: str, indent: str) -> None:
        def key(k: str) -> tuple:
            return (order.get(prefix + k, len(order)), k)

        for k in sorted(node.keys(), key=key):
            name = prefix + k
            engine = ENGINE_DEFAULTS.get(name, (None, ""))[1]
            block, trailing, _ = comments.get(name, ((), engine, 0))
            out.extend(f"{indent}# {c}" for c in block)
            value = node[k]
            if isinstance(value, ConfigDict):
                out.append(f"{indent}{k}:" + (f"  # {trailing}" if trailing else ""))
                walk(value, name + ".", indent + "  ")
            else:
                text = json.dumps(list(value) if isinstance(value, tuple) else value)
                out.append(f"{indent}{k}: {text}" + (f"  # {trailing}" if trailing else ""))

    walk(config, "", "")
    return "\n".join(out)


#: The config groups each ``config.task`` reads (a memory config has no ``model``/``data``).
TASK_GROUPS = {"lm": ("model", "data"), "memory": ("memory",)}


def check_preset_overrides(config: ConfigDict, overrides: Sequence[str]) -> None:
    """Refuse an override of an option ``optimizer.preset`` sets: it would be ignored
    (``weight_decay`` is passed beside the preset and applies)."""
    preset = _get(config, "optimizer.preset")[1]
    if preset is None:
        return
    from amemory.optim.presets import PRESETS

    for item in overrides:
        field = item.split("=", 1)[0].strip()
        opt = field.removeprefix("optimizer.").removeprefix(f"{config.optimizer.name}_")
        if field.startswith("optimizer.") and opt in PRESETS[preset] and opt != "weight_decay":
            raise ValueError(
                f"config.{field} has no effect with config.optimizer.preset={preset!r}, which "
                f"sets {opt}={PRESETS[preset][opt]!r}; drop the override, or set "
                "optimizer.preset=None to choose the options one by one"
            )
