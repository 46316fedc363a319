"""BERT examples: sentence pairs for NSP and dynamic masking for MLM, made on the fly.

Coverage follows Google BERT's create_instances_from_document: every epoch, each document is cut
greedily into chunks from its start (a new random cut per epoch, seeded by (seed, epoch)), and the
epoch's chunks are shuffled (the same seed), a window of about 262,144 sentences at a time from
blocks all over the corpus (chunks.Windows; a smaller corpus is one window). Example i of step k
is example number g = k * examples_per_step + i of the stream: position g % L of epoch g // L (L:
the number of chunks of epoch 0, or with several windows the sum of their estimated counts),
drawn with its own generator seeded by (seed, k, i). So the batch at step k is a pure function of
(seed, k): a run replays the same examples and masks, resuming needs no skipping, and any split of
a step's examples across micro-batches or ranks sees exactly the examples of a single large batch;
one pass shows every sentence of the corpus, from each document's first (with several windows,
all but the share by which a window's count misses its estimate); and reaching an example takes
the memory and time of one window, whatever the size of the corpus.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np

from bertcli.config import DataConfig
from bertcli.data.chunks import BLOCK_SEGMENTS, PIECE, WINDOW_BLOCKS, ChunkIndex, Windows
from bertcli.data.corpus import Corpus
from bertcli.errors import UsageError

if TYPE_CHECKING:  # only collate makes tensors: examples are numpy, and inspect shows them without torch
    import torch

    from bertcli.model import Packing

IGNORE = -100  # label of padded prediction slots: cross_entropy(ignore_index=IGNORE) skips them


@dataclass(kw_only=True)
class Example:
    tokens: np.ndarray  # (T,) [CLS] A [SEP] B [SEP], masked
    segments: np.ndarray  # (T,) 0 for [CLS] A [SEP], 1 for B [SEP]
    pred_positions: np.ndarray  # (n,) positions chosen for MLM, ascending
    pred_labels: np.ndarray  # (n,) original tokens at those positions
    nsp_label: int  # 0 = B follows A, 1 = B is random, IGNORE without pairs
    documents: tuple[int, int] = (-1, -1)  # documents A and B came from (for tests and inspection)


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, T) int64
    token_type_ids: torch.Tensor  # (B, T) int64
    valid_lens: torch.Tensor  # (B,) int64, non-padding tokens per row
    pred_positions: torch.Tensor  # (B, P) int64, padded slots point at 0
    mlm_labels: torch.Tensor  # (B, P) int64, IGNORE in padded slots
    nsp_labels: torch.Tensor  # (B,) int64
    packed: Packing  # where the real tokens are, for the unpadded encoder (train.unpad)

    def has_padding(self) -> bool:
        """Whether a row is shorter than the batch is wide, so attention needs the key-padding mask
        (collate rounds the width up to 8: rows all of one length can still be padded). Ask the
        host copy, before `to`: on a GPU the answer would wait for the device."""
        return bool((self.valid_lens < self.input_ids.shape[1]).any())

    def to(self, device: torch.device, non_blocking: bool = False) -> Batch:
        return Batch(**{f.name: getattr(self, f.name).to(device, non_blocking=non_blocking) for f in fields(self)})

    def pin_memory(self) -> Batch:
        return Batch(**{f.name: getattr(self, f.name).pin_memory() for f in fields(self)})


class ExampleBuilder:
    """Builds examples from a corpus; `batch(seed, step, indices)` is a pure function.

    `examples_per_step` is the global batch (batch_size x grad_accum_steps x processes): example
    i of step k is example k * examples_per_step + i of the stream's sequence of epochs.
    """

    TRAIN, EVAL = 0, 1  # example streams: the held-out set never shares a seed with training
    PIECE = PIECE  # segments: longer documents are cut in pieces of this many, which bounds the
    # rounds of the vectorised cutting (a chunk never spans two pieces; B still follows A across them)
    BLOCK_SEGMENTS, WINDOW_BLOCKS = BLOCK_SEGMENTS, WINDOW_BLOCKS  # an epoch is cut in windows (chunks.Windows)
    CACHED_WINDOWS = 2  # a step at a window's end reads two
    CACHED_EPOCHS = 2  # epochs whose windows' positions are kept ((W+1,) each)

    def __init__(self, corpus: Corpus, cfg: DataConfig, examples_per_step: int) -> None:
        self.corpus, self.cfg, self.examples_per_step = corpus, cfg, examples_per_step
        if corpus.num_documents < 2 and cfg.pairs:
            raise UsageError(
                "the corpus needs at least 2 documents to build NSP pairs (random next sentences "
                "come from another document): add documents, or set data.pairs: false and "
                "train.nsp_weight: 0"
            )
        # Plain ndarray views of the (memory-mapped) arrays, never copies: np.memmap adds Python-level work to
        # every small read, which slows the builder.
        self.offsets = np.asarray(corpus.seg_offsets)  # (S+1,) token offset of each segment
        self.doc_offsets = np.asarray(corpus.doc_offsets)  # (D+1,) first segment of each document
        self.max_tokens = cfg.max_seq_length - (3 if cfg.pairs else 2)
        # The blocks and their estimated chunk counts: O(S / BLOCK_SEGMENTS) memory, made once (before the
        # example workers fork, which share them).
        self.windows = Windows(
            self.offsets,
            self.doc_offsets,
            max_tokens=self.max_tokens,
            cfg=cfg,
            piece=self.PIECE,
            block_segments=self.BLOCK_SEGMENTS,
            window_blocks=self.WINDOW_BLOCKS,
        )
        self._windows: dict[tuple[int, int, int, int], ChunkIndex] = {}  # the latest cut, oldest first
        self._slots: dict[tuple[int, int, int], np.ndarray] = {}  # (W+1,) window starts of recent epochs
        self._epoch_length: dict[tuple[int, int], int] = {}

    def _document(self, s: int) -> int:
        return int(np.searchsorted(self.doc_offsets, s, side="right")) - 1

    def _chunk(self, s: int, target: int) -> int:
        """End (exclusive) of the chunk of consecutive segments from s: the fewest that reach
        `target` tokens, stopping at the document's end; at least one segment."""
        doc_end = int(self.doc_offsets[self._document(s) + 1])
        end = int(np.searchsorted(self.offsets, self.offsets[s] + target, side="left"))
        return min(max(end, s + 1), doc_end)

    def _tokens(self, first: int, end: int) -> np.ndarray:
        return np.asarray(self.corpus.tokens[self.offsets[first] : self.offsets[end]], dtype=np.int64)

    def build_epoch(self, seed: int, stream: int, epoch: int) -> ChunkIndex:
        """Google's create_instances_from_document over every document at once, vectorised: round r
        cuts the r-th chunk of every document (piece) not yet finished. A chunk takes segments from
        the current one until it reaches its target (max_tokens, or with short_seq_prob a random
        2..max_tokens) or the document's end. With pairs, A is its first 1..count-1 segments (uniform);
        B is the rest or, with random_next_prob (always for a one-segment chunk), random, and then
        the unused segments start the next chunk (Google puts them back), so each sentence is in
        an A or a true B once per epoch. A last short sentence left alone is paired with the one
        before it as A (true B) or, with random_next_prob, alone with a random B: a document's end
        is neither lost nor a forced random B. Then the chunks are shuffled, a window at a time
        (chunks.Windows): this is every window of the epoch, in order, for tests and inspection
        (training holds CACHED_WINDOWS windows, never the whole epoch)."""
        parts = [self._window(seed, stream, epoch, w) for w in range(self.windows.num_windows)]
        return ChunkIndex(*(np.concatenate(column) for column in zip(*parts)))

    def _window(self, seed: int, stream: int, epoch: int, w: int) -> ChunkIndex:
        key = (seed, stream, epoch, w)
        if key not in self._windows:
            if len(self._windows) >= self.CACHED_WINDOWS:
                del self._windows[next(iter(self._windows))]
            self._windows[key] = self.windows.window(seed, stream, epoch, w)
        return self._windows[key]

    def _window_starts(self, seed: int, stream: int, epoch: int) -> np.ndarray:
        """(W+1,) the position in the epoch where each window's chunks start (several windows)."""
        key = (seed, stream, epoch)
        if key not in self._slots:
            if len(self._slots) >= self.CACHED_EPOCHS:
                del self._slots[next(iter(self._slots))]
            self._slots[key] = self.windows.window_slots(self.windows.order(seed, stream, epoch))
        return self._slots[key]

    def _locate(self, seed: int, stream: int, g: int) -> tuple[ChunkIndex, int]:
        """(the window, the chunk in it) of example number g of the stream. Epochs all have the
        same length L (epoch 0's chunk count with one window, else the sum of the estimated
        counts: chunks.Windows), and so do a window's positions in every epoch, so g maps to one
        without cutting anything before it; a window with fewer chunks than positions wraps around,
        one with more leaves its last out."""
        if (seed, stream) not in self._epoch_length:
            self._epoch_length[(seed, stream)] = (
                len(self._window(seed, stream, 0, 0).first)
                if self.windows.num_windows == 1
                else int(self.windows.slots.sum())
            )
        epoch, position = divmod(g, self._epoch_length[(seed, stream)])
        if self.windows.num_windows == 1:
            w, start = 0, 0
        else:
            starts = self._window_starts(seed, stream, epoch)
            w = int(np.searchsorted(starts, position, side="right")) - 1
            start = int(starts[w])
        index = self._window(seed, stream, epoch, w)
        return index, (position - start) % len(index.first)

    def chunk(self, seed: int, stream: int, g: int) -> tuple[int, int, int, bool, int]:
        """(first segment, end, end of A, random B, target) of example number g of the stream."""
        return _chunk_at(*self._locate(seed, stream, g))

    def _random_start(self, index: ChunkIndex, *, doc: int, rng: np.random.Generator) -> tuple[int, int]:
        """(first segment, document) of a random B: where a random chunk of the same window starts,
        in another document. Documents are so drawn in proportion to their length, as A's are (a
        uniform draw over documents would show the tokens of short ones more often), and B starts
        at a document's first sentence as often as A does; the window's blocks come from all over
        the corpus. Rarely (documents that hold most of the window), a uniform start in a uniformly
        drawn other document of the corpus. `index`: the window of the example."""
        for _ in range(10):
            first = int(index.first[int(rng.integers(len(index.first)))])
            other = self._document(first)
            if other != doc:
                return first, other
        other = (doc + 1 + int(rng.integers(self.corpus.num_documents - 1))) % self.corpus.num_documents
        return int(rng.integers(self.doc_offsets[other], self.doc_offsets[other + 1])), other

    def example(self, seed: int, step: int, i: int, stream: int = TRAIN) -> Example:
        """Example i of step `step`: its chunk from its window of the epoch, the rest (random B's document
        and start, trimming, masking) from a generator seeded by (seed, stream, step, i)."""
        c, cfg, sp = self.corpus, self.cfg, self.corpus.special
        index, j = self._locate(seed, stream, step * self.examples_per_step + i)
        first, end, a_end, random_next, target = _chunk_at(index, j)
        rng = np.random.default_rng([seed, stream, step, i])
        doc = self._document(first)
        if not cfg.pairs:
            span = self._tokens(first, end)[: self.max_tokens]
            tokens = np.concatenate([[sp.cls], span, [sp.sep]]).astype(np.int64)
            special = np.zeros(len(tokens), dtype=bool)
            special[[0, -1]] = True
            masked, positions, labels = mask_tokens(tokens, special, cfg=cfg, corpus=c, rng=rng)
            return Example(
                tokens=masked,
                segments=np.zeros(len(tokens), dtype=np.int64),
                pred_positions=positions,
                pred_labels=labels,
                nsp_label=IGNORE,
                documents=(doc, doc),
            )
        a = self._tokens(first, a_end)
        if random_next:
            b_first, other = self._random_start(index, doc=doc, rng=rng)
            b, nsp_label, b_doc = self._tokens(b_first, self._chunk(b_first, max(1, target - len(a)))), 1, other
        else:
            b, nsp_label, b_doc = self._tokens(a_end, end), 0, doc
        a, b = truncate_pair(a, b, self.max_tokens, rng)
        tokens = np.concatenate([[sp.cls], a, [sp.sep], b, [sp.sep]]).astype(np.int64)
        segments = np.zeros(len(tokens), dtype=np.int64)
        segments[len(a) + 2 :] = 1
        special = np.zeros(len(tokens), dtype=bool)
        special[[0, len(a) + 1, len(tokens) - 1]] = True
        masked, positions, labels = mask_tokens(tokens, special, cfg=cfg, corpus=c, rng=rng)
        return Example(
            tokens=masked,
            segments=segments,
            pred_positions=positions,
            pred_labels=labels,
            nsp_label=nsp_label,
            documents=(doc, b_doc),
        )

    def batch(self, seed: int, step: int, indices: range, stream: int = TRAIN) -> Batch:
        """Examples `indices` of step `step`; padded to the longest row, rounded up to 8 within max_seq_length."""
        examples = [self.example(seed, step, i, stream) for i in indices]
        return collate(examples, self.cfg.max_predictions_per_seq, self.corpus.special.pad, self.cfg.max_seq_length)


def _chunk_at(index: ChunkIndex, j: int) -> tuple[int, int, int, bool, int]:
    """(first segment, end, end of A, random B, target) of chunk j of a window."""
    first = int(index.first[j])
    return (
        first,
        first + int(index.count[j]),
        first + int(index.a_count[j]),
        bool(index.random_next[j]),
        int(index.target[j]),
    )


class StepBatches:
    """A map-style dataset for torch's DataLoader (`len` and `[i]`, all the DataLoader asks):
    this process's micro-batches of steps `first_step` to `last_step - 1`, in training order:
    item i is micro-batch i % A of step first_step + i // A. Micro-batch m of a step is split
    over the W processes (rows (m*W + rank)*B onwards), so any W sees the examples of one process
    with the whole batch. Each item is a pure function of (seed, step, rank), so worker processes
    can build them ahead of the training step without changing a thing."""

    def __init__(
        self,
        builder: ExampleBuilder,
        *,
        seed: int,
        first_step: int,
        last_step: int,
        batch_size: int,
        accum_steps: int,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.builder, self.seed, self.first_step, self.last_step = builder, seed, first_step, last_step
        self.B, self.A, self.rank, self.W = batch_size, accum_steps, rank, world_size

    def __len__(self) -> int:
        return (self.last_step - self.first_step) * self.A

    def __getitem__(self, i: int) -> Batch:
        step, micro = self.first_step + i // self.A, i % self.A
        first = (micro * self.W + self.rank) * self.B
        return self.builder.batch(self.seed, step, range(first, first + self.B))


def truncate_pair(
    a: np.ndarray, b: np.ndarray, max_tokens: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Google BERT's truncate_seq_pair: trim the longer side, one token at a random end each time."""
    a_lo, a_hi, b_lo, b_hi = 0, len(a), 0, len(b)
    while (a_hi - a_lo) + (b_hi - b_lo) > max_tokens:
        if a_hi - a_lo > b_hi - b_lo:
            if rng.random() < 0.5:
                a_lo += 1
            else:
                a_hi -= 1
        elif rng.random() < 0.5:
            b_lo += 1
        else:
            b_hi -= 1
    return a[a_lo:a_hi], b[b_lo:b_hi]


def _words(candidates: np.ndarray, tokens: np.ndarray, continuation: np.ndarray | None) -> list[np.ndarray]:
    """Candidate positions grouped into words: a "##" piece joins the word of the position before
    it (never across a special token, which is not a candidate)."""
    if continuation is None:
        return [candidates[i : i + 1] for i in range(len(candidates))]
    joins = continuation[tokens[candidates]] & np.concatenate([[False], np.diff(candidates) == 1])
    return np.split(candidates, np.flatnonzero(~joins)[1:])


def mask_tokens(
    tokens: np.ndarray, special: np.ndarray, *, cfg: DataConfig, corpus: Corpus, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Choose masked_lm_prob of the non-special tokens (at most max_predictions_per_seq), whole words
    together with whole_word_mask; replace each chosen token by [MASK] (mask_token_prob), a random
    regular token (random_token_prob) or keep it. Returns (masked tokens, positions, labels)."""
    candidates = np.flatnonzero(~special)
    n = min(cfg.max_predictions_per_seq, max(1, int(round(len(candidates) * cfg.masked_lm_prob))), len(candidates))
    if cfg.whole_word_mask and corpus.continuation is not None:
        chosen: list[np.ndarray] = []
        count = 0
        words = _words(candidates, tokens, corpus.continuation)
        for w in rng.permutation(len(words)):  # Google's rule: skip a word that would overshoot n
            if count + len(words[w]) <= n:
                chosen.append(words[w])
                count += len(words[w])
                if count == n:
                    break
        positions = np.sort(np.concatenate(chosen)) if chosen else candidates[:1]
    else:
        positions = np.sort(rng.choice(candidates, size=n, replace=False))
    labels = tokens[positions].copy()
    masked = tokens.copy()
    r = rng.random(len(positions))
    to_mask = r < cfg.mask_token_prob
    to_random = (r >= cfg.mask_token_prob) & (r < cfg.mask_token_prob + cfg.random_token_prob)
    masked[positions[to_mask]] = corpus.special.mask
    masked[positions[to_random]] = corpus.special.random_regular(rng, corpus.vocab_size, int(to_random.sum()))
    return masked, positions, labels


def collate(examples: list[Example], max_predictions: int, pad_id: int, max_length: int) -> Batch:
    """Examples padded to the longest, rounded up to a multiple of 8 (a few distinct shapes only, and
    aligned for the matrix units) but never past max_length (data.max_seq_length, at most
    model.max_position_embeddings: a longer row has no position embedding)."""
    import torch

    from bertcli.model import packing

    B = len(examples)
    T = max(len(e.tokens) for e in examples)
    T = min(-(-T // 8) * 8, max(T, max_length))
    input_ids = np.full((B, T), pad_id, dtype=np.int64)
    token_type_ids = np.zeros((B, T), dtype=np.int64)
    pred_positions = np.zeros((B, max_predictions), dtype=np.int64)
    mlm_labels = np.full((B, max_predictions), IGNORE, dtype=np.int64)
    for row, e in enumerate(examples):
        input_ids[row, : len(e.tokens)] = e.tokens
        token_type_ids[row, : len(e.segments)] = e.segments
        pred_positions[row, : len(e.pred_positions)] = e.pred_positions
        mlm_labels[row, : len(e.pred_labels)] = e.pred_labels
    valid_lens = torch.tensor([len(e.tokens) for e in examples], dtype=torch.int64)
    return Batch(
        input_ids=torch.from_numpy(input_ids),
        token_type_ids=torch.from_numpy(token_type_ids),
        valid_lens=valid_lens,
        pred_positions=torch.from_numpy(pred_positions),
        mlm_labels=torch.from_numpy(mlm_labels),
        nsp_labels=torch.tensor([e.nsp_label for e in examples], dtype=torch.int64),
        packed=packing(valid_lens, T),  # built here, in the example workers, and pinned with the rest
    )
