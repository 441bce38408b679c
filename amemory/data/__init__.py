"""amemory.data: priors, associative-memory tasks, synthetic biographies, real text.

Import the submodule you need (``from amemory.data import corpus``); this package
imports none of them, so ``import amemory.data.frequencies`` stays cheap (no jax, no
tokenizers):

  * :mod:`amemory.data.frequencies`: class priors (two-level, power law, hierarchical, counts).
  * :mod:`amemory.data.memory_tasks`: (query, answer) samplers with label noise; exact joints.
  * :mod:`amemory.data.biographies`, :mod:`amemory.data.biography_eval`: paper A's QA and scoring.
  * :mod:`amemory.data.corpus`: the tokenized corpus a run trains on (``prepare_corpus``).
  * :mod:`amemory.data.sources`: data cache, Shakespeare fetch, user text files, .bin tokens.
  * :mod:`amemory.data.tokenizer`: BPE and word-level tokenizers, trained once and cached.
  * :mod:`amemory.data.batching`: Grain input pipelines and evaluation windows.
  * :mod:`amemory.data.stats`: frequency buckets, Zipf exponent, corpus summary.
"""
