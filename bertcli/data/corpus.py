"""A corpus: documents of segments (sentences) of token ids, as three flat arrays (in memory, or
memory-mapped prepared shards, which use the same layout on disk):
  tokens       (N,)    token ids of every segment, back to back
  seg_offsets  (S+1,)  segment s is tokens[seg_offsets[s]:seg_offsets[s+1]]
  doc_offsets  (D+1,)  document d is segments doc_offsets[d]..doc_offsets[d+1]-1
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from bertcli.config import SyntheticConfig


@dataclass(frozen=True)
class SpecialTokens:
    """Ids of the special tokens; bertcli's own vocabularies put them first (0..4)."""

    pad: int = 0
    unk: int = 1
    cls: int = 2
    sep: int = 3
    mask: int = 4

    @property
    def first_regular_id(self) -> int:  # where the synthetic corpus starts its words
        return max(self.ids) + 1

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(sorted({self.pad, self.unk, self.cls, self.sep, self.mask}))

    def random_regular(self, rng: np.random.Generator, vocab_size: int, size: int) -> np.ndarray:
        """`size` ids drawn uniformly from the non-special ids in [0, vocab_size), wherever the specials are."""
        ids = rng.integers(0, vocab_size - len(self.ids), size=size)
        for special in self.ids:  # ascending: each one moves the draws at or above it up by one
            ids += ids >= special
        return ids


class PartTokens:
    """A prepared corpus's token parts, sliced (tokens[a:b]) as one array: a view inside a part, a copy across."""

    def __init__(self, pieces: list[np.ndarray]) -> None:
        self.pieces = pieces
        self.starts = np.concatenate([[0], np.cumsum([len(p) for p in pieces])]).astype(np.int64)  # (P+1,)
        self.bounds = self.starts.tolist()
        self.dtype = pieces[0].dtype if pieces else np.dtype(np.uint16)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, index: slice) -> np.ndarray:
        lo, hi, _ = index.indices(len(self))
        if hi <= lo:
            return np.zeros(0, dtype=self.dtype)
        first = int(np.searchsorted(self.starts, lo, side="right")) - 1
        last = int(np.searchsorted(self.starts, hi, side="left")) - 1
        at = self.bounds
        parts = [self.pieces[p][max(lo, at[p]) - at[p] : min(hi, at[p + 1]) - at[p]] for p in range(first, last + 1)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


@dataclass
class Corpus:
    tokens: np.ndarray | PartTokens  # PartTokens: a prepared corpus of several parts (slices only)
    seg_offsets: np.ndarray
    doc_offsets: np.ndarray
    vocab_size: int
    special: SpecialTokens
    continuation: np.ndarray | None = None  # (V,) True for "##" pieces; needed by whole-word masking

    @property
    def num_documents(self) -> int:
        return len(self.doc_offsets) - 1

    @property
    def num_segments(self) -> int:
        return len(self.seg_offsets) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.seg_offsets[-1])

    def segment(self, s: int) -> np.ndarray:
        return self.tokens[self.seg_offsets[s] : self.seg_offsets[s + 1]]


def select_documents(corpus: Corpus, docs: np.ndarray) -> Corpus:
    """A new in-memory corpus made of the given documents, in order."""
    segs = [np.arange(corpus.doc_offsets[d], corpus.doc_offsets[d + 1]) for d in docs]
    seg_ids = np.concatenate(segs) if segs else np.zeros(0, dtype=np.int64)
    lengths = np.diff(corpus.seg_offsets)[seg_ids]
    tokens = np.concatenate([corpus.segment(s) for s in seg_ids]) if len(seg_ids) else corpus.tokens[:0]
    seg_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    doc_offsets = np.concatenate([[0], np.cumsum([len(x) for x in segs])]).astype(np.int64)
    return replace(corpus, tokens=tokens, seg_offsets=seg_offsets, doc_offsets=doc_offsets)


def held_out_stride(fraction: float) -> int:
    """k: every k-th document is held out (0: none)."""
    return round(1 / fraction) if fraction > 0 else 0


def is_held_out(document: int, fraction: float, phase: int = 0) -> bool:
    """Whether document `document` (of a unit of this `phase`) is held out: every k-th, k = round(1/fraction)."""
    stride = held_out_stride(fraction)
    return bool(stride) and (document + phase) % stride == stride - 1


def held_out(num_documents: int, fraction: float) -> np.ndarray:
    """(D,) is_held_out for documents 0..D-1."""
    return np.array([is_held_out(d, fraction) for d in range(num_documents)], dtype=bool)


def synthetic_corpus(cfg: SyntheticConfig, vocab_size: int, special: SpecialTokens = SpecialTokens()) -> Corpus:
    """Documents from a seeded Markov chain: each keeps to one band of the vocabulary (NSP), each token has
    `branching` successors of falling probability (MLM)."""
    rng = np.random.default_rng(cfg.seed)
    low = special.first_regular_id
    regular = vocab_size - low
    num_topics = max(1, min(cfg.num_topics, regular // max(2, cfg.branching)))
    band = regular // num_topics
    topic_of = np.clip((np.arange(vocab_size) - low) // band, 0, num_topics - 1)
    successors = low + topic_of[:, None] * band + rng.integers(0, band, size=(vocab_size, cfg.branching))
    weights = 1.0 / np.arange(1, cfg.branching + 1)
    weights /= weights.sum()
    sentences_per_doc = rng.integers(cfg.min_sentences, cfg.max_sentences + 1, size=cfg.num_documents)
    lengths = rng.integers(cfg.min_sentence_length, cfg.max_sentence_length + 1, size=int(sentences_per_doc.sum()))
    seg_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    doc_offsets = np.concatenate([[0], np.cumsum(sentences_per_doc)]).astype(np.int64)
    tokens = np.empty(int(lengths.sum()), dtype=np.int64)
    picks = rng.choice(cfg.branching, size=len(tokens), p=weights)
    topics = rng.integers(0, num_topics, size=cfg.num_documents)
    first = low + topics * band + rng.integers(0, band, size=cfg.num_documents)
    starts = set(seg_offsets[doc_offsets[:-1]].tolist())
    doc = current = 0
    for i in range(len(tokens)):  # ~200k steps for the defaults: well under a second
        if i in starts:
            current = int(first[doc])
            doc += 1
        else:
            current = int(successors[current, picks[i]])
        tokens[i] = current
    dtype = np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.uint32
    return Corpus(tokens.astype(dtype), seg_offsets, doc_offsets, vocab_size=vocab_size, special=special)
