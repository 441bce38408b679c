"""Tokenizers for text corpora (:mod:`amemory.data.corpus`), trained with the ``tokenizers``
library on the training split only and cached under
``<corpus cache>/<kind>-<vocab_size>/tokenizer.json``:

* ``"bpe"``: byte-level BPE (GPT-2 style byte alphabet, so no unknown tokens);
  ``<|endoftext|>`` separates documents.
* ``"word"``: WordLevel over the ``Whitespace`` pre-tokenizer (``\\w+|[^\\w\\s]+``, case
  kept); the ``vocab_size - 2`` most frequent words get ids, the rest map to ``<unk>``
  (id 0): a heavier tail than BPE's, for tail studies.
"""

from __future__ import annotations

import numbers
import pathlib
import re
from collections.abc import Sequence

import numpy as np

from amemory import atomic
from amemory.data.sources import TextCorpus

EOT = "<|endoftext|>"
UNK = "<unk>"
TOKENIZER_KINDS = ("bpe", "word")


def _check_vocab_size(vocab_size, kind: str) -> int:
    lo = 512 if kind == "bpe" else 4
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, numbers.Integral):
        raise ValueError(f"vocab_size must be an integer >= {lo} for {kind!r}, got {vocab_size!r}")
    if not lo <= vocab_size <= 65535:
        raise ValueError(
            f"vocab_size must lie in [{lo}, 65535] for tokenizer {kind!r} "
            f"(byte-level BPE needs 256 bytes + merges; ids are stored as uint16), got {vocab_size}"
        )
    return int(vocab_size)


def _check_kind(kind) -> str:
    if kind not in TOKENIZER_KINDS:
        raise ValueError(f"tokenizer must be one of {TOKENIZER_KINDS}, got {kind!r}")
    return kind


#: Longer runs of non-space characters are cut into pieces for training only (BPE
#: training time grows with the square of a pre-token's length).
LONGEST_TRAINING_RUN = 1000


def _training_pieces(texts: Sequence[str]) -> list[str]:
    """``texts`` as the tokenizer trainer sees them: unchanged, except that runs of more
    than ``LONGEST_TRAINING_RUN`` non-space characters become separate pieces of that length."""
    n = LONGEST_TRAINING_RUN
    long_run = re.compile(rf"(\S{{{n + 1},}})")  # captured: split() keeps the runs
    out = []
    for text in texts:
        for i, piece in enumerate(long_run.split(text)):  # odd i: a long run
            out += [piece[j : j + n] for j in range(0, len(piece), n)] if i % 2 else [piece]
    return out


def _train_tokenizer(kind: str, vocab_size: int, texts: Sequence[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if kind == "bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[EOT],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    else:
        tok = Tokenizer(models.WordLevel(unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        trainer = trainers.WordLevelTrainer(
            vocab_size=vocab_size, special_tokens=[UNK, EOT], show_progress=False
        )
    tok.train_from_iterator(_training_pieces(texts), trainer=trainer)
    return tok


def get_tokenizer(kind: str, vocab_size: int, corpus: TextCorpus):
    """Train (once) or load the cached tokenizer of ``kind`` for a text corpus.

    Trained (deterministically) on ``corpus.train_texts`` only and cached at
    ``corpus.cache_dir / f"{kind}-{vocab_size}" / "tokenizer.json"``.

    Args:
      kind: ``"bpe"`` (byte-level BPE) or ``"word"`` (word level with ``<unk>``).
      vocab_size: requested size including special tokens, in [512, 65535] for BPE,
        [4, 65535] for words (a small corpus may yield fewer: ``get_vocab_size()``).
      corpus: a :class:`TextCorpus` from :func:`load_text_corpus`.

    Returns:
      A ``tokenizers.Tokenizer``; the special token ``<|endoftext|>`` is in its vocabulary.

    Raises:
      ValueError: naming ``tokenizer`` (kind) or ``vocab_size`` when invalid.
    """
    from tokenizers import Tokenizer

    kind = _check_kind(kind)
    vocab_size = _check_vocab_size(vocab_size, kind)
    path = pathlib.Path(corpus.cache_dir) / f"{kind}-{vocab_size}" / "tokenizer.json"
    if path.exists():
        return Tokenizer.from_file(str(path))
    tok = _train_tokenizer(kind, vocab_size, corpus.train_texts)
    atomic.write_bytes(path, tok.to_str().encode("utf-8"))
    return tok


def _encode_docs(tok, texts: Sequence[str], eot_id: int) -> np.ndarray:
    """Encode documents and join them, each followed by ``eot_id``; int32 [N]."""
    encoded = tok.encode_batch(list(texts), add_special_tokens=False)
    parts = [np.asarray([*enc.ids, eot_id], dtype=np.int32) for enc in encoded]
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)
