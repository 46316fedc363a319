"""How evenly training examples cover the corpus: per sentence position, and per token across documents.

    python scripts/coverage.py [--examples 20000] [--seq 128] [--docs 2500]

Builds `--examples` training examples (steps of `--batch`, as `pretrain` does) from synthetic corpora
in which every token names its sentence, so each example says exactly which sentences it shows:
  positions   documents of short sentences (verses of 14-42 tokens, about 28; chapters of 13-39
              verses, about 26). How often the sentence at position p of its document appears in
              an example (in A or B), relative to mid-document sentences (positions 6 to n-7), for
              p = 0..5 and the last three; and the share of sentences never seen. With the default
              sizes, the examples are about one pass over the corpus (an epoch of about 20,000
              chunks at seq 128).
  per token   half of the documents of long sentences (30-50 tokens), half of short ones (6-18
              tokens), as many sentences each: tokens shown per corpus token, long against short.
Masked tokens are read back from the labels. Works with older ExampleBuilders too (they took no
examples_per_step), so before and after can be measured with the same script.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from bertcli.config import DataConfig
from bertcli.data.corpus import Corpus, SpecialTokens
from bertcli.data.examples import IGNORE, ExampleBuilder

SP = SpecialTokens()


def sentence_corpus(sentences_per_doc: np.ndarray, lengths: np.ndarray) -> Corpus:
    """Every token of sentence s is first_regular_id + s."""
    tokens = (SP.first_regular_id + np.repeat(np.arange(len(lengths)), lengths)).astype(np.uint32)
    return Corpus(
        tokens=tokens,
        seg_offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        doc_offsets=np.concatenate([[0], np.cumsum(sentences_per_doc)]).astype(np.int64),
        vocab_size=SP.first_regular_id + len(lengths),
        special=SP,
    )


def make_builder(corpus: Corpus, cfg: DataConfig, per_step: int) -> ExampleBuilder:
    try:
        return ExampleBuilder(corpus, cfg, examples_per_step=per_step)
    except TypeError:  # before the chunk index, a builder needed no step size
        return ExampleBuilder(corpus, cfg)


def unmasked_rows(corpus: Corpus, cfg: DataConfig, examples: int, batch: int, seed: int):
    """The token ids of each of the first `examples` examples, masked positions restored."""
    builder = make_builder(corpus, cfg, batch)
    for step in range(-(-examples // batch)):
        b = builder.batch(seed, step, range(min(batch, examples - step * batch)))
        ids = b.input_ids.numpy().copy()
        rows, slots = np.nonzero(b.mlm_labels.numpy() != IGNORE)
        ids[rows, b.pred_positions.numpy()[rows, slots]] = b.mlm_labels.numpy()[rows, slots]  # unmask
        yield from ids


def shown(corpus: Corpus, cfg: DataConfig, examples: int, batch: int, seed: int) -> np.ndarray:
    """(S,) in how many of the examples each sentence appears (at least one of its tokens)."""
    counts = np.zeros(corpus.num_segments, dtype=np.int64)
    for row in unmasked_rows(corpus, cfg, examples, batch, seed):
        counts[np.unique(row[row >= SP.first_regular_id]) - SP.first_regular_id] += 1
    return counts


def tokens_shown(corpus: Corpus, cfg: DataConfig, examples: int, batch: int, seed: int) -> np.ndarray:
    """(S,) tokens of each sentence shown over the examples."""
    counts = np.zeros(corpus.num_segments, dtype=np.int64)
    for row in unmasked_rows(corpus, cfg, examples, batch, seed):
        counts += np.bincount(row[row >= SP.first_regular_id] - SP.first_regular_id, minlength=corpus.num_segments)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=20_000)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--docs", type=int, default=2_500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    cfg = dataclasses.replace(
        DataConfig(), max_seq_length=args.seq, max_predictions_per_seq=max(1, round(args.seq * 0.15))
    )

    per_doc = rng.integers(13, 40, size=args.docs)
    corpus = sentence_corpus(per_doc, rng.integers(14, 43, size=int(per_doc.sum())))
    counts = shown(corpus, cfg, args.examples, args.batch, args.seed)
    epoch = getattr(make_builder(corpus, cfg, args.batch), "build_epoch", None)
    position = np.concatenate([np.arange(n) for n in per_doc])  # (S,) position in its document
    from_end = np.concatenate([np.arange(n)[::-1] for n in per_doc])  # 0 = last sentence
    mid = counts[(position >= 6) & (from_end >= 6)].mean()
    print(
        f"positions: {args.docs:,} documents, {corpus.num_segments:,} sentences, {corpus.num_tokens:,} tokens; "
        f"{args.examples:,} examples of {args.seq} tokens"
        + (f" ({args.examples / len(epoch(args.seed, 0, 0).first):.2f} passes)" if epoch else "")
    )
    print("sentence position:  " + "  ".join(f"{p:>5}" for p in range(6)) + "   last-2 last-1  last")
    print(
        "relative coverage:  "
        + "  ".join(f"{counts[position == p].mean() / mid:5.2f}" for p in range(6))
        + "   "
        + "  ".join(f"{counts[from_end == p].mean() / mid:5.2f}" for p in (2, 1, 0))
    )
    print(
        f"mid-document sentences shown {mid:.2f} times on average; never shown: {np.mean(counts == 0):.1%} "
        "of all sentences"
    )

    per_doc = np.full(args.docs, 20)
    long_doc = np.arange(args.docs) % 2 == 0
    long_sentence = np.repeat(long_doc, per_doc)
    lengths = np.where(
        long_sentence, rng.integers(30, 51, size=len(long_sentence)), rng.integers(6, 19, size=len(long_sentence))
    )
    corpus = sentence_corpus(per_doc, lengths)
    tokens = tokens_shown(corpus, cfg, args.examples, args.batch, args.seed)
    rate_long = tokens[long_sentence].sum() / lengths[long_sentence].sum()
    rate_short = tokens[~long_sentence].sum() / lengths[~long_sentence].sum()
    print(
        f"per token: documents of long sentences shown {rate_long / rate_short:.2f}x as often per token as "
        f"documents of short ones ({rate_long:.3f} vs {rate_short:.3f} tokens shown per corpus token)"
    )


if __name__ == "__main__":
    main()
