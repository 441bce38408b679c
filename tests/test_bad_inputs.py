# ruff: noqa: E501 - one row per line in the table of bad inputs
"""Every bad input to every subcommand: one stderr line naming the file/field and what is
allowed, exit status 2, before anything is compiled or written (issue 34).

One row per bad input: ``(argv, expected exit status, words the single stderr line must
contain)``; a new subcommand or option joins by adding a row. Rows run in-process through
``amemory.cli.main`` (a subprocess would cost a JAX import each); ``{tmp}`` in an argument is
the test's temporary directory, where ``_files`` wrote the broken config files.
"""

import importlib.util
import os
import subprocess
import sys

import pytest
from train_helpers import MEMORY_CONFIG, REPO, lm_config, memory_config

from amemory import cli

CONFIG_FILES = {
    "syntax.py": b"def get_config(:\n    pass\n",
    "raises.py": b"def get_config():\n    raise RuntimeError('boom')\n",
    "imports.py": b"import no_such_module_here\n\ndef get_config():\n    pass\n",
    "none.py": b"def get_config():\n    return None\n",
    "binary.py": bytes(range(256)) * 4,
}
HAVE_CUDA_PLUGIN = importlib.util.find_spec("jax_cuda12_plugin") is not None

ROWS = [
    # train: config files with Python errors (also under --print-config), fields, values
    (["train", "--config", "{tmp}/syntax.py", "--workdir", "{tmp}/w"], 2, ["syntax.py line 1", "SyntaxError"]),
    (["train", "--config", "{tmp}/raises.py", "--print-config"], 2, ["raises.py line 2", "RuntimeError: boom"]),
    (["train", "--config", "{tmp}/imports.py", "--print-config"], 2, ["imports.py line 1", "ModuleNotFoundError"]),
    (["train", "--config", "{tmp}/none.py", "--workdir", "{tmp}/w"], 2, ["none.py", "returned NoneType", "ConfigDict"]),
    (["train", "--config", "{tmp}/binary.py", "--print-config"], 2, ["binary.py", "SyntaxError"]),
    (["train", "--config", "{tmp}/absent.py", "--print-config"], 2, ["--config", "not found"]),
    (["train", "--config", MEMORY_CONFIG, "--print-config", "--config.seed=999999999999999999999999999999"],
     2, ["config.seed", "[0, 2**32)"]),
    (["train", "--config", MEMORY_CONFIG, "--workdir", "{tmp}/w", "--config.seed=-1"], 2, ["config.seed", "[0, 2**32)"]),
    (["train", "--config", MEMORY_CONFIG, "--print-config", "--config.no_such_field=1"], 2, ["no_such_field"]),
    (["train", "--config", MEMORY_CONFIG], 2, ["--workdir"]),
    (["train", "--config", MEMORY_CONFIG, "--workdir", "{tmp}/w", "--nope"], 2, ["--nope"]),
    # plan: config errors and topology strings, before any compile
    (["plan", "--config", "{tmp}/syntax.py", "--topology", "v5e:2x2"], 2, ["syntax.py line 1", "SyntaxError"]),
    (["plan", "--config", MEMORY_CONFIG, "--topology", "v5e:garbage"], 2, ["v5e:garbage", "2x2"]),
    (["plan", "--config", MEMORY_CONFIG, "--topology", "v5e:999x999"], 2, ["v5e:999x999"]),
    (["plan", "--config", MEMORY_CONFIG, "--topology", "h100:abc"], 2, ["h100:abc", "2x8"]),
    (["plan", "--config", MEMORY_CONFIG, "--topology", "tpu9:2x2"], 2, ["tpu9:2x2", "v5e"]),
    pytest.param(["plan", "--config", MEMORY_CONFIG, "--topology", "h100:8"], 2,
                 ["jax_cuda12_plugin", "pip install 'jax[cuda12-local]'"],
                 marks=pytest.mark.skipif(HAVE_CUDA_PLUGIN, reason="the plugin is installed")),
    # sample: refusals in one line, writing nothing
    (["sample", "--workdir", "{tmp}/memory_run", "--prompt", "x"], 2, ["task='lm'", "data.kind='corpus'"]),
    (["sample", "--workdir", "{tmp}/lm_run", "--prompt", "x", "--temperature", "nan"], 2, ["--temperature nan", ">= 0"]),
    (["sample", "--workdir", "{tmp}/lm_run", "--prompt", "x"], 2, ["no checkpoint", "lm_run/checkpoints"]),
    (["sample", "--workdir", "{tmp}/absent", "--prompt", "x"], 2, ["no config.json"]),
    (["sample", "--workdir", "{tmp}/lm_run", "--prompt", "x", "--top-k", "two"], 2, ["--top-k", "invalid int"]),
    # reproduce, check, report, data, bench, coordcheck
    (["reproduce", "--only", "no_such_stage"], 2, ["--only", "invalid choice"]),
    (["reproduce", "--scale", "huge"], 2, ["--scale", "quick"]),
    (["reproduce", "--set", "base.no_such_field=1"], 2, ["--set", "no_such_field"]),
    (["check", "--only", "no_such_check_anywhere"], 2, ["no_such_check_anywhere"]),
    (["report", "--scale", "huge"], 2, ["--scale", "quick"]),
    (["data", "prepare", "--tokenizer", "morse"], 2, ["--tokenizer", "bpe"]),
    (["data", "stats", "{tmp}/absent.txt"], 2, ["absent.txt"]),
    (["bench", "no_such_bench"], 2, ["no_such_bench", "optim"]),
    (["coordcheck", "--widths", "16,x"], 2, ["--widths"]),
    (["coordcheck", "--widths", "64", "--out", "{tmp}/cc"], 2, ["--widths", ">= 2 widths"]),
    (["coordcheck", "--variant", "nosuch", "--out", "{tmp}/cc"], 2, ["config.optimizer.name='nosuch'"]),
    (["no_such_command"], 2, ["no_such_command", "invalid choice"]),
]  # fmt: skip


@pytest.fixture(scope="module")
def files(tmp_path_factory, corpus):
    """The broken config files and two run directories holding only a config.json: a
    memory-task run and a language-model run on the tiny corpus (no checkpoints/)."""
    tmp = tmp_path_factory.mktemp("bad_inputs")
    for name, data in CONFIG_FILES.items():
        (tmp / name).write_bytes(data)
    for name, cfg in (("memory_run", memory_config()), ("lm_run", lm_config(corpus))):
        (tmp / name).mkdir()
        (tmp / name / "config.json").write_text(cfg.to_json_best_effort())
    return tmp, _tree(tmp)


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if "cache" not in p.parts)


@pytest.mark.parametrize("argv, code, words", ROWS)
def test_bad_input_is_one_line_and_exit_2(files, capfd, argv, code, words):
    files, before = files
    argv = [a.replace("{tmp}", str(files)) for a in argv]
    try:
        rc = cli.main(argv)
    except SystemExit as e:  # argparse errors leave through SystemExit
        rc = e.code
    err = [x for x in capfd.readouterr().err.splitlines() if x.strip()]
    assert rc == code and len(err) == 1, (rc, err)
    assert err[0].startswith(f"amemory {argv[0] if argv[0] in cli.SUBCOMMANDS else ''}".strip())
    for w in words:
        assert w.replace("{tmp}", str(files)) in err[0], err[0]
    assert _tree(files) == before  # nothing written by any row (no checkpoints/ by sample)


def test_the_table_covers_every_subcommand():
    covered = {p.values[0][0] if hasattr(p, "values") else p[0][0] for p in ROWS}
    assert set(cli.SUBCOMMANDS) <= covered


@pytest.mark.parametrize("platforms", ["tpu", "garbage"])
def test_jax_platforms_naming_no_backend_is_one_line(tmp_path, platforms):
    # The backend starts in a fresh process (this one already has its CPU backend).
    env = {**os.environ, "JAX_PLATFORMS": platforms, "PYTHONPATH": str(REPO)}
    argv = ["--config", MEMORY_CONFIG, "--workdir", str(tmp_path / "w"), "--config.steps=1"]
    code = f"import sys; from amemory.train import cli; sys.exit(cli.main({argv!r}))"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    err = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2 and len(err) == 1, (proc.returncode, err)
    assert f"JAX_PLATFORMS={platforms!r}" in err[0] and "Unable to initialize backend" in err[0]
