"""bertcli.dropout: the CPU dropout mask (rate, scale, gradient, a function of the seed) and the
attention that applies it, against torch's SDPA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bertcli.dropout import attention, dropout, keep_mask

CPU = torch.device("cpu")


def test_the_mask_keeps_1_minus_p_and_is_a_function_of_the_seed():
    for p in (0.1, 0.5):
        torch.manual_seed(0)
        kept = keep_mask(torch.Size([1000, 1001]), p, CPU).double().mean().item()  # an odd count: half a word left
        assert abs(kept - (1 - p)) < 6 * ((p * (1 - p)) / 1_001_000) ** 0.5, (p, kept)  # 6 standard deviations
    draw = lambda seed: (torch.manual_seed(seed), keep_mask(torch.Size([64, 64]), 0.1, CPU))[1]  # noqa: E731
    assert torch.equal(draw(1), draw(1)) and not torch.equal(draw(1), draw(2))


def test_a_rate_near_1_drops_everything_and_near_0_keeps_everything():
    """The int32 threshold at its ends: p within 2^-33 of 1 once wrapped around and kept every element."""
    torch.manual_seed(0)
    assert not keep_mask(torch.Size([100_000]), 1 - 1e-12, CPU).any()
    assert keep_mask(torch.Size([100_000]), 1e-12, CPU).all()


def test_dropout_zeroes_the_dropped_scales_the_kept_and_so_does_its_gradient():
    x = torch.randn(50, 40, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(3)
    y = dropout(x, 0.25, training=True)
    torch.manual_seed(3)
    keep = keep_mask(x.shape, 0.25, CPU)  # the same draw
    torch.testing.assert_close(y, torch.where(keep, x / 0.75, 0))
    y.backward(torch.ones_like(y))
    torch.testing.assert_close(x.grad, keep.double() / 0.75)
    assert dropout(x, 0.25, training=False) is x and dropout(x, 0.0, training=True) is x


@pytest.mark.parametrize("masked", [False, True])
def test_attention_with_dropout_is_sdpa_with_that_mask(masked):
    """The written-out attention (CPU, dropout on): with p so small that nothing is dropped it equals
    SDPA forward and backward; with p = 0.3 it equals softmax, the same dropout mask, then V."""
    B, nh, T, hd = 3, 2, 12, 8
    q, k, v = (torch.randn(B, nh, T, hd, requires_grad=True) for _ in range(3))
    keep = (torch.arange(T)[None, :] < torch.tensor([12, 7, 3])[:, None])[:, None, None, :] if masked else None
    out = attention(q, k, v, keep, dropout_p=1e-12)  # rounds to a threshold that keeps every weight
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    torch.testing.assert_close(out, ref)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    for got, want in zip(grads, torch.autograd.grad(ref.square().sum(), (q, k, v))):
        torch.testing.assert_close(got, want)
    torch.manual_seed(5)
    out = attention(q, k, v, keep, dropout_p=0.3)
    torch.manual_seed(5)
    scores = q @ k.transpose(-2, -1) / hd**0.5
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    ref = (torch.softmax(scores, -1) * keep_mask(torch.Size([B, nh, T, T]), 0.3, CPU) / 0.7) @ v
    torch.testing.assert_close(out, ref)
