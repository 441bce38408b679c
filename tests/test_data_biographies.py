"""Tests for amemory.data.biographies (paper A, A.3 heavy-tailed knowledge QA).

The group structure is checked against 2^(g-1) / 2^(m-g) counted directly from
the rows; FTA is checked against a memorising oracle built from the TRAINING rows
(a prefix -> next-token table), which is independent of how the eval set is built.
"""

import chex
import numpy as np
import pytest

from amemory.data import biographies as bio
from amemory.data.biography_eval import first_token_accuracy


@pytest.fixture(scope="module")
def data():
    return bio.make_biographies(bio.BiographyConfig(m=6, seed=3))


def test_reproducible_from_seed(data):
    again = bio.make_biographies(bio.BiographyConfig(m=6, seed=3))
    np.testing.assert_array_equal(again.train_tokens, data.train_tokens)
    np.testing.assert_array_equal(again.train_mask, data.train_mask)
    np.testing.assert_array_equal(again.eval.prompts, data.eval.prompts)
    assert again.tokenizer.keys == data.tokenizer.keys
    other = bio.make_biographies(bio.BiographyConfig(m=6, seed=4))
    assert other.tokenizer.keys != data.tokenizer.keys


def test_group_sizes_and_repetitions(data):
    m = 6
    assert bio.group_sizes(m).tolist() == [1, 1, 2, 4, 8, 16, 32]
    assert bio.group_repetitions(m).tolist() == [64, 32, 16, 8, 4, 2, 1]
    n_people = 2**m
    counts_per_group = np.bincount(data.group, minlength=m + 1)
    assert counts_per_group.tolist() == [1] + [2 ** (g - 1) for g in range(1, m + 1)]
    # Every individual of group g appears in exactly 2^(m-g) bio rows and QA rows.
    for kind in (0, 1):
        rows_per_person = np.bincount(
            data.train_person[data.train_kind == kind], minlength=n_people
        )
        expect = np.array([2 ** (m - g) for g in data.group])
        np.testing.assert_array_equal(rows_per_person, expect)
    n_sel = 2**m + m * 2 ** (m - 1)
    assert data.train_tokens.shape[0] == 2 * n_sel
    # Each QA row holds 6 answers (6 maximal runs of mask = 1), each ending in <eos>.
    eos = data.tokenizer.eos_id
    for i in np.flatnonzero(data.train_kind == 1)[:50]:
        m_row = data.train_mask[i]
        starts = np.flatnonzero(np.diff(np.concatenate([[0], m_row])) == 1)
        ends = np.flatnonzero(np.diff(np.concatenate([m_row, [0]])) == -1)
        assert starts.size == 6
        assert np.all(data.train_tokens[i, ends] == eos)


def test_shapes_mask_and_tokenizer(data):
    N, T = data.train_tokens.shape
    chex.assert_shape(data.train_mask, (N, T))
    assert data.train_tokens.dtype == np.int32 and data.train_mask.dtype == np.float32
    assert np.all(data.train_mask[:, 0] == 0)
    assert np.all(data.train_tokens[:, 0] == data.tokenizer.bos_id)
    assert np.all(data.train_mask[data.train_tokens == data.pad_id] == 0)
    assert data.train_tokens.max() < data.vocab_size
    # 7 attributes, unique names
    assert set(data.attributes) == set(bio.ATTRIBUTES) and len(bio.QUESTION_TEMPLATES) == 6
    names = {tuple(x) for x in data.attributes["name"]}
    assert len(names) == 2**6
    # exact tokenizer: keys <-> ids round trip
    tok = data.tokenizer
    keys = tok.keys[3:40]
    assert [tok.keys[tok.index[k]] for k in keys] == keys
    # eval covers all individuals x 6 templates
    ev = data.eval
    assert ev.prompts.shape[0] == 6 * 2**6
    assert np.all(np.bincount(ev.person) == 6)
    assert np.all(
        ev.prompts[np.arange(len(ev.prompt_len)), ev.prompt_len - 1] == tok.index["w:Answer:"]
    )


def _oracle_from_training(data):
    """Prefix-of-a-QA-pair -> answer table, from training rows only."""
    table = {}
    eos, bos = data.tokenizer.eos_id, data.tokenizer.bos_id
    for row, mask, kind in zip(data.train_tokens, data.train_mask, data.train_kind, strict=True):
        if kind != 1:
            continue
        q_start = 1
        for t in range(1, row.size):
            if mask[t] == 1 and mask[t - 1] == 0:  # first answer token
                table[(bos,) + tuple(row[q_start:t].tolist())] = int(row[t])
            if row[t] == eos:
                q_start = t + 1
    return table


def test_fta_with_training_oracle(data):
    table = _oracle_from_training(data)
    V = data.vocab_size
    ev = data.eval

    def make_logits_fn(forget_groups):
        def logits_fn(tokens):
            out = np.zeros(tokens.shape + (V,), np.float32)
            for b, row in enumerate(tokens):
                for t in range(row.size):
                    key = tuple(row[: t + 1].tolist())
                    if key in table:
                        person_group = None
                        for i in np.flatnonzero(ev.prompt_len == t + 1):
                            if tuple(ev.prompts[i, : t + 1].tolist()) == key:
                                person_group = ev.group[i]
                                break
                        target = table[key]
                        if person_group in forget_groups:
                            target = (target + 1) % V
                        out[b, t, target] = 1.0
            return out

        return logits_fn

    sub = ev.per_group(12, seed=0)
    acc = first_token_accuracy(make_logits_fn(set()), sub, batch_size=16, seq_len=20)
    assert acc == {g: 1.0 for g in range(7)}
    acc = first_token_accuracy(make_logits_fn({5, 6}), sub, batch_size=16)
    assert acc == {g: (0.0 if g in (5, 6) else 1.0) for g in range(7)}
    # prediction arrays: reference FTA by a plain loop
    rng = np.random.default_rng(0)
    preds = np.where(rng.random(ev.answer_first.size) < 0.5, ev.answer_first, 0)
    got = first_token_accuracy(preds, ev)
    for g in range(7):
        items = [i for i in range(ev.group.size) if ev.group[i] == g]
        assert got[g] == pytest.approx(
            sum(preds[i] == ev.answer_first[i] for i in items) / len(items)
        )
    with pytest.raises(ValueError, match="model predictions"):
        first_token_accuracy(preds[:-1], ev)
    with pytest.raises(ValueError, match="logits_fn must return"):
        first_token_accuracy(lambda x: np.zeros((1, 1, V)), sub)


@pytest.mark.parametrize(
    "kw,name",
    [
        ({"m": -1}, "m"),
        ({"m": 2.5}, "m"),
        ({"seed": -3}, "seed"),
        ({"n_majors": 0}, "n_majors"),
        ({"n_first_names": 2, "n_surnames": 2, "m": 3}, "n_first_names"),
        ({"biographies": False, "qa": False}, "biographies"),
    ],
)
def test_bad_config(kw, name):
    with pytest.raises(ValueError, match=name):
        bio.make_biographies(bio.BiographyConfig(**kw))


def test_qa_only_and_m0():
    d = bio.make_biographies(bio.BiographyConfig(m=0, biographies=False))
    assert d.train_tokens.shape[0] == 1 and d.eval.prompts.shape[0] == 6
    assert np.all(d.train_kind == 1)
