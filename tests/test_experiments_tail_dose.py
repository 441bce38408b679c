"""tail_dose: scores per part against a by-hand reading of the records, and one tiny QA-leg run
whose leads, slope interval and verdicts are recomputed independently."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from amemory.data import biographies as B
from experiments import tail_dose


def test_scores_read_the_records_by_hand():
    fta = [[0.5, 1.0], [0.25, 0.0], [0.0, 0.5]]  # groups 0..2 (m = 2), 2 seeds
    qa = {"records": [{"kind": "eval", "step": 5, **{f"fta/group_{g}": fta[g] for g in range(3)}}]}
    steps, s = tail_dose.scores("qa", qa, 2)
    # all: people weigh the same (1, 1, 2 people); head: groups 0..1; tail: group 2
    np.testing.assert_allclose(s["all"][0], [(0.5 + 0.25 + 0) / 4, (1 + 0 + 2 * 0.5) / 4])
    np.testing.assert_allclose(s["head"][0], [0.375, 0.5])
    np.testing.assert_allclose(s["tail"][0], [0.0, 0.5])
    rec = {"kind": "eval", "step": 7, "loss": [3.0, 4.0], "loss/bucket_0": [1.0, 2.0],
           "loss/bucket_1": [5.0, 6.0], "loss/bucket_2": [9.0, 9.5],
           "bucket_labels": ["ranks 1-4", "ranks 5-9", "unseen"]}  # fmt: skip
    steps, s = tail_dose.scores("lm", {"records": [rec]}, 2)
    assert steps.tolist() == [7.0]
    np.testing.assert_allclose(s["all"][0], [-3.0, -4.0])
    np.testing.assert_allclose(s["tail"][0], [-5.0, -6.0])  # the last *seen* bucket


def test_zipf_selection_law_keeps_the_facts():
    a, b = (B.make_biographies(B.BiographyConfig(m=4, zipf=z)) for z in (0.0, 1.5))
    assert B.group_repetitions(4, 0.0).tolist() == [1] * 5
    assert B.group_repetitions(4, 1.5).tolist() == [64, 23, 8, 3, 1]  # round(2^(1.5 (4-g)))
    assert B.group_repetitions(4, 1.0).tolist() == B.group_repetitions(4).tolist()
    np.testing.assert_array_equal(a.eval.prompts, b.eval.prompts)  # same people and questions
    np.testing.assert_array_equal(a.eval.answers, b.eval.answers)
    rows = np.bincount(b.train_person[b.train_kind == 1], minlength=16)
    np.testing.assert_array_equal(rows, B.group_repetitions(4, 1.5)[b.group])
    with pytest.raises(ValueError, match="zipf"):
        B.BiographyConfig(zipf=-1.0).validate()


def test_tiny_qa_leg_end_to_end(tmp_path):
    cfg = tail_dose.EXPERIMENT.config("quick")
    q = cfg.qa_base
    q.steps, q.eval_every, q.schedule.warmup_steps = 3, 3, 1
    q.data.batch_size, q.data.biographies.m, q.data.biographies.eval_per_group = 4, 2, 6
    q.model.update(d_model=32, n_heads=1, d_ff=64, n_layers=1)
    cfg.legs, cfg.alphas, cfg.optimizers = ("qa",), (1.5, 0.0), ("adam", "muon")
    cfg.qa_lr_grid.adam, cfg.qa_lr_grid.muon = (3e-3,), (0.02,)
    res = tail_dose.EXPERIMENT(cfg, tmp_path / "td", cache_dir=tmp_path / "cache")
    leg = res["metrics"]["legs"]["qa"]
    assert [p["dose"] for p in leg["points"]] == [0.0, 1.5]  # sorted: the last is the heaviest
    lead = np.array([p["final"]["muon"]["all"] - p["final"]["adam"]["all"] for p in leg["points"]])
    np.testing.assert_allclose(lead, [p["lead"]["muon"]["all"] for p in leg["points"]])
    slope = lead[1] - lead[0]  # two doses 1.5 apart: per-seed slope = difference / 1.5
    slope /= 1.5
    half = sps.t.ppf(0.975, 2) * slope.std(ddof=1) / np.sqrt(3)
    claim = {c["key"]: c for c in res["claims"]}["tail_dose/qa_lead_grows"]
    assert (claim["interval"]["lo"], claim["interval"]["hi"]) == pytest.approx(
        (slope.mean() - half, slope.mean() + half)
    )
    assert claim["held"] is (True if slope.mean() > half else False if slope.mean() < -half
                             else None)  # fmt: skip
    assert "tail_dose/qa_no_lead_uniform" in {c["key"] for c in res["claims"]}
    assert (tmp_path / "td" / "figures" / "tail_dose_qa_lead.png").is_file()
    with pytest.raises(ValueError, match="legs"):
        cfg.legs = ("images",)
        tail_dose.EXPERIMENT(cfg, tmp_path / "bad")
