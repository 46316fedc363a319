"""The corpus abstraction: documents made of segments (sentences) of token ids.

A corpus is three flat arrays, the layout prepared shards use on disk too:
  tokens       (N,)    token ids of every segment, back to back
  seg_offsets  (S+1,)  segment s is tokens[seg_offsets[s]:seg_offsets[s+1]]
  doc_offsets  (D+1,)  document d is segments doc_offsets[d]..doc_offsets[d+1]-1
so a corpus can live in memory (synthetic) or in memory-mapped files without changing
the example builder.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bertcli.config import SyntheticConfig
from bertcli.errors import UsageError


@dataclass(frozen=True)
class SpecialTokens:
    """Ids of the special tokens; bertcli's own vocabularies put them first (0..4)."""

    pad: int = 0
    unk: int = 1
    cls: int = 2
    sep: int = 3
    mask: int = 4

    @property
    def first_regular_id(self) -> int:
        """The first id above every special one (where the synthetic corpus starts its words)."""
        return max(self.ids) + 1

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(sorted({self.pad, self.unk, self.cls, self.sep, self.mask}))

    def random_regular(self, rng: np.random.Generator, vocab_size: int, size: int) -> np.ndarray:
        """`size` ids drawn uniformly from every id in [0, vocab_size) that is not special, wherever
        the special ones are (a loaded vocabulary may put [MASK] last). With the specials first
        (bertcli's own vocabularies) this is exactly rng.integers(5, vocab_size, size)."""
        ids = rng.integers(0, vocab_size - len(self.ids), size=size)
        for special in self.ids:  # ascending: each one moves the draws at or above it up by one
            ids += ids >= special
        return ids


class PartTokens:
    """The token ids of several shards (memory-mapped arrays, one per part of a prepared corpus) read
    as one array, in order, without copying them into one: what Corpus.tokens is for a corpus
    prepared in several parts. Slicing is all the example builder needs; a slice inside one part (a
    segment or a document never spans two) is a view of its array, one across parts a copy."""

    def __init__(self, pieces: list[np.ndarray]) -> None:
        self.pieces = pieces
        self.starts = np.concatenate([[0], np.cumsum([len(p) for p in pieces])]).astype(np.int64)  # (P+1,)
        self.dtype = pieces[0].dtype if pieces else np.dtype(np.uint16)

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    def __getitem__(self, index: slice) -> np.ndarray:
        if not isinstance(index, slice):
            raise TypeError("PartTokens takes slices only (tokens[a:b])")
        lo, hi, step = index.indices(len(self))
        if step != 1:
            raise TypeError("PartTokens takes slices of step 1 only")
        if hi <= lo:
            return np.zeros(0, dtype=self.dtype)
        first = int(np.searchsorted(self.starts, lo, side="right")) - 1
        last = int(np.searchsorted(self.starts, hi, side="left")) - 1
        if first == last:  # the usual case: one part
            base = int(self.starts[first])
            return self.pieces[first][lo - base : hi - base]
        return np.concatenate(
            [
                self.pieces[p][
                    max(lo, int(self.starts[p])) - int(self.starts[p]) : min(hi, int(self.starts[p + 1]))
                    - int(self.starts[p])
                ]
                for p in range(first, last + 1)
            ]
        )


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

    def document_of_segment(self) -> np.ndarray:
        """(S,) the document each segment belongs to."""
        return np.repeat(np.arange(self.num_documents), np.diff(self.doc_offsets))


def select_documents(corpus: Corpus, docs: np.ndarray) -> Corpus:
    """A new in-memory corpus made of the given documents, in order."""
    segs = [np.arange(corpus.doc_offsets[d], corpus.doc_offsets[d + 1]) for d in docs]
    seg_ids = np.concatenate(segs) if segs else np.zeros(0, dtype=np.int64)
    lengths = np.diff(corpus.seg_offsets)[seg_ids]
    tokens = np.concatenate([corpus.segment(s) for s in seg_ids]) if len(seg_ids) else corpus.tokens[:0]
    return Corpus(
        tokens=tokens,
        seg_offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        doc_offsets=np.concatenate([[0], np.cumsum([len(x) for x in segs])]).astype(np.int64),
        vocab_size=corpus.vocab_size,
        special=corpus.special,
        continuation=corpus.continuation,
    )


def held_out_stride(fraction: float) -> int:
    """k: every k-th document is held out (0: none)."""
    return round(1 / fraction) if fraction > 0 else 0


def is_held_out(document: int, fraction: float, phase: int = 0) -> bool:
    """Whether document number `document` is held out: every k-th one, k = round(1/fraction), the
    first of them at k - 1 - phase % k. (Prepared data counts documents per part of the corpus, each
    part with a phase of its own, taken from its contents: see prepare.py.)"""
    stride = held_out_stride(fraction)
    return bool(stride) and (document + phase) % stride == stride - 1


def held_out(num_documents: int, fraction: float) -> np.ndarray:
    """(D,) is_held_out for documents 0..D-1."""
    return np.array([is_held_out(d, fraction) for d in range(num_documents)], dtype=bool)


def synthetic_corpus(cfg: SyntheticConfig, vocab_size: int, special: SpecialTokens = SpecialTokens()) -> Corpus:
    """Documents from a seeded random Markov chain, with structure a small BERT can learn.

    The regular vocabulary is cut into `num_topics` bands; each document stays in one band
    (so a random next sentence from another document is usually detectable: NSP is learnable),
    and each token has `branching` possible successors with falling probabilities (so masked
    tokens are predictable from their neighbours: MLM is learnable). The chain runs on across
    sentence boundaries inside a document, so B really continues A.
    """
    rng = np.random.default_rng(cfg.seed)
    low = special.first_regular_id
    regular = vocab_size - low
    if regular < 2:
        raise UsageError(f"model.vocab_size={vocab_size} leaves no room for regular tokens after the special ones")
    num_topics = max(1, min(cfg.num_topics, regular // max(2, cfg.branching)))
    band = regular // num_topics
    # successors[t] = `branching` token ids drawn from t's own band.
    ids = np.arange(vocab_size)
    topic_of = np.clip((ids - low) // band, 0, num_topics - 1)
    successors = low + topic_of[:, None] * band + rng.integers(0, band, size=(vocab_size, cfg.branching))
    weights = 1.0 / np.arange(1, cfg.branching + 1)
    weights /= weights.sum()

    sentences_per_doc = rng.integers(cfg.min_sentences, cfg.max_sentences + 1, size=cfg.num_documents)
    lengths = rng.integers(cfg.min_sentence_length, cfg.max_sentence_length + 1, size=int(sentences_per_doc.sum()))
    tokens = np.empty(int(lengths.sum()), dtype=np.int64)
    picks = rng.choice(cfg.branching, size=len(tokens), p=weights)
    doc_starts = np.concatenate([[0], np.cumsum(lengths)])[np.concatenate([[0], np.cumsum(sentences_per_doc)])[:-1]]
    first = (
        low + rng.integers(0, num_topics, size=cfg.num_documents) * band + rng.integers(0, band, size=cfg.num_documents)
    )
    starts = set(doc_starts.tolist())
    doc = 0
    current = 0
    for i in range(len(tokens)):  # ~200k steps for the defaults: well under a second
        if i in starts:
            current = int(first[doc])
            doc += 1
        else:
            current = int(successors[current, picks[i]])
        tokens[i] = current

    dtype = np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.uint32
    return Corpus(
        tokens=tokens.astype(dtype),
        seg_offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        doc_offsets=np.concatenate([[0], np.cumsum(sentences_per_doc)]).astype(np.int64),
        vocab_size=vocab_size,
        special=special,
    )
