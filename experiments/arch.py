"""Muon with latent attention and mixture of experts: training cost, quality, decoding cost.

Claims of arXiv 2509.24406 (abstract; 30M-200M decoders; the paper values are in
experiments/claims.toml): Muon's compute to AdamW's loss, and MLA+MoE+Muon's memory,
speed and perplexity against the dense decoder with AdamW. We train dense, MLA (arXiv
2405.04434), MoE and MLA+MoE decoders of matched active size with AdamW and with Muon on
the hidden matrices, and measure parameters, validation loss, steps and FLOPs to
dense-AdamW's final loss, KV bytes per token, greedy decoding tokens/s and XLA's decode
memory; and Muon on the experts only against attention only (arXiv 2509.26030, Table 1).

FLOPs are model FLOPs (PaLM, arXiv 2204.02311, App. B): ``6 N + 6 L H T (d_qk + d_v)`` per
training token, N the active matrix parameters (routed experts at ``top_k / E``; the
one-hot dispatch not counted), plus every Muon step's Newton-Schulz FLOPs
(``amemory.train.planner.ns_flops``). A claim is held when we measure at least 80% of the
paper's effect (the thresholds in experiments/claims.toml).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import numpy as np
from ml_collections import ConfigDict

from amemory.analysis import plots
from experiments import common, train_runs

OPTIMIZERS = ("adam", "muon")


def run_config(cfg: ConfigDict, arch: str, optimizer: str, muon_roles: str = "hidden"):
    """The training run of one cell: ``cfg.base`` with the architecture's model fields;
    ``ValueError`` for an unknown architecture or optimizer."""
    from experiments.configs.arch import ARCHITECTURES

    if arch not in ARCHITECTURES:
        raise ValueError(
            f"arch config field 'architectures': unknown {arch!r}; allowed {ARCHITECTURES}"
        )
    lr = cfg.lr.adam if optimizer == "adam" else cfg.lr.muon
    c = train_runs.run_config(cfg.base, optimizer, lr, cfg.lr.adam, muon_roles)
    if "mla" in arch:
        c.model.attention = "mla"
        for k in ("kv_rank", "rope_dim", "q_rank"):
            c.model.mla[k] = cfg.mla[k]
    if "moe" in arch:
        for k in ("experts", "top_k", "shared", "d_expert", "capacity_factor", "lb_coef"):
            c.model.moe[k] = cfg.moe[k]
    return c


def n_units(cfg: ConfigDict) -> int:
    """Progress units: the training runs, then the decoding measurements."""
    partial = len(cfg.partial) if "mla_moe" in cfg.architectures else 0
    frontier = sum(map(len, ARMS.values())) if cfg.frontier.seeds else 0
    return len(cfg.architectures) * len(OPTIMIZERS) + partial + 1 + frontier


# Frontier arms (docs/peers.md, "The 2026 frontier"): arm -> architectures it runs on.
ARMS = {"muon": ("dense", "mla"), "per_head": ("dense", "mla"), "muon_wd": ("dense",),
        "muonh": ("dense",), "qk_clip": ("dense",)}  # fmt: skip


def frontier_config(cfg: ConfigDict, arch: str, arm: str, tau: float = 0.0) -> ConfigDict:
    """The Muon run of ``arch`` on ``cfg.frontier.seeds`` with the arm's optimizer change."""
    from amemory.models import transformer

    c = train_runs.seeded(run_config(cfg, arch, "muon"), cfg.frontier.seeds)
    o, mc = c.optimizer, transformer.preset(c.model.preset)
    if arm == "per_head":
        o.per_head = True
    elif arm == "muon_wd":
        o.weight_decay = float(cfg.frontier.weight_decay)
    elif arm == "muonh":  # the relative step Muon takes on a d x d matrix at initialisation
        o.name = "muonh"
        o.lr = cfg.lr.muon / (mc.init_std * math.sqrt(c.model.d_model or mc.d_model))
    elif arm == "qk_clip":
        o.qk_clip = float(tau)
    return c


def _peak_logit(run: dict[str, Any]) -> np.ndarray:
    """``[steps, seeds]`` max over layers of the logged ``max_logit/<layer>``."""
    train = [r for r in run["records"] if r.get("kind") == "train"]
    layers = [k for k in train[-1] if k.startswith("max_logit/")]
    return np.asarray([np.max([r[k] for k in layers], axis=0) for r in train], float)


def frontier(cfg: ConfigDict, stage: common.Stage) -> tuple:
    """Train the frontier arms; ``(metrics, claims (a)-(d), figures)``."""
    runs: dict[str, dict[str, Any]] = {}
    tau = 0.0
    for arm, archs in ARMS.items():
        for arch in archs:
            if arm == "qk_clip":  # set from the whole-matrix Muon run, so that the clip acts
                peak = np.max(_peak_logit(runs["dense/muon"]), axis=0).mean()
                tau = round(float(cfg.frontier.clip_fraction * peak), 3)
            rc = frontier_config(cfg, arch, arm, tau)
            label = f"arch-frontier-{arch}-{arm}-lr{rc.optimizer.lr:g}-tau{tau:g}"
            runs[f"{arch}/{arm}"] = train_runs.train_cached(rc, stage.cache_dir, label)
            stage.progress(f"frontier {arch} {arm}")
    last = f"loss/bucket_{int(cfg.base.data.n_buckets) - 1}"
    cells = {k: {"val_loss": train_runs.final_eval_seeds(r).tolist(),
                 "head_loss": train_runs.final_eval_seeds(r, "loss/bucket_0").tolist(),
                 "tail_loss": train_runs.final_eval_seeds(r, last).tolist(),
                 "peak_max_logit": np.max(_peak_logit(r), axis=0).tolist(),
                 "late_max_logit": float(np.max(_peak_logit(r)[1:]))}
             for k, r in runs.items()}  # fmt: skip
    every = int(cfg.base.log_every)
    figure = plots.plot_curves(
        {k: (every * np.arange(1, len(p) + 1), p) for k, p in
         ((k, _peak_logit(r)) for k, r in runs.items())},
        stage.out_dir / "figures" / "arch_max_logit.png", xlabel="step",
        ylabel="max logit (layers, heads)",
        title=f"max logits; QK-Clip tau = {tau:g}", hline=tau,
    )  # fmt: skip
    m = {"cells": cells, "tau": tau, "seeds": list(cfg.frontier.seeds)}
    return m, frontier_claims(cfg, m), [stage.figure(figure)]


CLAIMS = common.claim_specs("arch")


def frontier_claims(cfg: ConfigDict, m: dict[str, Any]) -> list[common.Claim]:
    """The frontier claims of :data:`CLAIMS` on the per-seed final losses; QK-Clip's also needs
    ``late_max_logit`` (the largest max logit after the first train record) <= 1.05 tau."""
    final = {k: np.asarray(c["val_loss"], float) for k, c in m["cells"].items()}
    margin, tau = float(cfg.frontier.margin), m["tau"]
    gap = {k: final[f"mla/{k}"] - final[f"dense/{k}"] for k in ("muon", "per_head")}
    late = m["cells"]["dense/qk_clip"]["late_max_logit"]
    claims = [
        CLAIMS["mla_gap_whole_muon"].claim(gap["muon"]),
        CLAIMS["per_head_closes_mla_gap"].claim(gap["per_head"] - gap["muon"]),
        CLAIMS["per_head_vs_whole"].claim(
            final["dense/per_head"] - final["dense/muon"], threshold=margin
        ),
        CLAIMS["muonh_vs_muon_wd"].claim(final["dense/muonh"] - final["dense/muon_wd"]),
    ]
    cost = final["dense/qk_clip"] - final["dense/muon"]
    loss = CLAIMS["qk_clip_no_cost"].claim(cost, threshold=margin, tau=tau)
    capped = late <= 1.05 * tau
    loss.ours = (f"largest max logit after the first record {common.fmt(late, 2)} "
                 f"{'<=' if capped else '>'} cap 1.05 tau = {common.fmt(1.05 * tau, 2)}; loss "
                 f"cost (QK-Clip − Muon) {loss.ours} nats")  # fmt: skip
    loss.held = None if loss.held is None else bool(loss.held and capped)
    return claims + [loss]


def model_costs(mc: Any, params: Any, muon_roles: tuple[str, ...]) -> dict[str, float]:
    """Parameter counts and FLOPs of one model (see the module docstring).

    Returns:
      ``total_params``, ``active_params`` (routed experts at ``top_k / E``),
      ``flops_per_token`` (training, model FLOPs), ``ns_flops_per_step`` (Newton-Schulz of
      the leaves whose role is in ``muon_roles``).
    """
    import jax

    from amemory.models import transformer
    from amemory.train.planner import ns_flops

    leaves = jax.tree.leaves(params)
    roles = jax.tree.leaves(transformer.param_roles(params))
    moe = mc.moe_dims
    total = active = matmul = ns = 0.0
    for x, role in zip(leaves, roles, strict=True):
        size = float(np.prod(x.shape))
        share = moe.top_k / moe.experts if role.startswith("expert_") else 1.0
        total += size
        active += size * share
        if role in transformer.HIDDEN_ROLES or role in ("head", "router"):
            matmul += size * share
        if role in muon_roles:
            ns += ns_flops(tuple(x.shape[-2:])) * float(np.prod(x.shape[:-2]))
    if mc.tied_head:
        matmul += mc.vocab_size * mc.d_model
    d_qk = mc.head_dim + (mc.mla_dims.rope_dim if mc.attention == "mla" else 0)
    attn = 6.0 * mc.n_layers * mc.n_heads * mc.max_len * (d_qk + mc.head_dim)
    return {"total_params": total, "active_params": active,
            "flops_per_token": 6.0 * matmul + attn, "ns_flops_per_step": ns}  # fmt: skip


def decode_measurements(cfg: ConfigDict, models: dict[str, tuple]) -> dict[str, Any]:
    """Per architecture: KV bytes per token, decoding tokens/s per batch, decode memory.

    ``models``: ``{arch: (graphdef, params, model config, validation tokens)}``. Greedy
    decoding of validation prompts; timings (prefill included) are medians over
    ``decode.reps`` repetitions taken in turn across architectures, so load hits all alike.
    """
    import jax
    import jax.numpy as jnp

    from amemory.models import decode

    dc = cfg.decode
    p_len, new = int(dc.prompt_len), int(dc.speed_length) - int(dc.prompt_len)
    out = {}
    for arch, (graphdef, params, mc, _) in models.items():
        memory = {
            int(n): decode.generate_memory(
                graphdef, params, int(dc.memory_batch), p_len, int(n) - p_len
            )
            for n in dc.memory_lengths
        }
        kv = decode.cache_bytes_per_token(mc)
        out[arch] = {"kv_bytes_per_token": kv, "memory": memory, "tokens_per_s": {}}
    times: dict[tuple[str, int], list[float]] = {}
    for rep in range(int(dc.reps) + 1):  # repetition 0 compiles and is not timed
        for b in dc.batches:
            for arch, (graphdef, params, _, val) in models.items():
                prompt = jnp.asarray(np.asarray(val[: b * p_len]).reshape(b, p_len), jnp.int32)
                t0 = time.perf_counter()
                decode.generate(
                    graphdef, params, prompt, new, key=jax.random.key(0), temperature=0.0
                ).block_until_ready()
                if rep:
                    times.setdefault((arch, int(b)), []).append(time.perf_counter() - t0)
    for (arch, b), ts in times.items():
        out[arch]["tokens_per_s"][b] = b * new / statistics.median(ts)
    return out


def run(cfg: ConfigDict, stage: common.Stage) -> dict[str, Any]:
    """Train every cell (the dense ones are tail_lm's runs) and measure decoding; ``ValueError``
    for an unknown architecture, or "dense" (the baseline) missing."""
    import jax
    from flax import nnx

    from amemory.models.roles import role_of
    from amemory.optim import parse_roles
    from amemory.train.sample import load_run

    archs = tuple(cfg.architectures)
    for a in archs:
        run_config(cfg, a, "adam")  # validates the names before any training
    if "dense" not in archs:
        raise ValueError("arch config field 'architectures' must include 'dense' (the baseline)")
    runs: dict[str, dict[str, Any]] = {}
    cells = [(a, o, "hidden") for a in archs for o in OPTIMIZERS]
    if "mla_moe" in archs:
        cells += [("mla_moe", "muon", roles) for roles in cfg.partial]
    for arch, opt, roles in cells:
        name = opt if roles == "hidden" or opt == "adam" else f"muon_{roles}"
        rc = run_config(cfg, arch, opt, roles)
        label = f"arch-{arch}-{name}-lr{rc.optimizer.lr:g}"
        runs.setdefault(arch, {})[name] = train_runs.train_cached(rc, stage.cache_dir, label)
        stage.progress(f"{arch} {name}")
    models = {}
    for a in archs:  # the Muon runs' weights
        graphdef, params, _, data = load_run(runs[a]["muon"]["workdir"])
        params = jax.device_put(params)
        models[a] = (graphdef, params, nnx.merge(graphdef, params).config, data.val_tokens)
    dec = decode_measurements(cfg, models)
    stage.progress("decoding")
    target = train_runs.final_eval(runs["dense"]["adam"])
    cellm: dict[str, dict[str, Any]] = {}
    for arch, by_opt in runs.items():
        _, params, mc, _ = models[arch]
        tokens = int(cfg.base.data.batch_size) * int(cfg.base.data.seq_len)
        for name, r in by_opt.items():
            roles = parse_roles(r["summary"]["muon_roles"], role_of) if name != "adam" else ()
            costs = model_costs(mc, params, roles)
            step_flops = costs["flops_per_token"] * tokens + costs["ns_flops_per_step"]
            steps, loss = train_runs.eval_series(r["records"], "loss")
            own = train_runs.final_eval(by_opt["adam"])
            s_dense = train_runs.steps_to_reach(steps, loss, target)
            s_own = train_runs.steps_to_reach(steps, loss, own)
            cellm[f"{arch}/{name}"] = {
                "arch": arch, "optimizer": name, "workdir": r["workdir"],
                **costs, "flops_per_step": step_flops,
                "final_val_loss": train_runs.final_eval(r),
                "perplexity": math.exp(train_runs.final_eval(r)),
                "eval_steps": steps, "val_loss": loss, "total_steps": float(steps[-1]),
                "steps_to_dense_adam": s_dense, "flops_to_dense_adam": s_dense * step_flops,
                "steps_to_own_adam": s_own, "flops_to_own_adam": s_own * step_flops,
                "wall_s": r["summary"].get("wall_s"),
            }  # fmt: skip
    metrics = {"target_loss": target, "lr": cfg.lr.to_dict(), "lr_source": cfg.lr_source,
               "cells": cellm, "decode": dec}  # fmt: skip
    figures, claims = make_figures(cfg, metrics, stage.out_dir), make_claims(cfg, metrics)
    metrics["report_md"] = report_md(cfg, metrics)
    if cfg.frontier.seeds:
        metrics["frontier"], more, paths = frontier(cfg, stage)
        claims, figures = claims + more, figures + paths
        metrics["report_md"] += frontier_md(metrics["frontier"])
    return {"metrics": metrics, "figures": figures, "claims": claims, "notes": make_notes(cellm)}


def make_notes(cells: dict[str, dict[str, Any]]) -> list[str]:
    """Caveats printed under the stage's claims (how to read the numbers)."""
    notes = [
        "one seed per cell; learning rates not tuned per architecture",
        "MoE tokens reach experts through a dense one-hot dispatch (every expert runs its "
        "C slots), so decoding does E / top_k times the expert FLOPs a gather kernel "
        "would: speed ratios are those of this implementation, at this size, on CPU",
    ]
    ppl0 = cells["dense/adam"]["perplexity"]
    parts = [f"{key} {1 - cells[key]['perplexity'] / ppl0:+.1%}"
             for key in ("dense/muon", "mla_moe/adam", "mla_moe/muon") if key in cells]  # fmt: skip
    notes.append("perplexity reduction against dense/adam: " + ", ".join(parts))
    return notes


def make_figures(cfg: ConfigDict, m: dict[str, Any], out_dir: Any) -> list[str]:
    """Validation curves of every cell; decoding speed (largest batch) and memory per arch."""
    cells, dec, fig = m["cells"], m["decode"], out_dir / "figures"
    b, n = max(cfg.decode.batches), max(cfg.decode.memory_lengths)
    paths = [
        plots.plot_curves(
            {k: (c["eval_steps"], c["val_loss"]) for k, c in cells.items()},
            fig / "arch_val_loss.png", xlabel="step", ylabel="validation loss (nats/token)",
            title="dense / MLA / MoE / MLA+MoE, AdamW vs Muon", hline=m["target_loss"],
        ),
        plots.plot_bars(
            {a: d["tokens_per_s"][b] for a, d in dec.items()}, fig / "arch_decode_speed.png",
            ylabel=f"tokens/s (batch {b}, greedy)", title="KV-cache decoding speed",
        ),
        plots.plot_bars(
            {a: d["memory"][n]["total"] / 2**20 for a, d in dec.items()},
            fig / "arch_decode_memory.png", ylabel=f"MiB (batch {cfg.decode.memory_batch}, "
            f"{n} tokens)", title="decoding memory (XLA buffer assignment)",
        ),
    ]  # fmt: skip
    return [str(p.relative_to(out_dir)) for p in paths]


def _less(reduction: float) -> str:
    """``0.3 -> "30% less"``, ``-0.2 -> "20% more"``."""
    return f"{abs(reduction):.0%} {'less' if reduction >= 0 else 'more'}"


def report_md(cfg: ConfigDict, m: dict[str, Any]) -> str:
    """Markdown: the table of cells, then the decoding table per architecture."""
    f, dc = common.fmt, cfg.decode

    def reached(x: float, digits: int = 0, scale: float = 1.0) -> str:
        return f(x / scale, digits) if math.isfinite(x) else "never"

    lines = [f"Learning rates: AdamW {m['lr']['adam']:g}, Muon {m['lr']['muon']:g} "
             f"({m['lr_source']}); target = dense-AdamW's final validation loss "
             f"{f(m['target_loss'])}.", ""]  # fmt: skip
    lines += common.table(
        ("architecture", "optimizer", "params (total / active)", "val loss", "perplexity",
         "steps to target / run", "GFLOPs to target", "steps to own AdamW's final"),
        ((c["arch"], c["optimizer"], f"{c['total_params']:,.0f} / {c['active_params']:,.0f}",
          f(c["final_val_loss"]), f(c["perplexity"], 1),
          f"{reached(c['steps_to_dense_adam'])} / {f(c['total_steps'], 0)}",
          reached(c["flops_to_dense_adam"], 1, 1e9), reached(c["steps_to_own_adam"]))
         for c in m["cells"].values()),
    )  # fmt: skip
    bs, ns = list(dc.batches), list(dc.memory_lengths)
    lines += ["", f"Decoding (greedy, KV cache; {dc.speed_length} tokens with a {dc.prompt_len}"
              "-token prompt; memory = XLA buffer assignment of the decode program at batch "
              f"{dc.memory_batch}):", ""]  # fmt: skip
    lines += common.table(
        ("architecture", "KV bytes / token", *(f"tokens/s (batch {b})" for b in bs),
         *(f"MiB ({n} tokens)" for n in ns)),
        ((arch, f"{d['kv_bytes_per_token']:,}", *(f"{d['tokens_per_s'][b]:.0f}" for b in bs),
          *(f"{d['memory'][n]['total'] / 2**20:.2f}" for n in ns))
         for arch, d in m["decode"].items()),
    )  # fmt: skip
    return "\n".join(lines)


def frontier_md(m: dict[str, Any]) -> str:
    """Markdown table of the frontier arms: seed means ± 95% half-widths."""
    keys = ("val_loss", "head_loss", "tail_loss", "peak_max_logit")
    return "\n".join(["", f"Frontier arms (seeds {m['seeds']}; QK-Clip tau = {m['tau']:g}):", ""]
                     + common.table(("cell", "val loss", "head bucket", "tail bucket",
                                     "peak max logit"),
                                    ((k, *(common.seed_mean(c[x]) for x in keys))
                                     for k, c in m["cells"].items())))  # fmt: skip


def make_claims(cfg: ConfigDict, m: dict[str, Any]) -> list[common.Claim]:
    """:data:`CLAIMS`, each decided by its threshold on this run's measurements."""
    cells, dec, f = m["cells"], m["decode"], common.fmt
    ratios, step_ratios = {}, {}
    for arch in cfg.architectures:
        mu, ad = cells[f"{arch}/muon"], cells[f"{arch}/adam"]
        r = mu["flops_to_own_adam"] / (ad["total_steps"] * ad["flops_per_step"])
        ratios[arch] = r if math.isfinite(r) else math.inf  # never reached: no saving
        step_ratios[arch] = mu["steps_to_own_adam"] / ad["total_steps"]
    ours = ", ".join(f"{a} {r:.0%} ({step_ratios[a]:.0%} of the steps)" for a, r in ratios.items())
    claims = [CLAIMS["muon_compute"].claim(ours=ours, held=all(r <= CLAIMS["muon_compute"].threshold
                                                          for r in ratios.values()))]  # fmt: skip
    if "mla_moe" not in dec:
        return claims
    dc = cfg.decode
    b, n, n0 = max(dc.batches), max(dc.memory_lengths), min(dc.memory_lengths)
    d0, d1 = dec["dense"], dec["mla_moe"]
    red = {k: 1 - d1["memory"][k]["total"] / d0["memory"][k]["total"] for k in (n0, n)}
    kv = 1 - d1["kv_bytes_per_token"] / d0["kv_bytes_per_token"]
    speed = {bb: d1["tokens_per_s"][bb] / d0["tokens_per_s"][bb] for bb in dc.batches}
    ppl0 = cells["dense/adam"]["perplexity"]
    ppl1, ppl_dm = cells["mla_moe/muon"]["perplexity"], cells["dense/muon"]["perplexity"]
    gain = 1 - ppl1 / ppl0
    claims += [
        CLAIMS["mla_moe_memory"].claim(
            ours=f"decoding memory {_less(red[n])} at {n} tokens ({_less(red[n0])} at {n0}); "
            f"KV cache {_less(kv)} per token", held=red[n] >= CLAIMS["mla_moe_memory"].threshold,
            batch=dc.memory_batch, n=n),
        CLAIMS["mla_moe_speed"].claim(
            ours=", ".join(f"{s:.2f}x at batch {bb}" for bb, s in speed.items()),
            held=speed[b] >= CLAIMS["mla_moe_speed"].threshold, batch=b),
        CLAIMS["mla_moe_muon_perplexity"].claim(
            ours=f"{gain:.1%} lower ({f(ppl1, 1)} vs {f(ppl0, 1)}; dense+Muon {f(ppl_dm, 1)})",
            held=gain >= CLAIMS["mla_moe_muon_perplexity"].threshold),
    ]  # fmt: skip
    parts = [f"muon_{r}" for r in cfg.partial]
    if len(parts) == 2 and all(f"mla_moe/{p}" in cells for p in parts):
        from experiments.ablation import gain_share

        l_none, l_all = (cells[f"mla_moe/{o}"]["final_val_loss"] for o in ("adam", "muon"))
        share = {p: gain_share(l_none, cells[f"mla_moe/{p}"]["final_val_loss"], l_all)
                 for p in parts}  # fmt: skip
        ok = all(math.isfinite(v) for v in share.values())
        claims.append(CLAIMS["experts_vs_attention"].claim(
            ours=", ".join(f"{p.removeprefix('muon_')} {f(v, 2)}" for p, v in share.items()),
            held=bool(share[parts[0]] > share[parts[1]]) if ok else None))  # fmt: skip
    return claims


EXPERIMENT = common.Experiment("arch", run, units=n_units, lr_from="tail_lm")
