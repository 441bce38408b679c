"""Owner layout (amemory.optim.distributed) on 8 fake CPU devices and on 2 processes.

The tree (tests/distributed_worker.py) holds FSDP-split 2-D matrices (one tall), a
square one, a scanned stack [3, 16, 40], an expert stack split along experts [16, 8, 8]
and a replicated odd shape [13, 7], on a (data=2, fsdp=4) mesh.

Tolerance: the owner layout computes the same Newton-Schulz on the same whole matrices
as one device, in another batch grouping, so updates agree to float32 rounding. Stated
bound: max |u - u_ref| <= 1e-5 max |u_ref| per leaf over 3 steps (observed about 1e-6).
"""

import os
import re
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from distributed_worker import SHAPES, fsdp_spec, matrix_axes, trees, updates

from amemory.optim import adamuon, describe_layout, muon, normuon

RTOL = 1e-5
AUTO = jax.sharding.AxisType.Auto
COLLECTIVES = ("all-to-all", "all-gather", "all-reduce", "reduce-scatter", "collective-permute")


def _mesh(shape):
    names = ("data", "fsdp")[-len(shape) :]
    return jax.make_mesh(shape, names, axis_types=(AUTO,) * len(shape))


def _reference(make_tx):
    """The same 3 updates on one device, no mesh (plain amemory Muon/NorMuon)."""
    params, grads = trees()
    tx = make_tx(None)
    state, step = tx.init(params), jax.jit(tx.update)
    out = []
    for g in grads:
        u, state = step(g, state, params)
        out.append(jax.tree.map(np.asarray, u))
    return out


def _rel_err(got, ref) -> float:
    return max(
        float(np.max(np.abs(np.asarray(got[k]) - ref[k])) / np.max(np.abs(ref[k]))) for k in ref
    )


OPTS = {
    "muon": lambda m, **kw: muon(0.1, matrix_axes=matrix_axes, ns_mesh=m, **kw),
    "normuon": lambda m, **kw: normuon(0.1, matrix_axes=matrix_axes, ns_mesh=m, **kw),
    "adamuon": lambda m, **kw: adamuon(0.1, matrix_axes=matrix_axes, ns_mesh=m, **kw),
}


@pytest.fixture(scope="module")
def one_process():
    """name -> (owner updates on a (data=2, fsdp=4) mesh, their HLO, one-device reference)."""
    out = {}
    for name, make in OPTS.items():
        got, text = updates(_mesh((2, 4)), make)
        out[name] = ([jax.tree.map(np.asarray, u) for u in got], text, _reference(make))
    return out


@pytest.mark.parametrize("name", sorted(OPTS))
def test_owner_updates_equal_single_device(one_process, name):
    got, _, ref = one_process[name]
    errs = [_rel_err(g, r) for g, r in zip(got, ref, strict=True)]
    assert max(errs) < RTOL, errs


def _count(text: str) -> dict[str, int]:
    return {op: len(re.findall(rf"\b{op}(?:-start)?\(", text)) for op in COLLECTIVES}


def _while_bodies(text: str) -> list[str]:
    """Text of every computation used as a while-loop body in an HLO module."""
    names = set(re.findall(r"body=%?([\w.\-]+)", text))
    blocks = re.split(r"\n(?=%?[\w.\-]+ [^\n]*\{\s*$)", text, flags=re.M)
    return [b for b in blocks if b.split(" ", 1)[0].lstrip("%") in names]


# The design's prediction per update on the (data=2, fsdp=4) mesh: s = 4 devices split
# each matrix, r = 2 copies of each shard, n = 8 owners.
#   Muon stacks:    16x40 (a, b^T, scan: 5 matrices, padded to 8, split columns) and
#                   24x24 (c, rows): 2 all-to-all + 1 all-gather over "data" each;
#                   7x13 (odd, replicated): owners, then 1 all-gather over all devices;
#                   experts (split along E = 16, 8 | 16): in place, 1 all-gather ("data").
#   NorMuon stacks: the same, but 16x40 wide (a, scan) and tall (b) are two stacks (their
#   second moments live with the owners); AdaMuon's per-entry moments likewise.
PREDICTED = {
    "muon": {"all-to-all": 4, "all-gather": 4},
    "normuon": {"all-to-all": 6, "all-gather": 5},
    "adamuon": {"all-to-all": 6, "all-gather": 5},
}


@pytest.mark.parametrize("name", sorted(OPTS))
def test_owner_hlo_collectives_are_the_predicted_ones(one_process, name):
    _, text, _ = one_process[name]
    none = {"all-reduce": 0, "reduce-scatter": 0, "collective-permute": 0}
    assert _count(text) == {**PREDICTED[name], **none}, _count(text)
    for body in _while_bodies(text):  # NS is unrolled today; a looped NS must stay local too
        assert not any(_count(body)[op] for op in ("all-reduce", "all-gather", "reduce-scatter"))


def test_gspmd_baseline_all_reduces_inside_newton_schulz():
    """The counter sees the partitioner's collectives: without the owner layout, NS on a
    row-split matrix gathers or reduces inside every one of its 5 steps (observed: 15
    all-gathers and 1 all-reduce for one [24, 24] matrix on 8 devices)."""
    mesh, shapes = _mesh((8,)), {"c": (24, 24)}
    params, grads = trees(shapes, steps=1)
    put = lambda t: jax.tree.map(  # noqa: E731
        lambda x: jax.device_put(x, jax.sharding.NamedSharding(mesh, fsdp_spec(x.shape, 8))), t
    )
    tx = OPTS["muon"]((mesh, "fsdp"), distributed="gspmd")
    step = jax.jit(tx.update).lower(put(grads[0]), put(tx.init(params)), put(params))
    counts = _count(step.compile().as_text())
    assert counts["all-to-all"] == 0, counts
    assert counts["all-gather"] + counts["all-reduce"] >= 5, counts


def test_describe_layout_lists_each_stack():
    params, _ = trees(steps=0)
    rows = describe_layout(params, ns_mesh=(_mesh((8,)), "fsdp"), matrix_axes=matrix_axes)
    got = {r["group"]: (r["layout"], r["matrices"], r["padded"], r["split"]) for r in rows}
    assert got == {
        "16x40": ("owner/all_to_all", 5, 8, "columns"),
        "24x24": ("owner/all_to_all", 1, 8, "rows"),
        "7x13": ("owner/gather", 1, 8, None),
        "leaf3": ("owner/in_place", 16, 16, "batch"),  # "experts", 4th leaf in key order
    }
    assert {r["group"]: r["leaves"] for r in rows}["16x40"] == ["a", "b", "scan"]
    plain = describe_layout(params, matrix_axes=matrix_axes)
    assert {r["layout"] for r in plain} == {"gspmd"}


def test_bad_distributed_options_raise():
    mesh = _mesh((8,))
    with pytest.raises(ValueError, match="distributed="):
        muon(0.1, distributed="ring")
    with pytest.raises(ValueError, match="needs ns_mesh"):
        normuon(0.1, distributed="owner")
    with pytest.raises(ValueError, match="ns_mesh"):
        muon(0.1, ns_mesh=(mesh, "tp"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_match_one_process(one_process, tmp_path):
    """2 processes x 4 CPU devices (jax.distributed on loopback) = 1 process x 8 devices."""
    out = tmp_path / "updates.npz"
    worker = os.path.join(os.path.dirname(__file__), "distributed_worker.py")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, worker, str(pid), port, str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for pid in range(2)
    ]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    two = np.load(out)
    for t, ref in enumerate(one_process["muon"][0]):
        assert _rel_err({k: two[f"{t}/{k}"] for k in SHAPES}, ref) < 1e-6, t
