"""Tests for `amemory data` (amemory.data.cli) on a fixture corpus written by the test."""

import json

import numpy as np

from amemory.data import cli


def _write_corpus(d):
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(200)]
    p = 1.0 / np.arange(1, 201)
    p /= p.sum()
    for k in range(4):
        lines = [" ".join(rng.choice(words, 8, p=p)) for _ in range(200)]
        (d / f"part{k}.txt").write_text("\n".join(lines) + "\n")


def test_prepare_and_stats(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AMEMORY_DATA", str(tmp_path / "cache"))
    src = tmp_path / "src"
    src.mkdir()
    _write_corpus(src)
    assert cli.main(["prepare", str(src), "--tokenizer", "word", "--vocab-size", "150"]) == 0
    assert "prepared" in capsys.readouterr().out
    assert cli.main(["stats", str(src), "--tokenizer", "word", "--vocab-size", "150"]) == 0
    out = capsys.readouterr().out
    assert "Zipf exponent" in out and "ranks 1-" in out
    assert (
        cli.main(["stats", str(src), "--tokenizer", "word", "--vocab-size", "150", "--json"]) == 0
    )
    stats = json.loads(capsys.readouterr().out)
    assert stats["vocab_size"] == 150
    assert abs(sum(r["train_share"] for r in stats["buckets"]) - 1.0) < 1e-9
    assert 0.3 < stats["zipf_exponent"] < 2.0


def test_biographies_stats_and_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AMEMORY_DATA", str(tmp_path / "cache"))
    assert cli.main(["stats", "biographies", "--m", "3", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert [g["individuals"] for g in stats["groups"]] == [1, 1, 2, 4]
    assert [g["selections_each"] for g in stats["groups"]] == [8, 4, 2, 1]
    assert cli.main(["stats", str(tmp_path / "missing.txt")]) == 2
    err = capsys.readouterr().err
    assert "not found" in err and err.count("\n") == 1
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe\x00abc")
    assert cli.main(["stats", str(bad)]) == 2
    assert "not UTF-8" in capsys.readouterr().err
