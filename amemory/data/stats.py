"""Token-frequency statistics: rank buckets (head to tail), Zipf exponent, corpus summary.

Used by the training loop (loss per frequency bucket) and by ``amemory data stats``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from amemory.data.frequencies import _check_int

if TYPE_CHECKING:
    from amemory.data.corpus import Corpus


def _check_counts(counts) -> np.ndarray:
    c = np.asarray(counts)
    if c.ndim != 1 or c.size == 0:
        raise ValueError(f"counts must be a non-empty 1-D array, got shape {c.shape}")
    if not np.issubdtype(c.dtype, np.number) or np.any(c < 0):
        raise ValueError("counts must be non-negative numbers")
    return c.astype(np.float64)


def frequency_buckets(counts, n_buckets: int = 6) -> tuple[np.ndarray, list[str]]:
    """Assign every vocabulary entry to a frequency-rank band, head to tail.

    Tokens are ranked by training count (rank 1 = most frequent, ties by smaller id). With
    S tokens of non-zero count, band b holds ranks (e_{b-1}, e_b] with log-spaced edges
    e_b = round(S^(b / n_buckets)), b = 1..n_buckets (duplicate edges merged). Tokens never
    seen in training get one extra last bucket ``"unseen"`` (only when such tokens exist).

    Args:
      counts: [V] non-negative training counts per token id.
      n_buckets: number of rank bands for the seen tokens, >= 1.

    Returns:
      (bucket_ids, labels): int32 [V] bucket per token id, one label per bucket
      (``"ranks 1-4"``, ``"unseen"``).

    Raises:
      ValueError: naming ``counts`` or ``n_buckets`` when invalid.
    """
    c = _check_counts(counts)
    n_buckets = _check_int("n_buckets", n_buckets, 1)
    V = c.size
    order = np.lexsort((np.arange(V), -c))  # by count descending, then id ascending
    S = int(np.count_nonzero(c))
    ids = np.empty(V, dtype=np.int32)
    labels: list[str] = []
    if S > 0:
        edges = sorted({max(1, int(round(S ** (b / n_buckets)))) for b in range(1, n_buckets + 1)})
        edges[-1] = S
        rank_bucket = np.searchsorted(np.asarray(edges), np.arange(1, S + 1), side="left")
        ids[order[:S]] = rank_bucket.astype(np.int32)
        labels = [f"ranks {lo + 1}-{e}" for lo, e in zip([0, *edges], edges, strict=False)]
    if S < V:
        ids[order[S:]] = len(labels)
        labels.append("unseen")
    return ids, labels


def zipf_exponent(counts, min_count: int = 1) -> float:
    """Fitted Zipf exponent s of counts ∝ rank^(-s).

    Least-squares slope of log(count) against log(rank) over the tokens with count >=
    ``min_count``, at about 20 log-spaced ranks per decade, so each decade weighs the same.

    Args:
      counts: [V] non-negative counts (order irrelevant).
      min_count: smallest count included, >= 1.

    Returns:
      s as a float (positive for a decaying spectrum); NaN when fewer than 3
      ranks qualify.

    Raises:
      ValueError: naming ``counts`` or ``min_count`` when invalid.
    """
    c = _check_counts(counts)
    min_count = _check_int("min_count", min_count, 1)
    srt = np.sort(c)[::-1]
    srt = srt[srt >= min_count]
    n = srt.size
    if n < 3:
        return float("nan")
    ranks = np.unique(np.round(np.logspace(0, np.log10(n), int(20 * np.log10(n)) + 2)).astype(int))
    ranks = ranks[(ranks >= 1) & (ranks <= n)]
    return float(-np.polyfit(np.log(ranks), np.log(srt[ranks - 1]), 1)[0])


def corpus_stats(corpus: Corpus, n_buckets: int = 6) -> dict:
    """Summary statistics of a prepared corpus (used by ``amemory data stats``).

    Returns:
      dict with ``name``, ``tokenizer``, ``vocab_size``, ``train_tokens``, ``val_tokens``,
      ``seen_types`` (ids seen in training), ``zipf_exponent`` (of the training counts),
      ``val_unseen_fraction`` (share of validation tokens unseen in training), and
      ``buckets``: rows ``{label, n_types, train_share}`` (share of training tokens).
    """
    ids, labels = frequency_buckets(corpus.counts, n_buckets)
    total = float(corpus.counts.sum())
    rows = [
        {"label": lab, "n_types": int(np.sum(ids == b)),
         "train_share": float(corpus.counts[ids == b].sum() / total) if total else 0.0}
        for b, lab in enumerate(labels)
    ]  # fmt: skip
    val = np.asarray(corpus.val_tokens)
    unseen = float(np.mean(corpus.counts[val] == 0)) if val.size else 0.0
    return {
        "name": corpus.name,
        "tokenizer": corpus.tokenizer_kind,
        "vocab_size": int(corpus.vocab_size),
        "train_tokens": int(len(corpus.train_tokens)),
        "val_tokens": int(len(corpus.val_tokens)),
        "train_docs": len(corpus.train_names),
        "val_docs": len(corpus.val_names),
        "seen_types": int(np.count_nonzero(corpus.counts)),
        "zipf_exponent": zipf_exponent(corpus.counts),
        "val_unseen_fraction": unseen,
        "buckets": rows,
    }
