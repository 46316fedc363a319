"""An epoch's cut of a corpus into chunks (Google BERT's create_instances_from_document, vectorised), from the
offsets alone, a window at a time (Windows): reaching an example takes a window's memory and time, not the corpus's."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bertcli.config import DataConfig

PIECE = 4096  # segments: longer documents are cut in pieces of this many, bounding the rounds of Windows.cut
BLOCK_SEGMENTS = 512  # segments: blocks (whole pieces, about this many segments) are what an epoch shuffles
WINDOW_BLOCKS = 512  # blocks cut and shuffled together: a window of about 262,144 segments
CALIBRATION_BLOCKS = 256  # blocks cut once to estimate every block's chunk count (Windows.slots)
# Last words of the seeds of a window's cut, of an epoch's block order and of the estimate's cut: five words in
# all, never the four of an example's (seed, stream, step, i) (nor, as SeedSequence pads with zeros, three).
WINDOW_KEY, ORDER_KEY, CALIBRATION_KEY = 1, 2, 3


class ChunkIndex(NamedTuple):
    """Chunks, in a window's (shuffled) order. Chunk j is segments first[j]..first[j] + count[j] - 1 of one document;
    A is its first a_count[j], B the rest, or (random_next[j]) about target[j] - len(A) tokens of another. A packed
    row (no pairs) is target[j] tokens of a piece from skip[j] tokens into segment first[j]: rows tile the piece."""

    first: np.ndarray  # (C,) int32 or int64
    count: np.ndarray  # (C,) uint16 or int32, >= 1
    a_count: np.ndarray  # (C,) like count, 1..count (count only when B is random)
    random_next: np.ndarray  # (C,) bool
    target: np.ndarray  # (C,) like count: the chunk's target length in tokens
    skip: np.ndarray  # (C,) like first: tokens of segment first[j] in the row before (packed rows; else 0)


def document_pieces(doc_offsets: np.ndarray, lo: int, hi: int, piece: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, has_previous) of the pieces of segments lo..hi-1: documents, cut every `piece` segments."""
    first_doc = int(np.searchsorted(doc_offsets, lo, side="right")) - 1
    last_doc = int(np.searchsorted(doc_offsets, hi, side="left"))  # documents first_doc..last_doc-1 overlap
    doc_start = np.asarray(doc_offsets[first_doc:last_doc], dtype=np.int64)
    doc_end = np.asarray(doc_offsets[first_doc + 1 : last_doc + 1], dtype=np.int64)
    part_start, part_end = np.maximum(doc_start, lo), np.minimum(doc_end, hi)
    per_part = -(-(part_end - part_start) // piece)
    k = np.arange(int(per_part.sum())) - np.repeat(np.cumsum(per_part) - per_part, per_part)
    start = np.repeat(part_start, per_part) + k * piece
    end = np.minimum(start + piece, np.repeat(part_end, per_part))
    return start, end, start > np.repeat(doc_start, per_part)


def cut_epoch(
    offsets: np.ndarray, doc_offsets: np.ndarray, *, max_tokens: int, cfg: DataConfig, rng: np.random.Generator
) -> ChunkIndex:
    """The chunks of one epoch of a whole corpus, shuffled, as one window."""
    whole = Windows(offsets, doc_offsets, max_tokens=max_tokens, cfg=cfg, window_blocks=len(offsets))
    return _shuffled(whole.cut(np.arange(whole.num_blocks), rng)[0], rng)


def _shuffled(index: ChunkIndex, rng: np.random.Generator) -> ChunkIndex:
    order = rng.permutation(len(index.first))
    return ChunkIndex(*(column[order] for column in index))


class Windows:
    """An epoch of a corpus cut in windows, in memory and time bounded by a window's size. Blocks (whole pieces, about
    BLOCK_SEGMENTS segments) are ordered at random per epoch and taken WINDOW_BLOCKS at a time; a window is cut and
    shuffled alone. Window w has the sum of its blocks' estimated chunk counts (`slots`) as positions, known without
    cutting: one short of chunks repeats its first, one over leaves its last out (one window: cut as cut_epoch)."""

    def __init__(
        self,
        offsets: np.ndarray,
        doc_offsets: np.ndarray,
        *,
        max_tokens: int,
        cfg: DataConfig,
        piece: int = PIECE,
        block_segments: int = BLOCK_SEGMENTS,
        window_blocks: int = WINDOW_BLOCKS,
        seps: np.ndarray | None = None,
    ) -> None:
        self.offsets, self.doc_offsets, self.seps = offsets, doc_offsets, seps  # seps: (D+1,) of packed rows
        self.max_tokens, self.cfg, self.piece = max_tokens, cfg, piece
        self.num_segments = len(offsets) - 1
        # Blocks: cut at the piece boundary at or after each multiple of block_segments. (B+1,) segments.
        targets = np.arange(block_segments, self.num_segments, block_segments, dtype=np.int64)
        doc = np.searchsorted(doc_offsets, targets, side="right") - 1
        doc_start = np.asarray(doc_offsets[doc], dtype=np.int64)
        doc_end = np.asarray(doc_offsets[doc + 1], dtype=np.int64)
        cuts = np.minimum(doc_start + -(-(targets - doc_start) // piece) * piece, doc_end)
        self.block_start = np.unique(np.concatenate([[0], cuts, [self.num_segments]]))
        self.num_blocks = len(self.block_start) - 1
        self.num_windows = -(-self.num_blocks // window_blocks)
        self.slots = self._estimate() if self.num_windows > 1 else None  # (B,) int64

    def order(self, seed: int, stream: int, epoch: int) -> np.ndarray:
        """(B,) the blocks of the epoch in window order (asked with several windows only)."""
        return np.random.default_rng([seed, stream, epoch, 0, ORDER_KEY]).permutation(self.num_blocks)

    def window_bounds(self) -> np.ndarray:
        """(W+1,) where each window's blocks start in an epoch's order (windows of equal size, +-1)."""
        return np.arange(self.num_windows + 1) * self.num_blocks // self.num_windows

    def window_slots(self, order: np.ndarray) -> np.ndarray:
        """(W+1,) where each window's positions start in an epoch of this block order (several windows)."""
        return np.concatenate([[0], np.cumsum(np.add.reduceat(self.slots[order], self.window_bounds()[:-1]))])

    def cut(self, blocks: np.ndarray, rng: np.random.Generator) -> tuple[ChunkIndex, np.ndarray]:
        """The chunks of `blocks` (ascending), unshuffled, and the block of each, reading only these blocks' offsets.
        The blocks' documents are cut in pieces; round r cuts the r-th chunk of every unfinished piece."""
        lo, hi = self.block_start[blocks], self.block_start[blocks + 1]
        offsets, base = self._local_offsets(lo, hi)
        parts = [document_pieces(self.doc_offsets, int(a), int(b), self.piece) for a, b in _runs(lo, hi)]
        start, end, has_previous = (np.concatenate(column) for column in zip(*parts))
        block = np.searchsorted(lo, start, side="right") - 1  # (P,) index into blocks of each piece
        shift = lo[block] - base[block]  # corpus number = local number + shift
        piece_start, piece_end = start - shift, end - shift  # (P,) in the local numbering
        pos = piece_start.copy()  # (P,) where each piece's next chunk starts
        skip = np.zeros(len(pos), dtype=np.int64)  # (P,) and how many of that segment's tokens are in a row already
        active = np.arange(len(pos))
        small = np.uint16 if self.max_tokens < 1 << 16 else np.int32  # chunk sizes and targets
        wide = np.int32 if max(self.num_segments + 1, int(offsets[-1])) < 1 << 31 else np.int64
        types = (wide, small, small, bool, small, wide)
        # Per round, in compact types (~15 bytes a chunk); an empty first round types the columns of no pieces.
        parts, pieces = [tuple(np.zeros(0, dtype=t) for t in types)], [np.zeros(0, dtype=np.int64)]
        while len(active):
            p, stop, n, s = pos[active], piece_end[active], len(active), skip[active]
            target = np.full(n, self.max_tokens, dtype=np.int64)
            short = rng.random(n) < (self.cfg.short_seq_prob if self.cfg.pairs else 0.0)
            target[short] = rng.integers(2, self.max_tokens + 1, size=int(short.sum()))
            reach = offsets[p] + s + target  # (n,) one past the chunk's last token
            chunk_end = np.searchsorted(offsets, reach, side="left")
            chunk_end = np.minimum(np.maximum(chunk_end, p + 1), stop)
            first, count = p.copy(), chunk_end - p
            if self.cfg.pairs:
                after_previous = (p > piece_start[active]) | has_previous[active]
                a_count, random_next, step_to = self._pairs(first, count, chunk_end, after_previous, rng=rng)
            else:  # a row ending inside a segment leaves the rest to the next; at a document's end, its own [SEP]
                inside = reach < offsets[chunk_end] - self._sep_after(chunk_end - 1 + shift[active])
                a_count, random_next, step_to = count, np.ones(n, bool), np.where(inside, chunk_end - 1, chunk_end)
                skip[active] = np.where(inside, reach - offsets[step_to], 0)
            columns = (first + shift[active], count, a_count, random_next, target, s)
            parts.append(tuple(c.astype(t) for c, t in zip(columns, types)))
            pieces.append(active)
            pos[active] = step_to
            active = active[step_to < stop]
        return ChunkIndex(*(np.concatenate(column) for column in zip(*parts))), block[np.concatenate(pieces)]

    def _local_offsets(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(n+1,) token offsets of blocks lo..hi's segments back to back, and where each block starts in them."""
        if len(lo) == self.num_blocks and self.seps is None:  # the whole corpus: its own numbering
            return self.offsets, lo
        sizes = hi - lo
        base = np.cumsum(sizes) - sizes
        segment = np.repeat(lo - base, sizes) + np.arange(int(sizes.sum()))  # (n,) their corpus numbers
        lengths = np.asarray(self.offsets[segment + 1]) - np.asarray(self.offsets[segment])
        if self.seps is not None:  # a packed row's [SEP] after each document's last segment takes a slot
            lengths = lengths + self._sep_after(segment)
        return np.concatenate([[0], np.cumsum(lengths)]), base

    def _sep_after(self, segment: np.ndarray) -> np.ndarray:
        """(n,) 1 where a packed row's [SEP] follows `segment` (corpus numbers): a document's last, else 0."""
        at = np.minimum(np.searchsorted(self.seps, segment + 1), len(self.seps) - 1)
        return (np.asarray(self.seps[at]) == segment + 1).astype(np.int64)

    def _pairs(
        self, first: np.ndarray, count: np.ndarray, end: np.ndarray, after: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A round's chunks (ending at `end`) as sentence pairs: (a_count, random_next, where each piece goes on). A
        chunk of several segments splits at a uniform point, B random with random_next_prob (its segments go back to
        the piece); a lone segment `after` one of its document (the piece's last, or one that reaches its target alone)
        is paired with the one before unless B is random: only a document's first segment alone has a random B."""
        n = len(first)
        split, coin = rng.random(n), rng.random(n) < self.cfg.random_next_prob
        several = count >= 2
        a_count = np.ones(n, dtype=np.int64)
        a_count[several] = 1 + (split[several] * (count[several] - 1)).astype(np.int64)
        lone = ~several & after
        random_next = coin | (~several & ~lone)
        paired = lone & ~coin  # A = the sentence before, B = this one
        first[paired] -= 1
        count[paired] = 2
        return a_count, random_next, np.where(random_next & several, first + a_count, end)

    def window(self, seed: int, stream: int, epoch: int, w: int) -> ChunkIndex:
        """Window w of the epoch: its chunks, shuffled."""
        if self.num_windows == 1:
            rng, blocks = np.random.default_rng([seed, stream, epoch]), np.arange(self.num_blocks)
        else:
            rng = np.random.default_rng([seed, stream, epoch, w, WINDOW_KEY])
            bounds = self.window_bounds()
            blocks = np.sort(self.order(seed, stream, epoch)[bounds[w] : bounds[w + 1]])
        return _shuffled(self.cut(blocks, rng)[0], rng)

    def _estimate(self) -> np.ndarray:
        """(B,) each block's chunk count, estimated by a fit on up to CALIBRATION_BLOCKS blocks cut with a fixed
        seed; exact and BLAS-free (exact_fit): every process on any machine must place the windows alike."""
        lo, hi = self.block_start[:-1], self.block_start[1:]
        starts = np.searchsorted(self.doc_offsets, lo, side="left")
        documents = np.searchsorted(self.doc_offsets, hi, side="left") - starts  # documents starting in each
        documents += np.asarray(self.doc_offsets[np.minimum(starts, len(self.doc_offsets) - 1)]) != lo  # a piece
        segments = hi - lo
        tokens = np.asarray(self.offsets[hi]) - np.asarray(self.offsets[lo])
        features = (documents, segments, tokens)  # (B,) int64 each
        n = min(CALIBRATION_BLOCKS, self.num_blocks)
        sample = np.unique(np.arange(n) * (self.num_blocks - 1) // max(n - 1, 1))  # spread evenly, in integers
        _, block = self.cut(sample, np.random.default_rng([0, 0, 0, 0, CALIBRATION_KEY]))
        counts = np.bincount(block, minlength=len(sample))
        coef = exact_fit(np.stack([f[sample] for f in features], axis=1), counts)
        estimate = coef[0] * documents.astype(np.float64)
        for c, f in zip(coef[1:], features[1:]):
            estimate = estimate + c * f.astype(np.float64)  # one IEEE rounding per operation: no fused multiply-add
        # A chunk takes a segment, or a packed row fills max_tokens slots (a long segment gives several rows).
        most = segments if self.cfg.pairs else segments + -(-(tokens + segments) // self.max_tokens)
        return np.clip(np.rint(estimate), np.maximum(documents, 1), most).astype(np.int64)


def exact_fit(features: np.ndarray, counts: np.ndarray) -> list[float]:
    """The least-squares coefficients of `counts` (n,) on integer `features` (n, k), exact: alike on every machine."""
    from fractions import Fraction

    rows, y = features.tolist(), counts.tolist()
    k = len(rows[0])
    a = [[Fraction(sum(r[i] * r[j] for r in rows)) for j in range(k)] for i in range(k)]  # X'X, exact integers
    b = [Fraction(sum(r[i] * t for r, t in zip(rows, y))) for i in range(k)]  # X'y
    ridge = (sum(a[i][i] for i in range(k)) + 1) / 10**12  # keeps collinear features (blocks all alike) defined
    for i in range(k):
        a[i][i] += ridge
    for c in range(k):  # Gaussian elimination: X'X + ridge is symmetric positive definite, no pivoting needed
        for r in range(c + 1, k):
            factor = a[r][c] / a[c][c]
            for j in range(c, k):
                a[r][j] -= factor * a[c][j]
            b[r] -= factor * b[c]
    coef = [Fraction(0)] * k
    for c in reversed(range(k)):
        coef[c] = (b[c] - sum(a[c][j] * coef[j] for j in range(c + 1, k))) / a[c][c]
    return [float(c) for c in coef]


def _runs(lo: np.ndarray, hi: np.ndarray) -> list[tuple[int, int]]:
    """Blocks lo[i]..hi[i] (ascending) as runs of adjacent ones."""
    breaks = np.flatnonzero(lo[1:] != hi[:-1]) + 1
    firsts, lasts = np.concatenate([[0], breaks]), np.concatenate([breaks - 1, [len(hi) - 1]])
    return list(zip(lo[firsts].tolist(), hi[lasts].tolist()))


SHARE_SEGMENTS = 1 << 18  # random_next_share cuts at most about this many segments (~0.05 s)


def random_next_share(seg_offsets: np.ndarray, doc_offsets: np.ndarray, cfg: DataConfig, seed: int) -> float:
    """The share of a first epoch's NSP pairs (train.seed `seed`) whose B is random: exact up to SHARE_SEGMENTS
    sentences, above measured on every k-th document (reading only their offsets)."""
    seg, doc = seg_offsets, doc_offsets
    stride = -(-(len(seg) - 1) // SHARE_SEGMENTS)
    if stride > 1:  # every stride-th document, its segments' lengths kept
        picked = np.arange(0, len(doc) - 1, stride)
        starts = np.asarray(doc[picked], dtype=np.int64)
        counts = np.asarray(doc[picked + 1], dtype=np.int64) - starts
        index = np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
        seg = np.concatenate([[0], np.cumsum(np.asarray(seg[index + 1]) - np.asarray(seg[index]))])
        doc = np.concatenate([[0], np.cumsum(counts)])
    if len(doc) < 2:
        return 0.0
    index = cut_epoch(seg, doc, max_tokens=cfg.max_seq_length - 3, cfg=cfg, rng=np.random.default_rng([seed, 0, 0]))
    return float(index.random_next.mean())
