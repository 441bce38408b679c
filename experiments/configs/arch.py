"""Config of ``experiments/arch.py``: dense / MLA / MoE / MLA+MoE decoders, AdamW vs Muon.

Launch::

    python -m experiments arch --scale quick --out runs/arch

tail_lm's decoder in four architectures of the same active size: dense; mla (latent
attention, queries not compressed); moe (routed plus shared experts whose active width is
the dense FFN's); mla_moe (both). Each is trained with AdamW and with Muon on the hidden
matrices (Adam on embeddings, head, norms and the router) at one learning rate per
optimizer, not tuned per architecture. Decoding is measured on the Muon runs' weights.
Frontier arms (docs/peers.md, "The 2026 frontier"): ``frontier.seeds = ()`` drops them.
Full scale: tail_lm's full model, experts of width 256.
"""

from __future__ import annotations

from ml_collections import ConfigDict

from experiments.configs import new_config
from experiments.configs.tail_lm import SEEDS, base_lm

ARCHITECTURES = ("dense", "mla", "moe", "mla_moe")


def get_config(scale: str = "quick") -> ConfigDict:
    """The arch experiment config; ``ValueError`` if ``scale`` is not one of ``SCALES``."""
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
