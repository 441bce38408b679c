"""Shared helpers of the tests/test_train_*.py files: a tiny corpus and tiny run configs."""

from __future__ import annotations

import pathlib

import numpy as np

from amemory.train.config import load_config

REPO = pathlib.Path(__file__).resolve().parents[1]
LM_CONFIG = str(REPO / "experiments" / "configs" / "lm.py")
MEMORY_CONFIG = str(REPO / "experiments" / "configs" / "memory.py")


def write_corpus(directory: pathlib.Path, n_words: int = 6000, seed: int = 0) -> pathlib.Path:
    """A Zipf-distributed word text (60 word types, lines of 12 words) in one file."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(60)]
    p = 1.0 / np.arange(1, 61) ** 1.1
    idx = rng.choice(60, size=n_words, p=p / p.sum())
    lines = [" ".join(words[j] for j in idx[i : i + 12]) for i in range(0, n_words, 12)]
    path = directory / "tiny.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def lm_overrides(corpus: pathlib.Path, **extra) -> list[str]:
    """Overrides for a tiny transformer (tiny preset) on ``corpus``, 5 steps, batch 8 x 16."""
    base = {
        "data.corpus": str(corpus),
        "data.tokenizer": "word",
        "data.vocab_size": 48,
        "data.seq_len": 16,
        "data.batch_size": 8,
        "data.eval_batches": 1,
        "data.n_buckets": 3,
        "model.preset": "tiny",
        "model.d_model": "None",
        "model.n_layers": "None",
        "model.n_heads": "None",
        "model.d_ff": "None",
        "schedule.warmup_steps": 0,
        "steps": 5,
        "log_every": 1,
        "eval_every": 5,
        "spectrum_every": 5,
        "checkpoint_every": 0,
        "progress": "false",
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def lm_config(corpus: pathlib.Path, **extra):
    """ConfigDict for the tiny transformer run (unlocked copy is made by train)."""
    return load_config(LM_CONFIG + ":full", lm_overrides(corpus, **extra))


def memory_config(**extra):
    """ConfigDict for a small associative-memory run."""
    base = {"memory.K": 12, "steps": 5, "eval_every": 5, "spectrum_every": 5, "progress": "false"}
    base.update(extra)
    return load_config(MEMORY_CONFIG, [f"{k}={v}" for k, v in base.items()])


def max_rel_diff(a, b) -> float:
    """max over leaves of max|a - b| / max(max|b|, 1e-3); leaves matched by dotted name."""
    from amemory.train.checkpoint import leaf_names

    na, nb = leaf_names(a), leaf_names(b)
    assert set(na) == set(nb), sorted(set(na) ^ set(nb))
    out = 0.0
    for k, y in nb.items():
        x, y = np.asarray(na[k], np.float64), np.asarray(y, np.float64)
        out = max(
            out,
            float(np.max(np.abs(x - y), initial=0.0) / max(np.max(np.abs(y), initial=0.0), 1e-3)),
        )
    return out
