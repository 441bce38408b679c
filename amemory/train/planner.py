"""``amemory plan``: compile the train step for TPU (or GPU) targets this host does not own.

    amemory plan --config experiments/configs/lm.py --topology v5e:2x2 --topology v5p:2x2x2 \\
        --config.model.preset=gpt2-small --config.parallel.mode=sharded --config.parallel.fsdp=4

:func:`plan` builds the step ``amemory train`` runs (:func:`amemory.train.engine.build`,
the one step builder) from abstract shapes, lowers it for the devices of a TPU topology
(``jax.experimental.topologies``; the compiler is libtpu's, ``pip install "jax[tpu]"``) or
of H100s described by :data:`GPU_TARGETS` (``pip install "jax[cuda12-local]"``), and
reads the compiled executable: memory per chip (``memory_analysis``), and from the
optimized HLO the matmul FLOPs (while-loop bodies, e.g. scanned layers, multiplied by
their trip counts: ``cost_analysis`` counts a loop body once), the bytes of every
collective, and the dtype of the optimizer's dots (Newton-Schulz). A roofline *estimate*
of the step time comes from :data:`CHIPS`. The approach follows MaxText's
``train_compile.py`` (github.com/AI-Hypercomputer/maxtext).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import pathlib
import re
import time
from typing import Any

# Chip figures, per chip: peak dense bf16 FLOP/s, HBM bytes (GiB where the vendor or the
# compiler counts in GiB: the TPU compiler accepts v5e programs above 16e9 bytes), HBM
# bytes/s, interconnect bytes/s (ICI, or NVLink for GPUs; bidirectional, all links), and
# where they come from.
GiB = 2**30
CHIPS: dict[str, dict[str, Any]] = {
    "v4": dict(peak=275e12, hbm=32 * GiB, hbm_bw=1200e9, ici_bw=540e9,
               source="cloud.google.com/tpu/docs/v4; ICI: 6 links x 2 x 45 GB/s, "
                      "jax-ml.github.io/scaling-book/tpus"),
    "v5e": dict(peak=197e12, hbm=16 * GiB, hbm_bw=819e9, ici_bw=400e9,
                source="cloud.google.com/tpu/docs/v5e (HBM '16 GB', allocated as 16 GiB)"),
    "v5p": dict(peak=459e12, hbm=95 * GiB, hbm_bw=2765e9, ici_bw=1200e9,
                source="cloud.google.com/tpu/docs/v5p (95 GiB; bidirectional ICI 1200 GBps)"),
    "v6e": dict(peak=918e12, hbm=32 * GiB, hbm_bw=1638e9, ici_bw=800e9,
                source="cloud.google.com/tpu/docs/v6e"),
    "h100": dict(peak=989e12, hbm=80 * GiB, hbm_bw=3350e9, ici_bw=900e9,
                 source="nvidia.com/en-us/data-center/h100 (SXM, dense; 80 GiB HBM3)"),
    "h200": dict(peak=989e12, hbm=141e9, hbm_bw=4800e9, ici_bw=900e9,
                 source="nvidia.com/en-us/data-center/h200 (SXM, dense)"),
    "a100": dict(peak=312e12, hbm=80 * GiB, hbm_bw=2039e9, ici_bw=600e9,
                 source="nvidia.com/en-us/data-center/a100 (80GB SXM, dense; 80 GiB HBM2e)"),
}  # fmt: skip
# Deviceless GPU targets (``h100:HOSTSxGPUS``): the fields XLA's GpuTargetConfigProto needs
# to compile for a GPU this host does not have (jax-cuda12-plugin, no driver needed).
GPU_TARGETS = {
    "h100": """\
gpu_device_info { threads_per_block_limit: 1024 threads_per_warp: 32
  shared_memory_per_block: 49152 shared_memory_per_core: 233472 threads_per_core_limit: 2048
  core_count: 132 fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535
  block_dim_limit_z: 65535 memory_bandwidth: 3352320000000 l2_cache_size: 52428800
  clock_rate_ghz: 1.98 device_memory_size: 84942979072 shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 } registers_per_core_limit: 65536
  registers_per_block_limit: 65536 }
platform_name: "CUDA" dnn_version_info { major: 9 minor: 1 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""
}
TARGETS = tuple(c for c in CHIPS if c.startswith("v") or c in GPU_TARGETS)  # plannable chips
COLLECTIVES = ("all-to-all", "all-gather", "all-reduce", "reduce-scatter", "collective-permute")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4,
          "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16}  # fmt: skip
_ARRAY = re.compile(r"(\w+)\[([\d,]*)\]")


def _arrays(shape: str) -> list[tuple[str, list[int]]]:
    return [(t, [int(d) for d in dims.split(",") if d]) for t, dims in _ARRAY.findall(shape)]


def _nbytes(shape: str) -> int:
    return sum(_BYTES.get(t, 4) * math.prod(d) for t, d in _arrays(shape))


def _split(rest: str) -> tuple[str, str]:
    """``"(a, b) op(...)"`` or ``"f32[2]{0} op(...)"`` -> (shape, remainder)."""
    if rest.startswith("("):
        depth = 0
        for i, c in enumerate(rest):
            depth += {"(": 1, ")": -1}.get(c, 0)
            if depth == 0:
                return rest[: i + 1], rest[i + 2 :]
    shape, _, tail = rest.partition(" ")
    return shape, tail


def _elements(shape: str) -> list[str]:
    """The top-level elements of a tuple shape ``"(a, (b, c), d)"``; ``[shape]`` if not one."""
    if not shape.startswith("("):
        return [shape]
    out, depth, start = [], 0, 1
    for i, c in enumerate(shape):  # layouts hold commas and parentheses: {1,0:T(8,128)}
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(c, 0)
        if (c == "," and depth == 1) or depth == 0:
            out.append(shape[start:i].strip())
            start = i + 1
        if depth == 0:
            break
    return out


def _group_size(args: str, n: int) -> int:
    """Devices per replica group of one collective (HLO's three spellings; ``n``: all)."""
    m = re.search(r"replica_groups=\{(\{[\d,]*\})", args)
    if m:
        return len(m.group(1).strip("{}").split(","))
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", args)
    if m:
        return int(m.group(2))
    m = re.search(r"replica_groups=mesh\[([^\]]*)\][^{]*\{([^}]*)\}", args)
    if m:
        sizes = dict(re.findall(r"'(\w+)'=(\d+)", m.group(1)))
        return math.prod(int(sizes[a]) for a in re.findall(r"'(\w+)'", m.group(2)))
    return n


def _conv_macs(out: list[int], lhs: list[int], rhs: list[int], args: str) -> int:
    """Multiply-adds of an HLO convolution (TPU writes batched dots as convolutions whose
    spatial dims, dilated, strided and padded, act as batch dims): output features x
    input features x, per spatial dim, the (output, tap) pairs that meet real input."""
    import numpy as np

    ll, rl, ol = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", args).groups()
    window = re.search(r"window=\{([^}]*)\}", args)
    win = dict(re.findall(r"(\w+)=([\d_x]+)", window.group(1) if window else ""))
    macs = math.prod(d for c, d in zip(ol, out, strict=True) if not c.isdigit())
    macs *= rhs[rl.index("i")]
    for j in range(sum(c.isdigit() for c in ol)):
        n, m = lhs[ll.index(str(j))], out[ol.index(str(j))]
        size, stride, dil, rdil = (
            int(win[key].split("x")[j]) if key in win else 1
            for key in ("size", "stride", "lhs_dilate", "rhs_dilate")
        )
        lo = int(win["pad"].split("x")[j].split("_")[0]) if "pad" in win else 0
        pos = np.arange(m)[:, None] * stride - lo + np.arange(size)[None, :] * rdil
        macs *= int(((pos >= 0) & (pos <= (n - 1) * dil) & (pos % dil == 0)).sum())
    return macs


def _trips(comps: dict[str, list[tuple]], caller: str, args: str) -> int:
    """Trip count of a ``while``: XLA's ``known_trip_count``, else ``ceil((N - i0) / s)`` read
    from the loop: condition ``i < N`` (``i`` an element of the loop tuple), body
    ``i <- i + s`` (XLA's windowed-einsum loops step by 2), ``i0`` the initial value (a
    constant, through copies; 0 if not one). A loop of another form: the condition's
    largest constant."""
    known = re.search(r'known_trip_count":\{"n":"(\d+)"', args)
    if known:
        return int(known.group(1))
    cond, body = (re.search(rf"{k}=%([\w.\-]+)", args).group(1) for k in ("condition", "body"))
    ops = {c: {n: (op, a) for n, _, op, a in comps[c]} for c in (cond, body, caller)}
    first = lambda a: re.findall(r"%([\w.\-]+)", a.split(")")[0])  # noqa: E731

    def const(c, name):  # the value of a constant, through copies
        while ops[c].get(name, ("",))[0] == "copy":
            name = first(ops[c][name][1])[0]
        op, a = ops[c].get(name, ("", ""))
        return int(re.match(r"-?\d+", a).group()) if op == "constant" else None

    def index(c, name):  # k of get-tuple-element(loop tuple), index=k
        op, a = ops[c].get(name, ("", ""))
        return int(re.search(r"index=(\d+)", a).group(1)) if op == "get-tuple-element" else None

    for op, a in ops[cond].values():
        i_n = first(a) if op == "compare" and "direction=LT" in a else []
        if len(i_n) == 2 and index(cond, i_n[0]) is not None and const(cond, i_n[1]) is not None:
            k, bound = index(cond, i_n[0]), const(cond, i_n[1])
            update = first(comps[body][-1][3])[k]  # element k of the body's ROOT tuple
            op, a = ops[body].get(update, ("", ""))
            steps = [const(body, x) for x in first(a) if index(body, x) != k] if op == "add" else []
            step = steps[0] if len(steps) == 1 and steps[0] else 1
            init = const(caller, first(ops[caller][first(args)[0]][1])[k]) or 0
            return max(0, -(-(bound - init) // step))
    code = [cond] + re.findall(r"calls=%([\w.\-]+)", "".join(a for *_, a in comps[cond]))
    consts = [re.match(r"(-?\d+)\)", a) for c in code for *_, o, a in comps[c] if o == "constant"]
    return max([int(c.group(1)) for c in consts if c] or [1])


def hlo_stats(text: str, scope: str, n: int = 1, kernel: str = "") -> dict[str, Any]:
    """Per-chip counts from optimized HLO text (``compiled.as_text()``).

    Each computation is weighted by how often it runs: a while body by its trip count (XLA's,
    else the ``N`` of its condition's ``i < N``), any other callee by its caller's weight.
    ``flops``: 2 x multiply-adds of dots, convolutions and cuBLAS calls; ``collectives``:
    bytes each device sends per kind of :data:`COLLECTIVES`, ring model (``g`` devices per
    group, ``S`` result bytes: all-to-all and all-gather ``(g-1)/g S``, all-reduce
    ``2 (g-1)/g S``, reduce-scatter ``(g-1) S``, collective-permute ``S``; an asynchronous
    TPU collective counts once, where it starts); ``collective_ops``: how many run per step;
    ``*_scope``: the same for the ops whose name stack holds ``scope``, and
    ``scope_dot_dtypes`` the operand dtypes of their dots whose name stack also holds
    ``kernel``.

    Args:
      text: the module's HLO text.
      scope: a ``jax.named_scope`` name (``amemory.train.engine.OPTIMIZER_SCOPE``).
      n: devices of the module (for groups the HLO spells as "all devices").
      kernel: a function's name in the stack (``jit(_ns)``: amemory's Newton-Schulz).
    """
    comps: dict[str, list[tuple]] = {}
    order, skip, scattered, cur, entry = [], set(), set(), None, None
    for line in text.splitlines():
        head = re.match(r"^(ENTRY )?%?([\w.\-]+) \(.*\) -> .* \{$", line)
        if head:
            cur = head.group(2)
            entry = cur if head.group(1) else entry
            comps[cur] = []
            order.append(cur)
            continue
        m = re.match(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*)$", line)
        if cur is None or not m:
            continue
        shape, tail = _split(m.group(2))
        op, _, args = tail.partition("(")
        comps[cur].append((m.group(1), shape, op, args))
        callees = re.findall(r"calls=%([\w.\-]+)", args)
        if '"continuation_config"' in args:  # TPU: a piece of an asynchronous collective
            skip.update(callees)
        if re.search(r'"emitter":"\w*AllReduceScatter', args):  # TPU: all-reduce + slice
            scattered.update(callees)
        if 'custom_call_target="AsyncCollectiveDone"' in args:
            skip.add(cur)
    weight = dict.fromkeys(comps, 0)
    weight[entry] = 1  # callees are printed before their callers
    for name in reversed(order):
        for _, _, op, args in comps[name]:
            trips = _trips(comps, name, args) if op == "while" else 1
            callees = re.findall(r"(?:calls|to_apply|body|condition)=%([\w.\-]+)", args)
            branches = re.search(r"(?:branch|called)_computations=\{([^}]*)\}", args)
            callees += re.findall(r"%([\w.\-]+)", branches.group(1)) if branches else []
            for callee in callees:
                weight[callee] += weight[name] * (trips if f"body=%{callee}" in args else 1)
    out = {"flops": 0.0, "flops_scope": 0.0,
           "collectives": dict.fromkeys(COLLECTIVES, 0.0), "scope_dot_dtypes": set(),
           "collectives_scope": dict.fromkeys(COLLECTIVES, 0.0),
           "collective_ops": dict.fromkeys(COLLECTIVES, 0)}  # fmt: skip
    for name in order:
        shapes = {n: s for n, s, _, _ in comps[name]}
        w = weight[name]
        for _, shape, op, args in comps[name]:
            in_scope = f"{scope}/" in args
            operands = [shapes.get(o, "") for o in re.findall(r"%([\w.\-]+)", args.split(")")[0])]
            gemm = op == "custom-call" and re.search(r'target="__cublas\$(lt\$matmul|gemm)', args)
            if gemm or op in ("dot", "convolution"):
                out_elems, lhs = math.prod(_arrays(shape)[0][1]), _arrays(operands[0])[0]
                if gemm:  # GPU: dots become cuBLAS calls; result first in their output tuple
                    dims = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', args).group(1)
                    k = math.prod(lhs[1][int(d.strip('"'))] for d in dims.split(",") if d)
                elif op == "dot":
                    dims = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", args).group(1)
                    k = math.prod(lhs[1][int(d)] for d in dims.split(",") if d)
                else:
                    rhs = _arrays(operands[1])[0][1]
                    out_elems, k = 1, _conv_macs(_arrays(shape)[0][1], lhs[1], rhs, args)
                out["flops"] += 2.0 * out_elems * k * w
                if in_scope:
                    out["flops_scope"] += 2.0 * out_elems * k * w
                if in_scope and kernel in args:
                    out["scope_dot_dtypes"].add(lhs[0])
            kind = op.removesuffix("-start")
            if kind in COLLECTIVES and name not in skip:
                g = _group_size(args, n)
                if op.endswith("-start") and kind != "all-reduce":  # (operands, results, ...)
                    shape = _elements(shape)[1]
                size = _nbytes(shape)  # the whole array, F: result, or operand of a scatter
                if name in scattered and kind == "all-reduce":
                    kind = "reduce-scatter"
                elif kind == "reduce-scatter":
                    size *= g
                ring = {"all-reduce": 2 * (g - 1) / g, "collective-permute": 1.0}
                nbytes = ring.get(kind, (g - 1) / g) * size * w
                out["collectives"][kind] += nbytes
                out["collective_ops"][kind] += w
                if in_scope:
                    out["collectives_scope"][kind] += nbytes
    out["scope_dot_dtypes"] = sorted(out["scope_dot_dtypes"])
    return out


@contextlib.contextmanager
def uncached():
    """Compile without writing the persistent compilation cache: a TPU or GPU executable in
    the host's cache could not be loaded back there (the setting is read at each write)."""
    import jax

    key = "jax_persistent_cache_min_compile_time_secs"
    old = getattr(jax.config, key)
    jax.config.update(key, float("inf"))
    try:
        yield
    finally:
        jax.config.update(key, old)


def model_flops_per_token(model_config: Any, params: Any, roles: Any, seq_len: int) -> float:
    """Training FLOPs per token of a transformer, ``6 N + 12 L T d`` (arXiv 2204.02311,
    appendix B): ``N`` the weights multiplied with activations (every matrix but the
    embedding tables, plus the tied head ``V x d``; routed experts scaled by
    ``top_k / experts``), ``L`` layers, ``T = seq_len``, ``d`` the attention width;
    the attention term counts the full ``T x T`` scores, as the compiled step computes."""
    import jax

    n = 0.0
    for leaf, role in zip(jax.tree.leaves(params), jax.tree.leaves(roles), strict=True):
        if role not in ("embed", "norm", "bias"):
            scale = model_config.moe.top_k / model_config.moe.experts if "expert_" in role else 1
            n += math.prod(leaf.shape) * scale
    if model_config.tied_head:
        n += model_config.vocab_size * model_config.d_model
    attn = 12 * model_config.n_layers * seq_len * model_config.d_model
    return 6 * n + attn


def ns_flops(
    shape: tuple[int, ...], steps: int = 5, method: str = "auto", restarts: tuple[int, ...] = (2, 4)
) -> float:
    """Matmul FLOPs (2 per multiply-add) of amemory's Newton-Schulz on one ``k x l`` matrix,
    ``k <= l``: ``"direct"`` ``steps (4 k^2 l + 2 k^3)`` (optax's too), ``"gram"`` the Gram
    form restarted before the steps in ``restarts`` (``newton_schulz``'s float32 default
    ``(2, 4)``; ``(2,)`` below 32 bits), ``"auto"`` the Gram form where ``l >= 2k``.

    Gram form: ``R = X X^H`` and the final ``Q X`` (``4 k^2 l``), each restart ``Q X`` and a
    new ``R`` (``4 k^2 l``), ``Z = bR + cR^2`` every step, ``Q Z`` and the two-product update
    of ``R`` on every step that neither starts nor follows a restart (``2 k^3`` a product).
    """
    k, l = sorted(shape)
    if method == "direct" or (method == "auto" and l < 2 * k):
        return steps * (4.0 * k * k * l + 2.0 * k**3)
    per, n_restarts = 2.0 * k**3, sum(0 < i < steps for i in restarts)
    plain = steps - 1 - n_restarts  # steps with a Q Z product and an R update
    return 4.0 * k * k * l * (1 + n_restarts) + steps * per + 3 * plain * per


def _advice(temporaries: bool) -> str:
    """What dominates a plan that does not fit, and what to change."""
    if temporaries:
        return (
            "temporaries (activations) dominate: lower data.batch_size, set "
            "model.remat=true (remat_policy nothing_saveable), or model.scan_layers=true"
        )
    return (
        "arguments (parameters and optimizer state) dominate: raise parallel.fsdp (mode "
        "sharded) or use more chips"
    )


def topology_devices(topology: str) -> tuple[str, list]:
    """``(chip, devices)`` of a topology string, checked before anything is compiled.

    ``chip:AxB[xC]`` for a TPU of :data:`CHIPS` (a shape ``get_topology_desc`` knows),
    ``chip:N`` or ``chip:HOSTSxN`` for a GPU of :data:`GPU_TARGETS`.

    Raises:
      ValueError: an unknown chip, a malformed or unknown shape, or a missing compiler
        plugin (names what to install).
    """
    from jax.experimental import topologies

    from amemory.train import noise

    chip, _, shape = topology.partition(":")
    gpu = chip in GPU_TARGETS
    if chip not in TARGETS:
        raise ValueError(f"topology={topology!r}: the chip must be one of {TARGETS}")
    form = r"([1-9]\d*x)?[1-9]\d*" if gpu else r"[1-9]\d*(x[1-9]\d*){1,2}"
    if not re.fullmatch(form, shape):
        raise ValueError(f"topology={topology!r}: the shape must look like "
                         f"{'8 or 2x8 (hosts x GPUs)' if gpu else '2x2 or 2x2x2'}")  # fmt: skip
    plugin = ("jax_cuda12_plugin", "jax[cuda12-local]") if gpu else ("libtpu", "jax[tpu]")
    if importlib.util.find_spec(plugin[0]) is None:
        raise ValueError(f"topology={topology!r} needs the {plugin[0]} compiler: pip install "
                         f"'{plugin[1]}' (no {chip} needed on this host)")  # fmt: skip
    hosts, _, per_host = shape.rpartition("x")
    args = (dict(platform="cuda", topology=f"1x{hosts or 1}x{per_host}", target_config=GPU_TARGETS[
        chip]) if gpu else dict(topology_name=topology, platform="tpu"))  # fmt: skip
    try:  # the compiler's start-up log is shown only when the topology loads
        with noise.held(fd=True):
            return chip, topologies.get_topology_desc(**args).devices
    except (RuntimeError, NotImplementedError, ValueError) as e:
        raise ValueError(f"topology={topology!r}: the {chip} compiler cannot load it: "
                         f"{(str(e).splitlines() or [''])[0][:200]}") from None  # fmt: skip


def plan(config: Any, topology: str, *, save: str | pathlib.Path | None = None) -> dict:
    """Compile ``amemory train``'s step for ``config`` on a TPU (or GPU) ``topology``; report.

    Args:
      config: a run ConfigDict (validated here; engine defaults added).
      topology: a name ``jax.experimental.topologies.get_topology_desc`` accepts with a chip
        of :data:`CHIPS`, ``"v5e:2x2"``, ``"v5p:2x2x2"``, ``"v4:2x2x1"``, ``"v6e:2x2"``; or a
        GPU of :data:`GPU_TARGETS` as ``"h100:8"`` or ``"h100:2x8"`` (hosts x GPUs; needs
        ``pip install "jax[cuda12-local]"``, no GPU or driver).
      save: write the serialized executable here (``jax.experimental.serialize_executable``).

    Returns:
      dict: topology, chips, compile_s, compile_cpu_s, memory (bytes per chip by kind),
      hbm_bytes, fits, margin_bytes, advice (when it does not fit), flops_per_chip,
      optimizer_flops_per_chip, model_flops_per_token, tokens_per_step, collectives and
      optimizer_collectives (bytes per chip and step by kind), ns_dtype (of the optimizer's
      dots; None without any) and ``estimate``: the roofline step time (the slowest of
      compute at peak bf16, HBM traffic and the interconnect), tokens_per_s, mfu and
      optimizer_share. A config the compiler cannot fit in HBM gives ``fits=False`` and
      its message.

    Raises:
      ValueError: an unknown chip or a bad config (names the field).
    """
    from amemory.optim import orthogonalize
    from amemory.train import config as config_lib
    from amemory.train import engine as engine_lib
    from amemory.train import parallel

    chip, devices = topology_devices(topology)
    config_lib.with_engine_defaults(config)
    config_lib.validate(config)
    place = parallel.placement(config.parallel, devices)
    b = engine_lib.build(config, place)
    local = next(iter(b.task.train_input() or [None]))
    spec = CHIPS[chip]
    chips = place.mesh.size  # "single" uses one chip of the topology
    model = getattr(b.task, "model_config", None)  # the memory task has no vocabulary
    out: dict[str, Any] = {
        "topology": topology,
        "chips": chips,
        "mode": place.mode,
        "params": b.n_params,
        "vocab_size": getattr(model, "vocab_size", None),
    }
    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        with uncached():
            compiled = b.engine.lower(local).compile()
    except Exception as e:  # noqa: BLE001 - the compiler's out-of-memory is a result
        if "RESOURCE_EXHAUSTED" not in str(e) and "memory" not in str(e).lower():
            raise
        msg = str(e).splitlines()[0][:400]
        advice = _advice("temporaries" in msg)
        return out | {"fits": False, "compile_s": time.perf_counter() - t0, "error": msg,
                      "advice": advice}  # fmt: skip
    out["compile_s"] = time.perf_counter() - t0
    out["compile_cpu_s"] = time.process_time() - cpu0  # less moved by other jobs than wall
    m = compiled.memory_analysis()
    mem = {"argument_bytes": m.argument_size_in_bytes, "temp_bytes": m.temp_size_in_bytes,
           "output_bytes": m.output_size_in_bytes, "alias_bytes": m.alias_size_in_bytes,
           "code_bytes": m.generated_code_size_in_bytes}  # fmt: skip
    mem["total_bytes"] = sum(mem.values()) - 2 * mem["alias_bytes"]  # donated outputs alias
    out |= {"memory": mem, "hbm_bytes": spec["hbm"]}
    out["margin_bytes"] = spec["hbm"] - mem["total_bytes"]
    out["fits"] = out["margin_bytes"] >= 0
    if not out["fits"]:
        out["advice"] = _advice(mem["temp_bytes"] >= mem["argument_bytes"])
    ns = f"jit({orthogonalize._ns_static.__name__})/"  # the Newton-Schulz kernel's dots
    st = hlo_stats(compiled.as_text(), engine_lib.OPTIMIZER_SCOPE, chips, kernel=ns)
    tokens = b.task.tokens_per_step
    abstract = b.engine.abstract.params
    per_token = None
    if hasattr(b.task, "model_config"):
        roles = b.task.roles(abstract)
        seq = getattr(b.task, "seq_len", b.task.model_config.max_len)
        per_token = model_flops_per_token(b.task.model_config, abstract, roles, seq)
    dtypes = st["scope_dot_dtypes"]
    out |= {
        "flops_per_chip": st["flops"], "optimizer_flops_per_chip": st["flops_scope"],
        "model_flops_per_token": per_token,
        "tokens_per_step": tokens, "collectives": st["collectives"],
        "optimizer_collectives": st["collectives_scope"],
        "ns_dtype": dtypes[0] if len(dtypes) == 1 else (dtypes or None),
    }  # fmt: skip

    def seconds(flops, traffic, coll):
        return max(flops / spec["peak"], traffic / spec["hbm_bw"], coll / spec["ici_bw"])

    # HBM traffic, a floor: arguments read, outputs written, temporaries written and read;
    # the optimizer update reads and writes the state (about the arguments)
    traffic = mem["argument_bytes"] + mem["output_bytes"] + 2 * mem["temp_bytes"]
    step = seconds(st["flops"], traffic, sum(st["collectives"].values()))
    state = 2 * mem["argument_bytes"]
    opt = seconds(st["flops_scope"], state, sum(st["collectives_scope"].values()))
    est = {"step_s": step, "tokens_per_s": tokens / step if step else None,
           "optimizer_share": opt / step if step else None, "mfu": None}  # fmt: skip
    if per_token and step:
        est["mfu"] = per_token * tokens / (step * chips * spec["peak"])
    out["estimate"] = est
    if save is not None:
        import pickle

        from jax.experimental.serialize_executable import serialize

        from amemory import atomic

        atomic.write_bytes(pathlib.Path(save), pickle.dumps(serialize(compiled)))
        out["saved"] = str(save)
    return out


def format_table(reports: list[dict]) -> str:
    """One row per topology; estimates marked ``~``."""
    gb = GiB
    rows = [
        "topology | params (vocab) | fits (margin GiB) | GiB/chip arg+temp+out | compile s | "
        "TFLOP/chip (opt) | collective MB/chip (opt) | ns_dtype | ~step ms | ~tok/s | ~MFU | "
        "~opt share"
    ]
    for r in reports:
        if "memory" not in r:
            rows.append(f"{r['topology']} | no: {r.get('error', '')}")
            continue
        m, e = r["memory"], r["estimate"]
        coll, ocoll = sum(r["collectives"].values()), sum(r["optimizer_collectives"].values())
        mfu = f"{e['mfu']:.0%}" if e["mfu"] is not None else "-"
        rows.append(
            f"{r['topology']} | {r['params']:,} ({r['vocab_size']}) | "
            f"{'yes' if r['fits'] else 'NO'} ({r['margin_bytes'] / gb:+.2f}) | "
            f"{m['argument_bytes'] / gb:.2f}+{m['temp_bytes'] / gb:.2f}+"
            f"{m['output_bytes'] / gb:.2f} | {r['compile_s']:.0f} | "
            f"{r['flops_per_chip'] / 1e12:.3f} ({r['optimizer_flops_per_chip'] / 1e12:.3f}) | "
            f"{coll / 1e6:.1f} ({ocoll / 1e6:.1f}) | {r['ns_dtype']} | {e['step_s'] * 1e3:.2f} | "
            f"{e['tokens_per_s']:.3g} | {mfu} | {e['optimizer_share']:.1%}"
        )
        if not r["fits"]:
            rows.append(f"  does not fit: {r['advice']}")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    """``amemory plan``: parse, plan every ``--topology``, print the table (or JSON)."""
    from amemory.cli import Parser
    from amemory.train.cli import _split_overrides

    parser = Parser(
        prog="amemory plan",
        description="Compile the train step of a config for TPU topologies (pip install "
        "'jax[tpu]') or H100s (pip install 'jax[cuda12-local]') from this host and report "
        "memory, FLOPs, collectives and a roofline estimate. Override fields with "
        "--config.a.b=VALUE.",
    )
    parser.add_argument("--config", required=True, help="config file, optionally PATH:ARG")
    parser.add_argument(
        "--topology",
        action="append",
        required=True,
        help=f"e.g. v5e:2x2, v5p:2x2x2, h100:8 (chips: {', '.join(TARGETS)}); repeatable",
    )
    parser.add_argument(
        "--json", nargs="?", const="-", metavar="FILE",
        help="write the reports as JSON to FILE (no FILE: to stdout instead of the table)",
    )  # fmt: skip
    parser.add_argument("--save", metavar="DIR", help="write DIR/<topology>.exe (serialized)")
    args, rest = parser.parse_known_args(argv)
    from amemory.train.config import load_config

    try:
        config = load_config(args.config, _split_overrides(rest))
        reports = []
        for topo in args.topology:
            save = pathlib.Path(args.save) / f"{topo.replace(':', '_')}.exe" if args.save else None
            reports.append(plan(config, topo, save=save))
    except ValueError as e:
        return parser.fail(e)
    if args.json in (None, "-"):
        print(json.dumps(reports, indent=2) if args.json else format_table(reports))
    else:
        from amemory import atomic

        atomic.write_json(pathlib.Path(args.json), reports)
        print(format_table(reports))
    return 0
