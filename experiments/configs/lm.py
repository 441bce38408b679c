"""Transformer language model on a real corpus or on synthetic biographies.

Launch::

    amemory train --config experiments/configs/lm.py --workdir runs/lm_muon \
        --config.optimizer.name=muon --config.steps=2000

Quick scale (default): Shakespeare with a 2048-token BPE, the ``small`` preset shrunk to
d=128 and 2 layers (0.92M parameters), batch 16x128, 500 steps (CPU minutes). Full scale:
``--config experiments/configs/lm.py:full`` (``small`` preset, 8192-token BPE, batch
32x128, 5000 steps).
Biographies (heavy-tailed knowledge QA, paper A, arXiv 2509.26030)::

    amemory train --config experiments/configs/lm.py --workdir runs/bio \
        --config.data.kind=biographies --config.optimizer.name=muon

Any field can be overridden with ``--config.a.b=value``; an unknown field or a
value outside the allowed set fails before any compilation.
"""

from __future__ import annotations

from ml_collections import ConfigDict, config_dict

from experiments.configs import check_scale


def _int_or_none(value: int | None) -> config_dict.FieldReference:
    """An int field that may also be None (None = keep the preset's value)."""
    return config_dict.FieldReference(value, field_type=int)


def get_config(scale: str = "quick") -> ConfigDict:
    """Return the language-model run config.

    Args:
      scale: ``"quick"`` (the ``small`` preset shrunk to d=128, 2 layers; CPU minutes)
        or ``"full"`` (``small`` preset, CPU hours / GPU minutes).

    Raises:
      ValueError: if ``scale`` is not one of ``SCALES``.
    """
    quick = check_scale(scale)
    c = ConfigDict()
    c.task = "lm"  # model family: "lm" (transformer) | "memory" (see memory.py)
    c.scale = scale  # recorded for reports; "quick" | "full"

    # ---- data -----------------------------------------------------------------
    c.data = ConfigDict()
    c.data.kind = "corpus"  # "corpus" (real text, next-token LM) | "biographies" (synthetic QA)
    # corpus name known to amemory.data.corpus, or a path / glob of .txt files
    c.data.corpus = "shakespeare"
    c.data.tokenizer = "bpe"  # "bpe" (byte-level BPE, tokenizers) | "word"
    c.data.vocab_size = 2048 if quick else 8192  # tokenizer vocabulary size (corpus only)
    c.data.seq_len = 128  # tokens per training sequence T (model sees T, predicts T next tokens)
    # GLOBAL sequences per step (split over devices / hosts)
    c.data.batch_size = 16 if quick else 32
    c.data.n_buckets = 5  # token-frequency buckets for the per-bucket eval loss (LM on corpus)
    c.data.eval_batches = 4  # validation batches per evaluation (each data.batch_size x seq_len)
    c.data.biographies = ConfigDict()
    # groups g = 0..m, N_g = 2^(g-1) people, S_g = 2^(m-g) selections
    c.data.biographies.m = 8 if quick else 15
    # seed of the synthetic population (independent of the training seed)
    c.data.biographies.seed = 0
    # FTA evaluation: at most this many QA items per group (6 questions per person)
    c.data.biographies.eval_per_group = 384 if quick else 1200

    # ---- model (amemory.models.transformer) -----------------------------------
    c.model = ConfigDict()
    c.model.preset = "small"  # "tiny" | "small" | "gpt2-small" | "nanogpt-160m"
    # Overrides of the preset; None keeps the preset's value. max_len comes from the data
    # (data.seq_len), vocab_size by default too (the tokenizer's size; a larger one plans or
    # pads a model at another vocabulary: GPT-2's 50257, nanoGPT's 50304). The quick
    # scale shrinks "small" to d=128, 2 layers (~0.1 s per 16x128 step on 2 CPU cores).
    c.model.vocab_size = _int_or_none(None)
    c.model.d_model = _int_or_none(128 if quick else None)  # residual width
    c.model.n_layers = _int_or_none(2 if quick else None)  # number of decoder blocks
    c.model.n_heads = _int_or_none(4 if quick else None)  # heads (d_model divisible by it)
    c.model.n_kv_heads = _int_or_none(None)  # K/V heads: 1 = MQA, a divisor of n_heads = GQA
    c.model.d_ff = _int_or_none(512 if quick else None)  # FFN hidden width
    c.model.ffn = config_dict.placeholder(str)  # "gelu" (non-gated) | "swiglu" (gated)
    c.model.norm = config_dict.placeholder(str)  # "layernorm" | "rmsnorm"
    c.model.position = config_dict.placeholder(str)  # "rope" | "learned"
    c.model.qk_norm = config_dict.placeholder(bool)  # normalise q and k per head
    c.model.tied_head = config_dict.placeholder(bool)  # LM head = embedding transpose
    c.model.dropout = 0.0  # dropout rate in the blocks (the papers use 0)
    c.model.remat = False  # rematerialise blocks to save activation memory
    c.model.dtype = "float32"  # compute dtype: "float32" | "bfloat16"
    c.model.param_dtype = "float32"  # parameter dtype: "float32" | "bfloat16"
    # Attention: "mha" (q, k, v, o) | "mla" (multi-head latent attention, DeepSeek-V2,
    # arXiv 2405.04434: keys/values from a cached low-rank latent + a decoupled RoPE key).
    c.model.attention = "mha"
    c.model.mla = ConfigDict()  # MLA widths (attention="mla"); heads keep d_model / n_heads
    c.model.mla.kv_rank = _int_or_none(None)  # d_c, latent width; None = 4 x head dim
    c.model.mla.rope_dim = _int_or_none(
        None
    )  # d_R, RoPE key/query width (even); None = head dim / 2
    c.model.mla.q_rank = 0  # d_c', query latent width; 0 = queries not compressed
    # Mixture of experts in every block (DeepSeekMoE: routed top-k + shared experts).
    c.model.moe = ConfigDict()
    c.model.moe.experts = 0  # E routed experts; 0 = dense FFN (no MoE)
    c.model.moe.top_k = 2  # routed experts per token (token-choice top-k, <= experts)
    c.model.moe.shared = 0  # shared experts, always on
    c.model.moe.d_expert = _int_or_none(None)  # hidden width of each expert; None = d_ff
    # expert capacity per sequence = ceil(capacity_factor * T * top_k / experts); 0 = dropless
    c.model.moe.capacity_factor = 0.0
    c.model.moe.lb_coef = 0.01  # load-balancing loss coefficient (Switch Transformer's 0.01)

    # ---- optimizer (amemory.optim; resolved in amemory.train.optimizers) ---------
    c.optimizer = ConfigDict()
    c.optimizer.name = "muon"  # "adam" or a name of amemory.optim.OPTIMIZERS
    # Roles given to optimizer.name; every other parameter (embed, head, norm,
    # bias, router, and unlisted matrices) is trained by Adam. Roles/groups: q k v o
    # w_in w_gate w_out embed head norm bias (MLA: q_down q_up q_rope kv_down k_up v_up
    # k_rope; MoE: router expert_w_in/gate/out shared_w_in/gate/out), qk vo ffn hidden;
    # join with "+" ("vo+ffn"); "all" = every parameter; "none" = all Adam. Ignored for
    # "adam". The MoE router is in no group (Adam unless named).
    c.optimizer.muon_roles = "hidden"
    # peak learning rate of optimizer.name on its roles; None = that optimizer's default
    # (amemory.optim.OPTIMIZERS[name].default_lr)
    c.optimizer.lr = config_dict.placeholder(float)
    # peak learning rate of Adam (the "rest" roles, or everything for "adam")
    c.optimizer.adam_lr = 3e-3
    c.optimizer.b1 = 0.9  # Adam beta1 (paper A, arXiv 2509.26030, uses 0.8)
    c.optimizer.b2 = 0.95  # Adam beta2
    c.optimizer.eps = 1e-8  # Adam epsilon
    c.optimizer.momentum = 0.95  # Muon-family momentum mu; SGD heavy-ball momentum (0 = plain GD)
    c.optimizer.nesterov = True  # Nesterov momentum for the Muon family and SGD
    c.optimizer.signum_beta = 0.9  # Signum momentum (EMA) before the sign
    # Muon preset: None | "jordan" | "moonlight" | "torch" | "optax" | "wang2025". A preset
    # sets momentum, nesterov, orthogonalizer, ns_steps and shape_scale as its peer does
    # (the fields below apply only when preset is None).
    c.optimizer.preset = config_dict.placeholder(str)
    c.optimizer.ns_steps = 5  # Newton-Schulz iterations
    c.optimizer.orthogonalizer = "newton_schulz"  # "newton_schulz" | "polar" (exact SVD)
    # Muon update scale: "jordan" | "none" | "rms_match" | "spectral"
    c.optimizer.shape_scale = "jordan"
    c.optimizer.weight_decay = 0.0  # weight decay of optimizer.name's matrices (papers use 0)
    c.optimizer.grad_clip = 0.0  # clip gradients to this global L2 norm first; 0 = off
    # Muon on attention kernels head by head (Kimi K3 / GLM-5's Muon Split; a matrix view:
    # amemory.models.matrices.per_head_axes); also MuonH's radius is then per head
    c.optimizer.per_head = False
    c.optimizer.per_head_roles = "all"  # with per_head: these roles only, e.g. "qk" or "q+k+v"
    # QK-Clip threshold tau on the max pre-softmax logit per head (Kimi K2: 100); 0 = off
    c.optimizer.qk_clip = 0.0
    # log orthogonality error of the Muon update (amemory.optim diagnostics)
    c.optimizer.diagnostics = True

    # ---- schedule: one multiplier in [0, 1] applied to both learning rates -------
    c.schedule = ConfigDict()
    c.schedule.name = "cosine"  # "constant" | "cosine" | "linear" | "wsd" (warmup-stable-decay)
    c.schedule.warmup_steps = 50 if quick else 200  # linear warmup from 0
    c.schedule.final_fraction = 0.1  # multiplier at the last step (cosine / linear / wsd)
    c.schedule.decay_fraction = 0.2  # wsd: fraction of steps spent decaying at the end

    # ---- run -----------------------------------------------------------------------
    c.seed = 0  # init / dropout seed; data order uses it too
    c.seeds = ()  # non-empty tuple, e.g. (0, 1, 2) -> vmapped multi-seed in one program (overrides seed for init)
    c.steps = 500 if quick else 5000  # optimizer steps
    c.log_every = 10  # train metrics record every N steps
    c.eval_every = 100 if quick else 500  # evaluation every N steps (and at the last step)
    c.spectrum_every = 100 if quick else 500  # spectrum metrics every N steps; 0 = off
    c.spectrum_roles = "vo+ffn"  # roles whose spectra are logged (groups as in muon_roles; "vo" = per-head W_o W_v)
    # checkpoint every N steps (and at the end); 0 = only at the end
    c.checkpoint_every = 250 if quick else 1000
    c.keep_checkpoints = 3  # Orbax max_to_keep
    c.progress = True  # tqdm progress bar (process 0, stderr)

    # ---- divergence guard (amemory.train.guard): stop a run that has blown up -------
    c.divergence = ConfigDict()
    c.divergence.enabled = True  # stop with exit status 3 when the test below fires
    # diverged: at `patience` consecutive train records the loss is above loss_factor x
    # its running minimum (and above its first value), or the gradient norm is exactly 0
    # while the loss is not
    c.divergence.loss_factor = 10.0
    c.divergence.patience = 3  # consecutive train records (every log_every steps)

    # ---- parallelism ------------------------------------------------------------
    c.parallel = ConfigDict()
    c.parallel.mode = "single"  # "single" | "pmap" (data parallel, pmean grads) | "sharded" (jit over Mesh("data","fsdp"))
    # sharded: size of the "fsdp" mesh axis (the "data" axis gets the remaining devices)
    c.parallel.fsdp = 1
    c.parallel.distributed = False  # call jax.distributed.initialize() (multi-host / multi-process)
    c.parallel.coordinator_address = config_dict.placeholder(
        str
    )  # "host:port"; None = auto-detect (SLURM, TPU, ...)
    c.parallel.num_processes = config_dict.placeholder(int)  # None = auto-detect
    c.parallel.process_id = config_dict.placeholder(int)  # None = auto-detect
    c.parallel.cpu_collectives = "gloo"  # CPU-only multi-process collectives: "gloo" | "mpi"
    return c
