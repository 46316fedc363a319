"""BERT examples made on the fly from an epoch's chunks (chunks.Windows): NSP pairs (without pairs, rows packed across
documents), dynamic MLM masks. Example i of step k is example g = k * examples_per_step + i of the stream, seeded by
(seed, stream, k, i): a batch is a function of (seed, step), whatever the split over micro-batches or ranks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, fields
from typing import TYPE_CHECKING, Any

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
    documents: tuple[int, int] = (-1, -1)  # documents A and B came from (a packed row: its first and last)


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
        """Whether a row is shorter than the batch (attention needs the mask); asked of the host copy."""
        return bool((self.valid_lens < self.input_ids.shape[1]).any())

    def to(self, device: torch.device, non_blocking: bool = False) -> Batch:
        return Batch(**{f.name: getattr(self, f.name).to(device, non_blocking=non_blocking) for f in fields(self)})

    def pin_memory(self) -> Batch:
        return Batch(**{f.name: getattr(self, f.name).pin_memory() for f in fields(self)})


class ExampleBuilder:
    """Examples of a corpus; `examples_per_step`: train.batch_size, over all processes."""

    TRAIN, EVAL = 0, 1  # example streams: the held-out set never shares a seed with training
    PIECE, BLOCK_SEGMENTS, WINDOW_BLOCKS = PIECE, BLOCK_SEGMENTS, WINDOW_BLOCKS  # chunks'; tests set smaller ones
    CACHED_WINDOWS, CACHED_EPOCHS = 2, 2  # a step at a window's end reads two; epochs' window starts kept

    def __init__(self, corpus: Corpus, cfg: DataConfig, examples_per_step: int) -> None:
        self.corpus, self.cfg, self.examples_per_step = corpus, cfg, examples_per_step
        if corpus.num_documents < 2 and cfg.pairs:
            raise UsageError("NSP needs at least 2 documents: add some, or set data.pairs: false, train.nsp_weight: 0")
        # Plain ndarray views of the (memory-mapped) arrays, not copies: np.memmap slows every small read.
        self.offsets = np.asarray(corpus.seg_offsets)  # (S+1,) token offset of each segment
        self.doc_offsets = np.asarray(corpus.doc_offsets)  # (D+1,) first segment of each document
        self.max_tokens = cfg.max_seq_length - (3 if cfg.pairs else 2)
        # Without pairs a row is packed across documents (RoBERTa's FULL-SENTENCES): the cut sees spans of PIECE
        # segments, and a [SEP] ends each document inside a row.
        segments = len(self.offsets) - 1
        spans = self.doc_offsets if cfg.pairs else np.append(np.arange(0, segments, self.PIECE), segments)
        sizes = {"piece": self.PIECE, "block_segments": self.BLOCK_SEGMENTS, "window_blocks": self.WINDOW_BLOCKS}
        seps = None if cfg.pairs else self.doc_offsets
        self.windows = Windows(self.offsets, spans, max_tokens=self.max_tokens, cfg=cfg, seps=seps, **sizes)
        self._windows: dict[tuple[int, int, int, int], ChunkIndex] = {}  # the latest cut, oldest first
        self._slots: dict[tuple[int, int, int], np.ndarray] = {}  # (W+1,) window starts of recent epochs
        self._epoch_length: dict[tuple[int, int], int] = {}  # (one window)
        self._slot_count = int(self.windows.slots.sum()) if self.windows.num_windows > 1 else 0  # L (several)

    def _document(self, s: int) -> int:
        return int(np.searchsorted(self.doc_offsets, s, side="right")) - 1

    def _chunk(self, s: int, target: int) -> int:
        """End of the fewest segments from s that reach `target` tokens, within s's document (at least one)."""
        doc_end = int(self.doc_offsets[self._document(s) + 1])
        end = int(np.searchsorted(self.offsets, self.offsets[s] + target, side="left"))
        return min(max(end, s + 1), doc_end)

    def _tokens(self, first: int, end: int) -> np.ndarray:
        return np.asarray(self.corpus.tokens[self.offsets[first] : self.offsets[end]], dtype=np.int64)

    def _packed(self, first: int, end: int, skip: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, positions of their [SEP]s) of a row: from slot `skip` of segments first..end-1 with a [SEP] after
        each document's end, max_tokens slots at most (read alone: a long segment's rows each read their own)."""
        doc_ends = self.doc_offsets[self._document(first) + 1 : self._document(end - 1) + 1]  # (k,) segments
        at = np.asarray(self.offsets[doc_ends] - self.offsets[first], dtype=np.int64)  # (k,) tokens before each
        slots = at + np.arange(len(at))  # (k,) each [SEP]'s slot
        before = int(np.searchsorted(slots, skip))  # [SEP]s in the rows before
        lo = int(self.offsets[first]) + skip - before  # the row's first token
        tokens = np.asarray(self.corpus.tokens[lo : min(lo + self.max_tokens, int(self.offsets[end]))], np.int64)
        ends = slots[(slots >= skip) & (slots < skip + self.max_tokens)] - skip  # the row's (none past its tokens)
        return np.insert(tokens, ends - np.arange(len(ends)), self.corpus.special.sep)[: self.max_tokens], ends

    def build_epoch(self, seed: int, stream: int, epoch: int) -> ChunkIndex:
        """Every window of the epoch, in order (for tests and inspection; training holds CACHED_WINDOWS)."""
        parts = [self._window(seed, stream, epoch, w) for w in range(self.windows.num_windows)]
        return ChunkIndex(*(np.concatenate(column) for column in zip(*parts)))

    def _window(self, seed: int, stream: int, epoch: int, w: int) -> ChunkIndex:
        return _cached(self._windows, self.CACHED_WINDOWS, (seed, stream, epoch, w), self.windows.window)

    def _window_starts(self, seed: int, stream: int, epoch: int) -> np.ndarray:
        """(W+1,) the position in the epoch where each window's chunks start (several windows)."""
        make = lambda *key: self.windows.window_slots(self.windows.order(*key))  # noqa: E731
        return _cached(self._slots, self.CACHED_EPOCHS, (seed, stream, epoch), make)

    def _locate(self, seed: int, stream: int, g: int) -> tuple[ChunkIndex, int]:
        """(the window, the chunk in it) of example g of the stream, found without cutting the windows before it."""
        if self.windows.num_windows == 1:  # L: epoch 0's chunk count
            length = _cached(self._epoch_length, 16, (seed, stream), lambda *key: len(self._window(*key, 0, 0).first))
            (epoch, position), w, start = divmod(g, length), 0, 0
        else:
            epoch, position = divmod(g, self._slot_count)
            starts = self._window_starts(seed, stream, epoch)
            w = int(np.searchsorted(starts, position, side="right")) - 1
            start = int(starts[w])
        index = self._window(seed, stream, epoch, w)
        return index, (position - start) % len(index.first)

    def chunk(self, seed: int, stream: int, g: int) -> tuple[int, int, int, bool, int, int]:
        """(first segment, end, end of A, random B, target, skip) of example number g of the stream."""
        return _chunk_at(*self._locate(seed, stream, g))

    def _random_start(self, index: ChunkIndex, *, doc: int, rng: np.random.Generator) -> tuple[int, int]:
        """(first segment, document) of a random B: a random chunk's start in another document of the window (drawn
        by length, as A's are); rarely, a uniform start in a uniformly drawn other document."""
        for _ in range(10):
            first = int(index.first[int(rng.integers(len(index.first)))])
            other = self._document(first)
            if other != doc:
                return first, other
        other = (doc + 1 + int(rng.integers(self.corpus.num_documents - 1))) % self.corpus.num_documents
        return int(rng.integers(self.doc_offsets[other], self.doc_offsets[other + 1])), other

    def example(self, seed: int, step: int, i: int, stream: int = TRAIN) -> Example:
        """Example i of step `step`: its chunk, then B, trimming and masking drawn from seed (seed, stream, step, i)."""
        c, cfg, sp = self.corpus, self.cfg, self.corpus.special
        index, j = self._locate(seed, stream, step * self.examples_per_step + i)
        first, end, a_end, random_next, target, skip = _chunk_at(index, j)
        rng = np.random.default_rng([seed, stream, step, i])
        doc = self._document(first)
        ends = np.zeros(0, dtype=np.int64)  # the [SEP]s that end documents inside a packed row (positions in A)
        if not cfg.pairs:
            (a, ends), b, nsp_label, b_doc = self._packed(first, end, skip), [], IGNORE, self._document(end - 1)
        else:
            a = self._tokens(first, a_end)
            if random_next:
                b_first, b_doc = self._random_start(index, doc=doc, rng=rng)
                b, nsp_label = self._tokens(b_first, self._chunk(b_first, max(1, target - len(a)))), 1
            else:
                b, nsp_label, b_doc = self._tokens(a_end, end), 0, doc
            a, b = truncate_pair(a, b, self.max_tokens, rng)
        tail = [b, [sp.sep]] if cfg.pairs else []  # without pairs: [CLS] A [SEP]
        tokens = np.concatenate([[sp.cls], a, [sp.sep], *tail]).astype(np.int64)
        segments = np.zeros(len(tokens), dtype=np.int64)
        segments[len(a) + 2 :] = 1
        special = np.zeros(len(tokens), dtype=bool)
        special[[0, len(a) + 1, len(tokens) - 1]] = True
        special[1 + ends] = True
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


def _chunk_at(index: ChunkIndex, j: int) -> tuple[int, int, int, bool, int, int]:
    """(first segment, end, end of A, random B, target, skip) of chunk j of a window."""
    first, count, a_count, random_next, target, skip = (column[j].item() for column in index)
    return first, first + count, first + a_count, bool(random_next), target, skip


def _cached(cache: dict, limit: int, key: tuple, make: Callable) -> Any:
    """cache[key], made by make(*key) where missing; the oldest entry goes past `limit`."""
    if key not in cache:
        if len(cache) >= limit:
            del cache[next(iter(cache))]
        cache[key] = make(*key)
    return cache[key]


@dataclass
class StepBatches:
    """torch's map-style dataset: item i is this process's rows (m*W + rank)*B onwards of micro-batch m = i % A of
    step first_step + i // A, a pure function of (seed, step, rank) that workers build ahead."""

    builder: ExampleBuilder
    _: KW_ONLY
    seed: int
    first_step: int
    last_step: int
    batch_size: int  # B
    accum_steps: int  # A
    rank: int = 0
    world_size: int = 1  # W

    def __len__(self) -> int:
        return (self.last_step - self.first_step) * self.accum_steps

    def __getitem__(self, i: int) -> Batch:
        step, micro = divmod(i, self.accum_steps)
        first = (micro * self.world_size + self.rank) * self.batch_size
        return self.builder.batch(self.seed, self.first_step + step, range(first, first + self.batch_size))


def truncate_pair(a: np.ndarray, b: np.ndarray, limit: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Google BERT's truncate_seq_pair: trim the longer side (B where equal), one token at a random end each time."""
    lo, hi = [0, 0], [len(a), len(b)]  # of A and B
    while (hi[0] - lo[0]) + (hi[1] - lo[1]) > limit:
        side = 0 if hi[0] - lo[0] > hi[1] - lo[1] else 1
        if rng.random() < 0.5:
            lo[side] += 1
        else:
            hi[side] -= 1
    return a[lo[0] : hi[0]], b[lo[1] : hi[1]]


def _words(candidates: np.ndarray, tokens: np.ndarray, continuation: np.ndarray) -> list[np.ndarray]:
    """Candidate positions grouped into words: a "##" piece joins the word of the position just before it."""
    joins = continuation[tokens[candidates]] & np.concatenate([[False], np.diff(candidates) == 1])
    return np.split(candidates, np.flatnonzero(~joins)[1:])


def mask_tokens(
    tokens: np.ndarray, special: np.ndarray, *, cfg: DataConfig, corpus: Corpus, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(masked tokens, positions, labels): masked_lm_prob of the non-special tokens (whole words with whole_word_mask,
    at most max_predictions_per_seq), each made [MASK], a random regular token or kept."""
    candidates = np.flatnonzero(~special)
    n = min(cfg.max_predictions_per_seq, max(1, int(round(len(candidates) * cfg.masked_lm_prob))), len(candidates))
    if cfg.whole_word_mask and corpus.continuation is not None:
        chosen, count = [], 0
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
    labels, masked = tokens[positions], tokens.copy()  # (fancy indexing copies)
    r = rng.random(len(positions))
    to_mask = r < cfg.mask_token_prob
    to_random = (r >= cfg.mask_token_prob) & (r < cfg.mask_token_prob + cfg.random_token_prob)
    masked[positions[to_mask]] = corpus.special.mask
    masked[positions[to_random]] = corpus.special.random_regular(rng, corpus.vocab_size, int(to_random.sum()))
    return masked, positions, labels


def padded_width(longest: int, max_length: int) -> int:
    """A batch's width: its longest row rounded up to 8 (few shapes), never past max_length (no position embedding)."""
    return min(-(-longest // 8) * 8, max(longest, max_length))


def collate(examples: list[Example], max_predictions: int, pad_id: int, max_length: int) -> Batch:
    """Examples padded to padded_width."""
    import torch

    from bertcli.model import packing

    def padded(field: str, width: int, fill: int) -> torch.Tensor:  # (B, width) int64
        out = np.full((len(examples), width), fill, dtype=np.int64)
        for row, e in enumerate(examples):
            out[row, : len(getattr(e, field))] = getattr(e, field)
        return torch.from_numpy(out)

    T = padded_width(max(len(e.tokens) for e in examples), max_length)
    valid_lens = torch.tensor([len(e.tokens) for e in examples], dtype=torch.int64)
    return Batch(
        input_ids=padded("tokens", T, pad_id),
        token_type_ids=padded("segments", T, 0),
        valid_lens=valid_lens,
        pred_positions=padded("pred_positions", max_predictions, 0),
        mlm_labels=padded("pred_labels", max_predictions, IGNORE),
        nsp_labels=torch.tensor([e.nsp_label for e in examples], dtype=torch.int64),
        packed=packing(valid_lens, T),  # built here, in the example workers, and pinned with the rest
    )
