"""Dropout, attention that applies it, and per-step seeding. On CPUs each element's mask takes 32 bits of a 64-bit
draw of torch's generator (torch's draws a double per element: ~3x slower on BERT-base); on GPUs torch's kernels."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def keep_mask(shape: torch.Size, p: float, device: torch.device) -> torch.Tensor:
    """A bool mask of `shape`, each element True (kept) with probability 1 - p (p rounded to 2^-32)."""
    n = math.prod(shape)
    words = torch.empty((n + 1) // 2, dtype=torch.int64, device=device).random_(-(2**63), None)  # all 64 bits random
    # Each int32 half is uniform over [-2^31, 2^31): below the threshold with probability p (kept inside int32).
    threshold = min(round(p * 2**32), 2**32 - 1) - 2**31
    return words.view(torch.int32)[:n].view(shape) >= threshold


def dropout(x: torch.Tensor, p: float, *, training: bool) -> torch.Tensor:
    """F.dropout(x, p, training=training), with keep_mask's mask on CPUs."""
    if not training or p == 0 or x.device.type != "cpu":
        return F.dropout(x, p, training=training)
    return x.mul(keep_mask(x.shape, p, x.device)).mul_(1 / (1 - p))  # autograd keeps the bool mask only


class Dropout(nn.Dropout):
    """nn.Dropout through `dropout` (no parameters: state_dict keys are unchanged)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, training=self.training)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None, *, dropout_p: float
) -> torch.Tensor:
    """SDPA with dropout on the weights: (B, nh, T, hd) x3 -> (B, nh, T, hd); `keep` (B, 1, 1, T): keys that may
    be attended (None: all). On CPUs with dropout, SDPA's math path written out with `dropout`."""
    if dropout_p == 0 or q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout_p)
    scores = torch.matmul(q * (1 / math.sqrt(q.shape[-1])), k.transpose(-2, -1))  # (B, nh, T, T)
    if keep is not None:  # added, not masked_fill: the backward then passes the gradient through as it is
        scores = scores + scores.new_zeros(keep.shape).masked_fill_(~keep, float("-inf"))
    return torch.matmul(dropout(torch.softmax(scores, -1), dropout_p, training=True), v)


def seed_step(seed: int, step: int, rank: int = 0) -> None:
    """Seed torch (dropout) from (seed, step, rank): resuming restores it without saved generator states."""
    torch.manual_seed(int(np.random.SeedSequence([seed, step, rank]).generate_state(1, dtype=np.uint64)[0] >> 1))
