"""``amemory sample``: continue a text prompt with a trained run's model (KV-cache decoding).

    amemory sample --workdir runs/lm_muon --prompt "To be" --temperature 0.8 --top-k 40 --seed 1

Reads a language-model run of ``amemory train`` (config.json, the corpus's cached tokenizer,
the newest checkpoint or ``--step``) and decodes with :func:`amemory.models.decode.generate`;
``--temperature 0`` is greedy, else the draws follow ``--seed``; an empty prompt starts a new
document (the end-of-text token).
"""

from __future__ import annotations

import json
import math
import pathlib

from ml_collections import ConfigDict

from amemory.cli import Parser


def load_run(workdir: str | pathlib.Path, *, step: int | None = None, seed_index: int = 0):
    """``(graphdef, params, tokenizer, corpus)`` of a language-model run at ``step`` (None: the
    newest); ``params`` the nested arrays of seed ``seed_index`` of a multi-seed run.

    Raises:
      ValueError: no config.json or checkpoint, a run that is not a language model on a
        text corpus, or a checkpoint whose parameters do not fit the model.
    """
    import jax
    import numpy as np

    from amemory.data.corpus import prepare_corpus
    from amemory.models import transformer
    from amemory.train.checkpoint import leaf_names, load_params
    from amemory.train.tasks import model_config

    workdir = pathlib.Path(workdir)
    path = workdir / "config.json"
    if not path.is_file():
        raise ValueError(f"--workdir {workdir}: no config.json (not an amemory train run)")
    config = ConfigDict(json.loads(path.read_text()))
    kind = (config.get("data") or {}).get("kind")
    if config.get("task") != "lm" or kind != "corpus":
        raise ValueError(
            f"--workdir {workdir}: amemory sample needs a language model on a text corpus "
            f"(task='lm', data.kind='corpus'), got task={config.get('task')!r}, data.kind={kind!r}"
        )
    d = config.data
    data = prepare_corpus(d.corpus, tokenizer=d.tokenizer, vocab_size=int(d.vocab_size))
    if data.tokenizer is None:
        raise ValueError(f"--workdir {workdir}: corpus {d.corpus!r} has no tokenizer (.bin)")
    mc = model_config(config, data.vocab_size)
    abstract = jax.eval_shape(lambda: transformer.init_params(mc, jax.random.PRNGKey(0)))
    saved = leaf_names(load_params(workdir / "checkpoints", step))
    leaves = []
    for name, want in leaf_names(abstract).items():
        if name not in saved:
            raise ValueError(f"checkpoint of {workdir} has no parameter {name!r}")
        x = saved[name]
        if config.get("seeds") and x.ndim == len(want.shape) + 1:
            if not 0 <= seed_index < x.shape[0]:
                raise ValueError(f"--seed-index {seed_index}: the run has {x.shape[0]} seeds")
            x = x[seed_index]
        if tuple(x.shape) != tuple(want.shape):
            raise ValueError(f"parameter {name!r}: checkpoint {x.shape}, model {want.shape}")
        leaves.append(np.asarray(x, want.dtype))
    params = jax.tree.unflatten(jax.tree.structure(abstract), leaves)
    return transformer._graphdef(mc), params, data.tokenizer, data


def sample_text(
    workdir: str | pathlib.Path, prompt: str, max_new_tokens: int, *, temperature: float = 1.0,
    top_k: int = 0, seed: int = 0, step: int | None = None, seed_index: int = 0,
) -> str:  # fmt: skip
    """The prompt and its continuation by a trained run, decoded together as text (a
    word-level tokenizer re-spaces the prompt).

    Raises:
      ValueError: as :func:`load_run`, or bad decoding options (names the option; a
        non-finite ``temperature`` before anything is read).
    """
    import jax
    import jax.numpy as jnp

    from amemory.models import decode

    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"--temperature {temperature}: must be a finite number >= 0 (0 = greedy)")
    graphdef, params, tok, data = load_run(workdir, step=step, seed_index=seed_index)
    ids = tok.encode(prompt, add_special_tokens=False).ids if prompt else [data.eot_id]
    out = decode.generate(
        graphdef, params, jnp.asarray([ids], jnp.int32), int(max_new_tokens),
        key=jax.random.PRNGKey(seed), temperature=float(temperature), top_k=int(top_k),
    )  # fmt: skip
    start = 0 if prompt else 1  # an empty prompt's end-of-text token is not printed
    return tok.decode([int(i) for i in out[0, start:]], skip_special_tokens=False)


def main(argv: list[str]) -> int:
    """Parse ``argv``, generate, print the text. Returns the exit status."""
    p = Parser(prog="amemory sample", description=__doc__.splitlines()[0])
    p.add_argument("--workdir", required=True, help="run directory of amemory train")
    p.add_argument("--prompt", required=True, help="text to continue ('' = a new document)")
    p.add_argument("--max-new-tokens", type=int, default=100, help="tokens to generate (>= 1)")
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (deterministic)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest (0 = all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the draws")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: newest)")
    p.add_argument("--seed-index", type=int, default=0, help="seed of a multi-seed run")
    args = p.parse_args(argv)
    try:
        text = sample_text(**vars(args))  # the flags are sample_text's parameters
    except ValueError as e:
        return p.fail(e)
    print(text)
    return 0
