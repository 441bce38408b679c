"""``train(config, workdir)``: the training loop for both model families.

Run directory (``workdir``)
  config.json      the resolved config (after command-line overrides)
  metrics.jsonl    one JSON object per line, see below
  checkpoints/     Orbax steps: params, opt_state, step, rng, data position, config
  summary.json     the dict ``train`` returns

metrics.jsonl records. Every record has ``"kind"`` and ``"step"`` (optimizer
steps completed, int). In multi-seed runs (``config.seeds`` non-empty) every
numeric value below is a list with one entry per seed, in ``config.seeds`` order.

``kind == "train"`` (every ``config.log_every`` steps):
  loss            mean training loss of the step's batch, nats per token (LM) / per query (memory)
  lr              learning rate of ``optimizer.name`` at this step
  adam_lr         learning rate of the Adam part at this step
  grad_norm       global L2 norm of the gradient (before clipping)
  param_norm      global L2 norm of the parameters after the step
  update_rms/<role>   RMS of the parameter update (new - old) over all entries of that role
  ortho_error/<path>  orthogonality error of the Muon direction (amemory.optim.collect_diagnostics)
  tokens_per_s    training throughput since the previous train record (global tokens / wall second)
  step_time_s     mean wall seconds per step since the previous train record

``kind == "eval"`` (every ``config.eval_every`` steps and at the end):
  LM on a corpus:  loss (mean validation nats/token), loss/bucket_<b> for frequency bucket b
                   (0 = most frequent tokens), bucket_labels (token-count range of each bucket)
  biographies:     loss, fta/group_<g> first-token accuracy of group g, fta (all questions)
  memory:          loss (population loss, nats), acc (prior-weighted accuracy),
                   loss/head, loss/tail, acc/head, acc/tail, correct_prob/min, gap (Delta(W) of
                   papers.md A.2), per_class_loss and per_class_prob (lists of length K)

``kind == "spectrum"`` (every ``config.spectrum_every`` steps):
  spectrum/<role>/<metric>  isotropy metrics (amemory.analysis.spectrum.spectrum_metrics) of the
                   role's matrices, averaged over layers (and heads for "vo"); metrics: entropy,
                   effective_rank, top10_energy, q75_25, stable_rank, condition_number

``kind == "event"``: ``event`` in {"start", "resume", "checkpoint", "end"} with details.
"""

from __future__ import annotations

from typing import Any


def train(config: Any, workdir: str) -> dict:
    """Train ``config`` (an ``ml_collections.ConfigDict``) writing the run to ``workdir``.

    Returns a summary dict (also written to ``workdir/summary.json``).
    """
    raise NotImplementedError("amemory.train.train is being implemented (issue 6)")
