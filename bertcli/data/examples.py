"""BERT examples: sentence pairs for NSP and dynamic masking for MLM, made on the fly.

Example i of step k is drawn with its own generator seeded by (seed, k, i), so the batch at
step k is a pure function of (seed, k): a run replays the same examples and masks, resuming
needs no skipping, and any split of a step's examples across micro-batches or ranks sees
exactly the examples of a single large batch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from bertcli.config import DataConfig
from bertcli.data.corpus import Corpus
from bertcli.errors import UsageError

IGNORE = -100  # label of padded prediction slots: cross_entropy(ignore_index=IGNORE) skips them


@dataclass
class Example:
    tokens: np.ndarray  # (T,) [CLS] A [SEP] B [SEP], masked
    segments: np.ndarray  # (T,) 0 for [CLS] A [SEP], 1 for B [SEP]
    pred_positions: np.ndarray  # (n,) positions chosen for MLM, ascending
    pred_labels: np.ndarray  # (n,) original tokens at those positions
    nsp_label: int  # 0 = B follows A, 1 = B is random


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, T) int64
    token_type_ids: torch.Tensor  # (B, T) int64
    valid_lens: torch.Tensor  # (B,) int64, non-padding tokens per row
    pred_positions: torch.Tensor  # (B, P) int64, padded slots point at 0
    mlm_labels: torch.Tensor  # (B, P) int64, IGNORE in padded slots
    nsp_labels: torch.Tensor  # (B,) int64

    def to(self, device: torch.device, non_blocking: bool = False) -> "Batch":
        return Batch(**{f.name: getattr(self, f.name).to(device, non_blocking=non_blocking) for f in fields(self)})

    def pin_memory(self) -> "Batch":
        return Batch(**{f.name: getattr(self, f.name).pin_memory() for f in fields(self)})


class ExampleBuilder:
    """Builds examples from a corpus; `batch(seed, step, indices)` is a pure function."""

    def __init__(self, corpus: Corpus, cfg: DataConfig) -> None:
        self.corpus, self.cfg = corpus, cfg
        doc_of = corpus.document_of_segment()
        # Pairs (s, s+1) inside one document: the true next sentences to draw from.
        self.pair_starts = np.flatnonzero(doc_of[:-1] == doc_of[1:])
        if corpus.num_documents < 2 or len(self.pair_starts) == 0:
            raise UsageError("the corpus needs at least 2 documents and one document of 2 or more sentences to build NSP pairs")
        self.doc_of = doc_of

    def example(self, rng: np.random.Generator) -> Example:
        c, cfg, sp = self.corpus, self.cfg, self.corpus.special
        s = int(self.pair_starts[rng.integers(len(self.pair_starts))])
        a = c.segment(s)
        if rng.random() < cfg.random_next_prob:
            # B from a uniformly drawn *other* document (never the same one).
            doc = (int(self.doc_of[s]) + 1 + int(rng.integers(c.num_documents - 1))) % c.num_documents
            first, last = int(c.doc_offsets[doc]), int(c.doc_offsets[doc + 1])
            b, nsp_label = c.segment(int(rng.integers(first, last))), 1
        else:
            b, nsp_label = c.segment(s + 1), 0
        a, b = truncate_pair(a, b, cfg.max_seq_length - 3, rng)
        tokens = np.concatenate([[sp.cls], a, [sp.sep], b, [sp.sep]]).astype(np.int64)
        segments = np.zeros(len(tokens), dtype=np.int64)
        segments[len(a) + 2:] = 1
        masked, positions, labels = mask_tokens(tokens, len(a), cfg, c.vocab_size, sp.mask, sp.first_regular_id, rng)
        return Example(masked, segments, positions, labels, nsp_label)

    def batch(self, seed: int, step: int, indices: range) -> Batch:
        """Examples `indices` of step `step`; padded to the longest row, rounded up to 8."""
        examples = [self.example(np.random.default_rng([seed, step, i])) for i in indices]
        return collate(examples, self.cfg.max_predictions_per_seq, self.corpus.special.pad)


def truncate_pair(a: np.ndarray, b: np.ndarray, max_tokens: int,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
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


def mask_tokens(tokens: np.ndarray, len_a: int, cfg: DataConfig, vocab_size: int, mask_id: int,
                first_regular_id: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Choose masked_lm_prob of the non-special tokens (at most max_predictions_per_seq);
    replace each by [MASK] (mask_token_prob), a random token (random_token_prob) or keep it."""
    # Non-special positions: everything but [CLS] (0), the middle [SEP] and the final [SEP].
    candidates = np.concatenate([np.arange(1, len_a + 1), np.arange(len_a + 2, len(tokens) - 1)])
    n = min(cfg.max_predictions_per_seq, max(1, int(round(len(candidates) * cfg.masked_lm_prob))))
    n = min(n, len(candidates))
    positions = np.sort(rng.choice(candidates, size=n, replace=False))
    labels = tokens[positions].copy()
    masked = tokens.copy()
    r = rng.random(n)
    to_mask = r < cfg.mask_token_prob
    to_random = (r >= cfg.mask_token_prob) & (r < cfg.mask_token_prob + cfg.random_token_prob)
    masked[positions[to_mask]] = mask_id
    masked[positions[to_random]] = rng.integers(first_regular_id, vocab_size, size=int(to_random.sum()))
    return masked, positions, labels


def collate(examples: list[Example], max_predictions: int, pad_id: int) -> Batch:
    B = len(examples)
    T = max(len(e.tokens) for e in examples)
    T = -(-T // 8) * 8  # a few distinct shapes only, and aligned for the matrix units
    input_ids = np.full((B, T), pad_id, dtype=np.int64)
    token_type_ids = np.zeros((B, T), dtype=np.int64)
    pred_positions = np.zeros((B, max_predictions), dtype=np.int64)
    mlm_labels = np.full((B, max_predictions), IGNORE, dtype=np.int64)
    for row, e in enumerate(examples):
        input_ids[row, :len(e.tokens)] = e.tokens
        token_type_ids[row, :len(e.segments)] = e.segments
        pred_positions[row, :len(e.pred_positions)] = e.pred_positions
        mlm_labels[row, :len(e.pred_labels)] = e.pred_labels
    return Batch(
        input_ids=torch.from_numpy(input_ids),
        token_type_ids=torch.from_numpy(token_type_ids),
        valid_lens=torch.tensor([len(e.tokens) for e in examples], dtype=torch.int64),
        pred_positions=torch.from_numpy(pred_positions),
        mlm_labels=torch.from_numpy(mlm_labels),
        nsp_labels=torch.tensor([e.nsp_label for e in examples], dtype=torch.int64),
    )
