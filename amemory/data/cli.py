"""`amemory data prepare|stats CORPUS`: fetch, tokenize and cache a corpus (under
$AMEMORY_DATA, default ~/.cache/amemory); print its tokens, vocabulary, Zipf exponent and
head-to-tail bucket table. CORPUS: "shakespeare", text files/dirs/globs, .bin token files,
or (stats only) "biographies", paper A's synthetic QA.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from amemory.cli import Parser


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="amemory data", description="Prepare corpora and print their statistics.")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=Parser)

    prep = sub.add_parser("prepare", help="fetch, clean, tokenize and cache a corpus")
    st = sub.add_parser("stats", help="token counts, vocabulary, Zipf exponent, bucket table")
    for sp in (prep, st):
        sp.add_argument(
            "corpus", nargs="+", help='"shakespeare", text paths/dirs/globs, .bin files'
        )
        sp.add_argument("--tokenizer", default="bpe", choices=["bpe", "word"])
        sp.add_argument("--vocab-size", type=int, default=None, help="default 8192 (text)")
        sp.add_argument("--val-fraction", type=float, default=0.1)
    st.add_argument("--buckets", type=int, default=6, help="number of frequency-rank bands")
    st.add_argument("--m", type=int, default=8, help="biographies only: number of groups m")
    st.add_argument("--seed", type=int, default=0, help="biographies only: seed")
    st.add_argument("--json", action="store_true", help="print the statistics as JSON")
    return p


def _print_table(stats: dict) -> None:
    print(f"corpus            {stats['name']}  (tokenizer: {stats['tokenizer']})")
    print(f"vocabulary        {stats['vocab_size']}  ({stats['seen_types']} seen in training)")
    print(
        f"tokens            train {stats['train_tokens']:,}  val {stats['val_tokens']:,}  "
        f"(documents {stats['train_docs']} / {stats['val_docs']})"
    )
    print(f"Zipf exponent     {stats['zipf_exponent']:.3f}  (count ~ rank^-s, least squares)")
    print(f"val tokens unseen {stats['val_unseen_fraction']:.4%}")
    print(f"{'bucket':<22}{'types':>8}{'train share':>14}")
    for row in stats["buckets"]:
        print(f"{row['label']:<22}{row['n_types']:>8}{row['train_share']:>14.4f}")


def _biography_stats(args) -> int:
    from amemory.data import biographies

    d = biographies.make_biographies(biographies.BiographyConfig(m=args.m, seed=args.seed))
    sizes, reps = biographies.group_sizes(args.m), biographies.group_repetitions(args.m)
    tokens = int(np.count_nonzero(d.train_tokens != d.pad_id))
    stats = {
        "name": "biographies",
        "m": args.m,
        "vocab_size": d.vocab_size,
        "train_rows": int(d.train_tokens.shape[0]),
        "row_len": d.seq_len,
        "train_tokens": tokens,
        "eval_items": int(d.eval.prompts.shape[0]),
        "groups": [
            {"group": g, "individuals": int(sizes[g]), "selections_each": int(reps[g])}
            for g in range(args.m + 1)
        ],
    }
    if args.json:
        print(json.dumps(stats, indent=1))
        return 0
    print(
        f"biographies m={args.m}: vocabulary {d.vocab_size}, {stats['train_rows']} rows of "
        f"length {d.seq_len} ({tokens:,} non-pad tokens), {stats['eval_items']} eval QA items"
    )
    print(f"{'group':>6}{'individuals':>13}{'selections each':>17}")
    for row in stats["groups"]:
        print(f"{row['group']:>6}{row['individuals']:>13}{row['selections_each']:>17}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``amemory data``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.cmd is None:
        parser.print_help()
        return 0
    from amemory.data import corpus, sources
    from amemory.data.stats import corpus_stats

    try:
        if args.cmd == "stats" and args.corpus == ["biographies"]:
            return _biography_stats(args)
        spec = args.corpus[0] if len(args.corpus) == 1 else args.corpus
        data = corpus.prepare_corpus(
            spec,
            tokenizer=args.tokenizer,
            vocab_size=args.vocab_size,
            val_fraction=args.val_fraction,
        )
        if args.cmd == "prepare":
            print(
                f"prepared {data.name}: {len(data.train_tokens):,} train / "
                f"{len(data.val_tokens):,} val tokens, vocabulary {data.vocab_size} "
                f"({data.tokenizer_kind}); cache {sources.data_dir()}"
            )
            return 0
        stats = corpus_stats(data, n_buckets=args.buckets)
        if args.json:
            print(json.dumps(stats, indent=1))
        else:
            _print_table(stats)
        return 0
    except (sources.CorpusUnavailableError, ValueError) as e:
        parser.fail(e)
        return 1 if isinstance(e, sources.CorpusUnavailableError) else 2
