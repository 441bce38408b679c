"""One-layer linear associative memory on a synthetic heavy-tailed prior.

Model (papers A and B, arXiv 2509.26030 / 2602.05725; docs/science.md): f_W(E_k) = softmax(Et^T W E_k), W_0 = 0, loss in
nats  L(W) = -sum_k p_k sum_i p(i|k) log f_W(E_k)_i.

Launch::

    amemory train --config experiments/configs/memory.py --workdir runs/mem_muon \
        --config.optimizer.name=muon --config.steps=50

Full scale: K = 999, the paper's Fig. 4 setting.
"""

from __future__ import annotations

from ml_collections import ConfigDict, config_dict

from experiments.configs import check_scale


def get_config(scale: str = "quick") -> ConfigDict:
    """The associative-memory run config; ``ValueError`` if ``scale`` is not one of ``SCALES``."""
    quick = check_scale(scale)
    c = ConfigDict()
    c.task = "memory"  # model family: "memory" (this file) | "lm" (lm.py)
    c.scale = scale  # "quick" | "full"

    # ---- model (amemory.models.memory) ------------------------------------------
    c.memory = ConfigDict()
    # number of classes / facts (coupled_rotation needs K % 3 == 0)
    c.memory.K = 99 if quick else 999
    # embedding dim (d_in = d_out); None = K (required by decoupled / coupled_rotation)
    c.memory.d = config_dict.placeholder(int)
    c.memory.embeddings = "decoupled"  # "decoupled" (E = Et = I) | "coupled_rotation" | "random_orthonormal" | "gaussian" | "coherent"
    c.memory.coherence = 0.0  # "coherent" only: pairwise key coherence in [0, 1)
    c.memory.embedding_seed = 0  # seed of random embeddings (kept fixed across training seeds)

    # ---- prior p_k and labels (amemory.data.frequencies, memory_tasks) -------------
    c.prior = ConfigDict()
    c.prior.kind = "two_level"  # "two_level" | "power_law" | "hierarchical"
    c.prior.alpha = 0.8  # two_level: total mass of the head
    c.prior.beta = 0.2  # two_level: head fraction L / K
    c.prior.exponent = 1.5  # power_law: p_k ~ k^-exponent; hierarchical: group mass ~ g^-exponent
    # hierarchical: number of groups M (K divisible by M; C = K / M)
    c.prior.groups = 33 if quick else 111
    # head/tail split for metrics when kind != two_level: top fraction of classes by p_k
    c.prior.head_fraction = 0.2
    c.noise = 0.0  # label noise: p(i|k) = (1 - noise) 1[i=k] + noise / K

    # ---- objective --------------------------------------------------------------
    # 0 = exact population loss (deterministic); > 0 = sampled (query, answer) pairs per step
    c.batch_size = 0

    # ---- optimizer (amemory.optim) -----------------------------------------------
    c.optimizer = ConfigDict()
    c.optimizer.name = "muon"  # "adam" or a name of amemory.optim.OPTIMIZERS (sgd, momentum 0 = GD)
    c.optimizer.muon_roles = "all"  # the memory has one matrix W; kept for schema parity with lm.py
    # learning rate eta of optimizer.name (Muon: W <- W - eta msgn(grad)); 0.1 keeps the
    # quick run's 50 Muon steps short of convergence. GD ("sgd") needs a step of order K
    # (its gradient entries are ~p_k, about 1/K), e.g. --config.optimizer.lr=20.
    c.optimizer.lr = 0.1
    c.optimizer.adam_lr = 0.05  # learning rate when name == "adam"
    c.optimizer.b1 = 0.9  # Adam beta1 (beta1 = beta2 = 0 makes Adam SignGD)
    c.optimizer.b2 = 0.95  # Adam beta2
    c.optimizer.eps = 1e-8  # Adam epsilon
    c.optimizer.momentum = 0.0  # Muon/SGD momentum; the theorems use none
    c.optimizer.nesterov = False  # Nesterov momentum (irrelevant when momentum = 0)
    c.optimizer.signum_beta = 0.9  # Signum momentum
    # Muon preset name or None; a preset sets momentum, nesterov, orthogonalizer,
    # ns_steps and shape_scale itself (those fields apply only when preset is None).
    c.optimizer.preset = config_dict.placeholder(str)
    c.optimizer.ns_steps = 5  # Newton-Schulz iterations
    # "polar" (exact msgn via SVD, as in the theorems) | "newton_schulz"
    c.optimizer.orthogonalizer = "polar"
    c.optimizer.shape_scale = "none"  # "none" keeps W <- W - eta msgn(G) exactly
    c.optimizer.weight_decay = 0.0  # decoupled weight decay
    c.optimizer.grad_clip = 0.0  # global-norm clip; 0 = off
    c.optimizer.diagnostics = True  # log orthogonality error of the Muon update

    # ---- schedule --------------------------------------------------------------------
    c.schedule = ConfigDict()
    c.schedule.name = "constant"  # "constant" | "cosine" | "linear" | "wsd"
    c.schedule.warmup_steps = 0  # linear warmup steps
    c.schedule.final_fraction = 0.1  # final multiplier (cosine / linear / wsd)
    c.schedule.decay_fraction = 0.2  # wsd decay fraction

    # ---- run -------------------------------------------------------------------------
    c.seed = 0  # sampling seed (and init seed; W_0 = 0 regardless)
    c.seeds = ()  # non-empty tuple -> vmapped multi-seed (differs only when batch_size > 0)
    c.steps = 50 if quick else 200  # optimizer steps
    c.log_every = 1  # train metrics every N steps
    c.eval_every = 5 if quick else 10  # per-class evaluation every N steps (and at the last)
    c.spectrum_every = 10 if quick else 50  # spectrum of W every N steps; 0 = off
    c.spectrum_roles = "all"  # the memory has one matrix
    c.checkpoint_every = 0  # 0 = only at the end
    c.keep_checkpoints = 2  # Orbax max_to_keep
    c.progress = True  # tqdm progress bar

    # ---- divergence guard (amemory.train.guard): stop a run that has blown up -------
    c.divergence = ConfigDict()
    c.divergence.enabled = True  # stop with exit status 3 when the test below fires
    # diverged: at `patience` consecutive train records the loss is above loss_factor x
    # its running minimum (and above its first value), or the gradient norm is exactly 0
    # while the loss is not
    c.divergence.loss_factor = 10.0
    c.divergence.patience = 3  # consecutive train records (every log_every steps)

    # ---- parallelism (same schema as lm.py; the memory is small, "single" is usual) --
    c.parallel = ConfigDict()
    c.parallel.mode = "single"  # "single" | "pmap" | "sharded"
    c.parallel.fsdp = 1  # sharded: "fsdp" mesh axis size
    c.parallel.distributed = False  # jax.distributed.initialize()
    c.parallel.coordinator_address = config_dict.placeholder(str)  # "host:port" or None
    c.parallel.num_processes = config_dict.placeholder(int)  # None = auto
    c.parallel.process_id = config_dict.placeholder(int)  # None = auto
    c.parallel.cpu_collectives = "gloo"  # "gloo" | "mpi"
    return c
