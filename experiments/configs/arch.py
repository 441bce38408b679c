"""Config of ``experiments/arch.py``: dense / MLA / MoE / MLA+MoE decoders, AdamW vs Muon.

Launch::

    python -m experiments arch --scale quick --out runs/arch

Quick scale (CPU): tail_lm's quick decoder (d=128, 2 layers, 4 heads of 32, FFN 512,
512-token BPE on Shakespeare, batch 16 x 64, 300 steps), in four architectures of the
same active size:

* dense: multi-head attention, GELU FFN of width 512;
* mla: multi-head latent attention with d_c = 64 (2 head widths) and d_R = 16 (half a
  head), queries not compressed: 67,584 attention parameters per layer against MHA's
  65,536; KV cache 80 numbers per token and layer against 256;
* moe: 8 routed experts of width 128, top-2, plus 2 shared experts of width 128 (active
  FFN width 4 x 128 = 512, the dense width; 2.5x the dense FFN's total parameters),
  capacity factor 1.25 in training (dropless when decoding), balance coefficient 0.01;
* mla_moe: both.

Each is trained with AdamW on everything and with Muon on the hidden matrices (Adam on
embeddings, head, norms and the router), at one learning rate per optimizer (``lr``: the
middle of tail_lm's grids; ``amemory reproduce`` uses tail_lm's chosen values), not tuned
per architecture. MLA+MoE is also trained with Muon on the experts only (``ffn``) and on
attention only (``qk+vo``). Decoding is measured on the Muon runs' weights: tokens/s of
greedy generation at batch 1 and 8 (``decode.speed_length`` tokens, medians of
``decode.reps`` interleaved repetitions) and XLA's buffer assignment of the whole decode
program at batch 8 for each of ``decode.memory_lengths``.

Frontier arms (``frontier``; docs/peers.md, "The 2026 frontier"): dense and MLA with
Muon variants, each on the 3 held-out initialisation seeds of tail_lm trained together:
whole-matrix Muon, Muon + weight decay ``frontier.weight_decay``, per-head Muon, MuonH
(Hyperball; angular step ``lr.muon / (init_std sqrt(d_model))``, the relative step Muon
takes on a d x d matrix at initialisation) and QK-Clip with ``tau`` =
``frontier.clip_fraction`` x the whole-matrix run's peak max logit (so that it acts).
``frontier.seeds = ()`` drops them.

Full scale: the ``small`` preset (d=256, 4 layers, 8 heads of 32, FFN 1024, 8192-token
BPE, batch 32 x 128, 5000 steps), experts of width 256.
"""

from __future__ import annotations

from ml_collections import ConfigDict

from experiments.configs import new_config
from experiments.configs.tail_lm import SEEDS, base_lm

ARCHITECTURES = ("dense", "mla", "moe", "mla_moe")


def get_config(scale: str = "quick") -> ConfigDict:
    """Return the arch experiment config.

    Raises:
      ValueError: if ``scale`` is not one of ``SCALES``.
    """
    c, quick = new_config(scale)
    c.base = base_lm(scale)  # the dense decoder, shared with tail_lm (same cached runs)
    c.architectures = ARCHITECTURES  # any subset, in this order; "dense" is the baseline
    c.mla = ConfigDict()  # model.mla.* of the MLA architectures
    c.mla.kv_rank = 64  # d_c = 2 head widths (head width 32 at both scales)
    c.mla.rope_dim = 16  # d_R = half a head width (DeepSeek-V2's ratio)
    c.mla.q_rank = 0  # queries not compressed (DeepSeek-V2-Lite)
    c.moe = ConfigDict()  # model.moe.* of the MoE architectures
    c.moe.experts = 8
    c.moe.top_k = 2
    c.moe.shared = 2
    c.moe.d_expert = 128 if quick else 256  # top_k + shared experts = the dense FFN width
    c.moe.capacity_factor = 1.25
    c.moe.lb_coef = 0.01
    # Muon on these role groups of MLA+MoE (Adam elsewhere): experts only, attention only.
    c.partial = ("ffn", "qk+vo")
    c.lr = ConfigDict()  # one learning rate per optimizer for every architecture
    c.lr.adam = 3e-3
    c.lr.muon = 0.02
    c.lr_source = "config defaults, the middle of tail_lm's grids"  # stated in the report
    c.frontier = ConfigDict()
    c.frontier.seeds = SEEDS  # held-out initialisation seeds of the frontier arms
    c.frontier.weight_decay = 0.1  # Muon + WD, Hyperball's baseline (Moonlight's 0.1)
    c.frontier.clip_fraction = 0.5  # QK-Clip tau as a fraction of Muon's peak max logit
    c.frontier.margin = 0.01  # nats: "at least as good" / "no loss cost" tolerance
    c.decode = ConfigDict()
    c.decode.prompt_len = 16  # prompt tokens (from the validation split)
    c.decode.speed_length = 256  # prompt + generated tokens in the speed measurement
    c.decode.batches = (1, 8)  # batch sizes of the speed measurement
    c.decode.reps = 5  # timed repetitions per (architecture, batch), interleaved
    c.decode.memory_batch = 8
    # Total decoded lengths of the memory measurement: the training context and a long one.
    c.decode.memory_lengths = (64, 1024) if quick else (128, 4096)
    return c
