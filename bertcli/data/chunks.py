"""One epoch's cut of a corpus into chunks (Google BERT's create_instances_from_document,
vectorised), from the segment and document offsets alone: numpy only, no torch, so that `prepare`
and `inspect` can say what share of the NSP pairs the data gives a random next sentence.
ExampleBuilder (examples.py) builds its examples on these chunks.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bertcli.config import DataConfig

PIECE = 4096  # segments: longer documents are cut in pieces of this many (see ExampleBuilder.PIECE)


class ChunkIndex(NamedTuple):
    """One epoch's chunks, in the epoch's (shuffled) order. Chunk j is segments first[j] to
    first[j] + count[j] - 1 of one document; with pairs, A is its first a_count[j] segments and B
    the rest, or (random_next[j]) a span from another document of about target[j] - len(A) tokens."""

    first: np.ndarray  # (C,) int32 or int64
    count: np.ndarray  # (C,) uint16 or int32, >= 1
    a_count: np.ndarray  # (C,) like count, 1..count (count only when B is random)
    random_next: np.ndarray  # (C,) bool
    target: np.ndarray  # (C,) like count: the chunk's target length in tokens


def cut_epoch(offsets: np.ndarray, doc_offsets: np.ndarray, *, max_tokens: int, cfg: DataConfig,
              rng: np.random.Generator, piece: int = PIECE) -> ChunkIndex:
    """The chunks of one epoch (see ExampleBuilder.build_epoch), drawn from `rng`: `offsets` (S+1,)
    token offsets of the segments, `doc_offsets` (D+1,) first segment of each document."""
    offsets, doc_offsets = np.asarray(offsets), np.asarray(doc_offsets).astype(np.int64)
    # Pieces: documents, longer ones cut every PIECE segments.
    sizes = np.diff(doc_offsets)
    per_doc = -(-sizes // piece)
    doc = np.repeat(np.arange(len(sizes)), per_doc)
    k = np.arange(len(doc)) - np.repeat(np.cumsum(per_doc) - per_doc, per_doc)
    pos = doc_offsets[doc] + k * piece  # (P,) where each piece's next chunk starts
    piece_end = np.minimum(pos + piece, doc_offsets[doc + 1])
    doc_start = doc_offsets[doc]
    active = np.arange(len(pos))
    parts: list[tuple[np.ndarray, ...]] = []  # per round, in compact types: ~11 bytes a chunk
    small = np.uint16 if max_tokens < 1 << 16 else np.int32  # chunk sizes and targets
    segment = np.int32 if len(offsets) < 1 << 31 else np.int64
    while len(active):
        p, stop, n = pos[active], piece_end[active], len(active)
        target = np.full(n, max_tokens, dtype=np.int64)
        short = rng.random(n) < cfg.short_seq_prob
        target[short] = rng.integers(2, max_tokens + 1, size=int(short.sum()))
        end = np.searchsorted(offsets, offsets[p] + target, side="left")
        end = np.minimum(np.maximum(end, p + 1), stop)
        first, count = p.copy(), end - p
        a_count = np.ones(n, dtype=np.int64)
        random_next = np.ones(n, dtype=bool)
        step_to = end
        if cfg.pairs:
            split, coin = rng.random(n), rng.random(n) < cfg.random_next_prob
            several = count >= 2
            a_count[several] = 1 + (split[several] * (count[several] - 1)).astype(np.int64)
            lone = ~several & (p > doc_start[active]) & (offsets[end] - offsets[p] < target)
            random_next = coin | (~several & ~lone)
            paired = lone & ~coin  # A = the sentence before, B = this one
            first[paired] -= 1
            count[paired] = 2
            step_to = np.where(random_next & several, p + a_count, end)  # put B's segments back
        else:
            a_count = count
        parts.append((first.astype(segment), count.astype(small), a_count.astype(small), random_next,
                      target.astype(small)))
        pos[active] = step_to
        active = active[step_to < stop]
    order = rng.permutation(sum(len(part[0]) for part in parts))
    return ChunkIndex(*(np.concatenate(column)[order] for column in zip(*parts)))



SHARE_SEGMENTS = 1 << 18  # random_next_share cuts at most about this many segments (~0.05 s)


def random_next_share(seg_offsets: np.ndarray, doc_offsets: np.ndarray, cfg: DataConfig, seed: int) -> float:
    """The share of the NSP pairs of a first epoch whose B is a random next sentence, as training
    draws them (train.seed `seed`): random_next_prob of the chunks of two or more sentences, and
    nearly every chunk of one (a one-sentence document, or a sentence that fills the example alone).
    Exact for corpora of up to SHARE_SEGMENTS sentences; above, measured on every k-th document."""
    seg, doc = np.asarray(seg_offsets), np.asarray(doc_offsets).astype(np.int64)
    stride = -(-(len(seg) - 1) // SHARE_SEGMENTS)
    if stride > 1:  # every stride-th document, its segments' lengths kept
        picked = np.arange(0, len(doc) - 1, stride)
        counts = doc[picked + 1] - doc[picked]
        index = np.repeat(doc[picked] - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
        seg = np.concatenate([[0], np.cumsum(seg[index + 1] - seg[index])])
        doc = np.concatenate([[0], np.cumsum(counts)])
    if len(doc) < 2:
        return 0.0
    index = cut_epoch(seg, doc, max_tokens=cfg.max_seq_length - 3, cfg=cfg, rng=np.random.default_rng([seed, 0, 0]))
    return float(index.random_next.mean())
