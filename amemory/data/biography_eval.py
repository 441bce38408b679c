"""First-token accuracy (FTA) of a language model on the biography QA (paper A, A.3).

Source: Wang et al. 2025, "Muon Outperforms Adam in Tail-End Associative Memory
Learning" (arXiv 2509.26030), heavy-tailed knowledge QA, on the
:class:`amemory.data.biographies.EvalSet`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from amemory.data.frequencies import _check_int

if TYPE_CHECKING:
    from amemory.data.biographies import EvalSet


def first_token_predictions(
    logits_fn: Callable, eval_set: EvalSet, *, batch_size: int = 256, seq_len: int | None = None
) -> np.ndarray:
    """Argmax next-token predictions at the end of every eval prompt.

    Args:
      logits_fn: tokens int32 [B, L] -> logits [B, L, V] (numpy or jax), called with a
        fixed B = ``batch_size`` and L = ``seq_len`` so a jitted function compiles once
        (the last batch repeats row 0); the right padding does not affect causal logits
        at position prompt_len - 1.
      eval_set: an :class:`EvalSet`.
      batch_size: rows per call, >= 1.
      seq_len: L, the width passed to ``logits_fn`` (default: the prompt width P);
        must be >= P.

    Returns:
      int64 [Q] predicted token ids.

    Raises:
      ValueError: naming ``batch_size``, ``seq_len`` or the logits shape when invalid.
    """
    _check_int("batch_size", batch_size, 1)
    Q, P = eval_set.prompts.shape
    L = P if seq_len is None else int(seq_len)
    if L < P:
        raise ValueError(f"seq_len={L} is shorter than the longest prompt ({P} tokens)")
    tokens = np.pad(np.asarray(eval_set.prompts, np.int32), ((0, 0), (0, L - P)))  # pad id 0
    preds = np.empty(Q, dtype=np.int64)
    for start in range(0, Q, batch_size):
        idx = np.arange(start, min(start + batch_size, Q))
        batch = tokens[np.r_[idx, np.full(batch_size - idx.size, idx[0])]]  # [batch_size, L]
        logits = np.asarray(logits_fn(batch))
        if logits.ndim != 3 or logits.shape[:2] != (batch_size, L):
            raise ValueError(
                f"logits_fn must return [B, L, V] = [{batch_size}, {L}, V], got {logits.shape}"
            )
        pos = eval_set.prompt_len[idx] - 1
        preds[idx] = np.argmax(logits[np.arange(idx.size), pos], axis=-1)
    return preds


def first_token_accuracy(
    model, eval_set: EvalSet, *, batch_size: int = 256, seq_len: int | None = None
) -> dict[int, float]:
    """First-token accuracy (FTA) per group g (paper A, heavy-tailed knowledge QA).

    An item scores 1 when the argmax after ``<bos> question ? Answer:`` is the first
    answer token; a group's FTA is the mean over its items.

    Args:
      model: either a callable ``logits_fn(tokens [B, L]) -> [B, L, V]`` (see
        :func:`first_token_predictions`) or an int array [Q] of predictions.
      eval_set: an :class:`EvalSet` (possibly a subset).
      batch_size, seq_len: passed to :func:`first_token_predictions`.

    Returns:
      dict group g -> accuracy in [0, 1], for the groups in ``eval_set``.

    Raises:
      ValueError: naming ``model`` when predictions have the wrong shape.
    """
    if callable(model):
        preds = first_token_predictions(model, eval_set, batch_size=batch_size, seq_len=seq_len)
    else:
        preds = np.asarray(model)
        if preds.shape != eval_set.answer_first.shape:
            raise ValueError(
                f"model predictions must have shape {eval_set.answer_first.shape}, "
                f"got {preds.shape}"
            )
    hit = preds == eval_set.answer_first
    return {int(g): float(hit[eval_set.group == g].mean()) for g in np.unique(eval_set.group)}
