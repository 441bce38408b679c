"""The training loop against independent references, error paths, exact resume after SIGKILL."""

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from train_helpers import LM_CONFIG, lm_config, lm_overrides, memory_config, write_corpus

from amemory.train import NonFiniteLossError, run, train
from amemory.train.checkpoint import leaf_names, load_params


def _numpy_memory_run(prior, lr, steps, direction):
    """Slow reference: W <- W - lr * direction(grad) with E = Et = I (decoupled), W_0 = 0.

    logits of query k over answers i are W[i, k]; grad[i, k] = p_k (softmax(W[:, k])_i - [i = k]).
    """
    K = len(prior)
    W = np.zeros((K, K))
    for _ in range(steps):
        z = W - W.max(axis=0, keepdims=True)
        S = np.exp(z) / np.exp(z).sum(axis=0, keepdims=True)  # S[i, k] = f_i(E_k)
        G = (S - np.eye(K)) * prior[None, :]
        W = W - lr * direction(G)
    return W


def _msgn(G):
    U, s, Vt = np.linalg.svd(G)
    keep = s > 1e-6 * s[0]
    return U[:, keep] @ Vt[keep]


def _two_level(K, alpha, beta):
    L = int(round(beta * K))
    return np.where(np.arange(K) < L, alpha / L, (1 - alpha) / (K - L))


@pytest.mark.parametrize(
    "name, lr, direction",
    [("sgd", 3.0, lambda G: G), ("muon", 0.7, _msgn), ("signgd", 0.3, np.sign)],
)
def test_memory_run_matches_numpy_reference(tmp_path, name, lr, direction):
    cfg = memory_config(**{"optimizer.name": name, "optimizer.lr": lr, "prior.beta": 0.25})
    summary, state = run(cfg, tmp_path)
    prior = _two_level(12, 0.8, 0.25)
    W_ref = _numpy_memory_run(prior, lr, 5, direction)
    np.testing.assert_allclose(np.asarray(state.params["W"]), W_ref, rtol=2e-5, atol=2e-6)
    z = W_ref - W_ref.max(axis=0, keepdims=True)
    S = np.exp(z) / np.exp(z).sum(axis=0, keepdims=True)
    correct = np.diag(S)
    ev = summary["final_eval"]
    assert ev["loss"] == pytest.approx(-(prior * np.log(correct)).sum(), rel=1e-4)
    assert ev["gap"] == pytest.approx(correct.max() - correct.min(), abs=1e-5)
    assert ev["correct_prob/min"] == pytest.approx(correct.min(), rel=1e-4)
    head = np.arange(12) < 3
    acc = (np.argmax(S, axis=0) == np.arange(12)).astype(float)
    assert ev["acc/head"] == pytest.approx(acc[head].mean())
    assert ev["acc/tail"] == pytest.approx(acc[~head].mean())
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    sp = [r for r in recs if r["kind"] == "spectrum"][-1]
    s = np.linalg.svd(W_ref, compute_uv=False)
    assert sp["spectrum/W/stable_rank"] == pytest.approx((s**2).sum() / s[0] ** 2, rel=1e-4)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_nonfinite_state_is_never_saved_and_names_healthy_checkpoint(tmp_path):
    # lr = 3e38 (finite in float32, so it passes validation) overflows the SGD update:
    # the parameters after step 1 are inf/nan (the loss of step 1, computed before the
    # update, is still finite).
    bad = {"optimizer.name": "sgd", "optimizer.lr": 3e38, "checkpoint_every": 1}
    with pytest.raises(NonFiniteLossError, match=r"at step 1; no checkpoint on disk$"):
        train(memory_config(**bad, log_every=10), tmp_path / "a")
    assert not (tmp_path / "a" / "checkpoints" / "1").exists()
    # A good first step (saved), then a resume that diverges at step 2: checked before the
    # save of step 2 (not a log step), which therefore never happens. The loss of step 2
    # (on the parameters of checkpoint 1) is finite, only its update is not: checkpoint 1
    # is healthy and stays where --resume finds it (amemory.train.guard).
    train(memory_config(**{"optimizer.name": "sgd", "steps": 1}), tmp_path / "b")
    with pytest.raises(
        NonFiniteLossError, match=r"at step 2; newest healthy checkpoint: .*/b/checkpoints/1$"
    ):
        train(
            memory_config(**bad, steps=3, log_every=10), tmp_path / "b", resume=True,
            allow_changed=("optimizer.lr",),
        )  # fmt: skip
    assert not (tmp_path / "b" / "checkpoints" / "2").exists()
    assert (tmp_path / "b" / "checkpoints" / "1").exists()
    recs = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert recs[-1]["event"] == "nonfinite" and recs[-1]["step"] == 2


def test_steps_between_log_steps_copy_nothing_to_host(tmp_path, monkeypatch):
    """The whole stretch between two sync points runs under
    jax.transfer_guard_device_to_host; host reads happen only at the log / eval /
    checkpoint / profile points (which allow them), so a per-step read anywhere else in
    the loop, even just after the step (here: at the start of ``after_step``), raises.

    On CPU a device array is host memory and JAX's guard never fires (reads are zero-copy),
    so the spy also makes every value read of a jax.Array (``jax.device_get``, ``float``,
    ``.item()``, ``.tolist()``, ``bool``; all go through ``Array._value``) an error while
    a disallowing guard is innermost. Not caught on CPU: ``np.asarray`` (numpy's zero-copy
    buffer view).
    """
    import contextlib

    import jax
    import jax.numpy as jnp

    from amemory.train import loop

    real_guard = jax.transfer_guard_device_to_host
    array_type = type(jnp.zeros(()))
    value = array_type._value
    levels, held = [], [False]

    def read(self):
        if held[0]:
            raise AssertionError("device-to-host read between two log steps")
        return value.fget(self)

    @contextlib.contextmanager
    def spy(level):
        levels.append(level)
        before = held[0]
        with real_guard("disallow_explicit" if level != "allow" else "allow"):
            held[0] = level != "allow"
            try:
                yield
            finally:
                held[0] = before

    monkeypatch.setattr(jax, "transfer_guard_device_to_host", spy)
    monkeypatch.setattr(array_type, "_value", property(read))
    monkeypatch.setenv("AMEMORY_DATA", str(tmp_path / "cache"))
    extra = {"steps": 12, "log_every": 6, "eval_every": 12, "spectrum_every": 0}
    extra |= {"checkpoint_every": 4, "keep_checkpoints": 3, "profile_steps": "2,3"}
    corpus = write_corpus(tmp_path)
    summary = train(lm_config(corpus, **extra), tmp_path / "run")
    assert summary["steps"] == 12 and levels.count("disallow_explicit") == 12
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r["kind"] == "train"] == [6, 12]
    assert sorted(int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir()) == [4, 8, 12]
    traces = list((tmp_path / "run" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0
    # A per-step float(loss) placed after the step, outside the old guarded block, raises.
    after_step = loop._SyncPoints.after_step

    def reads_every_step(self, s, state, acc, *args):
        float(acc["n"])
        return after_step(self, s, state, acc, *args)

    monkeypatch.setattr(loop._SyncPoints, "after_step", reads_every_step)
    with pytest.raises(AssertionError, match="read between two log steps"):
        train(lm_config(corpus, **{**extra, "steps": 2}), tmp_path / "run2")


def test_restore_into_different_shape_names_leaf(tmp_path):
    train(memory_config(**{"memory.K": 6, "steps": 1}), tmp_path)
    with pytest.raises(ValueError, match=r"already holds checkpoints .* --resume"):
        train(memory_config(**{"memory.K": 6, "steps": 2}), tmp_path)
    with pytest.raises(ValueError, match=r"memory\.K: 6 in the checkpoint, 9 now"):
        train(memory_config(**{"memory.K": 9, "steps": 2}), tmp_path, resume=True)
    with pytest.raises(
        ValueError, match=r"leaf 'params.W' has shape \(6, 6\), .* expects \(9, 9\)"
    ):
        kw = {"resume": True, "allow_changed": ("memory.K",)}
        train(memory_config(**{"memory.K": 9, "steps": 2}), tmp_path, **kw)
    # resuming with a longer run continues from step 1
    summary = train(memory_config(**{"memory.K": 6, "steps": 3}), tmp_path, resume=True)
    assert summary["resumed_from"] == 1 and summary["steps"] == 3


def _cli(workdir, args, resume=False):
    cmd = [sys.executable, "-m", "amemory.cli", "train", "--config", LM_CONFIG + ":full"]
    cmd += ["--workdir", str(workdir)] + [f"--config.{a}" for a in args]
    return cmd + (["--resume"] if resume else [])


def test_sigkill_then_resume_equals_uninterrupted(tmp_path, monkeypatch):
    corpus = write_corpus(tmp_path)
    monkeypatch.setenv("AMEMORY_DATA", str(tmp_path / "cache"))
    extra = {"steps": 400, "log_every": 10, "eval_every": 1000, "spectrum_every": 0}
    extra |= {"checkpoint_every": 20, "keep_checkpoints": 2, "optimizer.name": "muon"}
    ref_summary, ref = run(lm_config(corpus, **extra), tmp_path / "ref")
    wd = tmp_path / "killed"
    args = lm_overrides(corpus, **extra)
    proc = subprocess.Popen(_cli(wd, args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    metrics = wd / "metrics.jsonl"
    deadline = time.time() + 120
    try:
        while time.time() < deadline and proc.poll() is None:
            steps = (
                [json.loads(x)["step"] for x in metrics.read_text().splitlines()[:-1]]
                if metrics.exists()
                else []
            )
            if steps and max(steps) >= 100 and (wd / "checkpoints").exists():
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL, "training finished before it could be killed"
    done = subprocess.run(_cli(wd, args, resume=True), capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((wd / "summary.json").read_text())
    assert 0 < summary["resumed_from"] < 400 and summary["steps"] == 400
    got, want = leaf_names(load_params(wd / "checkpoints")), leaf_names(ref.params)
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(got[k], np.asarray(want[k]), rtol=1e-6, atol=1e-7, err_msg=k)
    recs = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in recs if r["kind"] == "train"]
    assert train_steps == list(range(10, 401, 10))  # no duplicates after the resume
    assert summary["final_train_loss"] == pytest.approx(ref_summary["final_train_loss"], rel=1e-5)


def test_biographies_fta_matches_unpadded_reference(tmp_path):
    import jax

    from amemory.data import biographies as B
    from amemory.models import transformer
    from amemory.train.tasks import model_config

    extra = {"data.kind": "biographies", "data.biographies.m": 3, "steps": 3}
    extra |= {"data.biographies.eval_per_group": 1000, "optimizer.name": "adam"}
    cfg = lm_config(tmp_path, **extra)
    summary, state = run(cfg, tmp_path / "run")
    ev = summary["final_eval"]
    assert sorted(k for k in ev if k.startswith("fta/group_")) == [
        f"fta/group_{g}" for g in range(4)
    ]
    # reference: each prompt alone, unpadded, argmax at its last token
    data = B.make_biographies(B.BiographyConfig(m=3, seed=0))
    es = data.eval
    mc = model_config(cfg, data.vocab_size, max_len=max(data.seq_len - 1, es.prompts.shape[1]))
    graphdef = transformer.init(mc, jax.random.PRNGKey(0))[0]
    params = jax.tree.map(np.asarray, state.params)
    apply = jax.jit(transformer.apply, static_argnums=0)
    hits = np.zeros(len(es.group), bool)
    for n in np.unique(es.prompt_len):  # prompts of one length together, without padding
        idx = np.flatnonzero(es.prompt_len == n)
        logits = np.asarray(apply(graphdef, params, es.prompts[idx, :n]))
        hits[idx] = np.argmax(logits[:, -1], axis=-1) == es.answer_first[idx]
    assert ev["fta"] == pytest.approx(hits.mean())
    for g in range(4):
        assert ev[f"fta/group_{g}"] == pytest.approx(hits[es.group == g].mean())


@pytest.mark.parametrize("mode", ["single", "sharded"])
def test_memory_multi_seed_sampling_is_per_seed(tmp_path, mode):
    """With sampled pairs each seed draws its own batches; seed s equals a run with seed=s."""
    base = {"optimizer.name": "signgd", "optimizer.lr": 0.3, "batch_size": 48}
    _, alone = run(memory_config(seed=1, **base), tmp_path / "alone")
    extra = {"seeds": "0,1", "parallel.mode": mode, "parallel.fsdp": 2 if mode == "sharded" else 1}
    summary, both = run(memory_config(**base, **extra), tmp_path / "both")
    W = np.asarray(both.params["W"])  # (2, K, K)
    np.testing.assert_allclose(W[1], np.asarray(alone.params["W"]), rtol=1e-6, atol=1e-7)
    assert np.abs(W[0] - W[1]).max() > 0.1  # different samples, different memories
    assert len(summary["final_eval"]["gap"]) == 2
