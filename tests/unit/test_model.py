"""Model: Hugging Face key names and numerics, parameter counts, gathered MLM head, padding mask."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import SMALL_MODEL

from bertcli.config import ModelConfig
from bertcli.config_load import preset_config
from bertcli.hf_names import TIED_ALIASES
from bertcli.model import BertForPreTraining, BertSelfAttention, LayerNorm, packing
from bertcli.sizes import flops_per_token
from bertcli.summary import PARTS, parameter_counts

transformers = pytest.importorskip("transformers")

SMALL = dataclasses.replace(SMALL_MODEL, pad_vocab_multiple=1)


def hf_model(cfg: ModelConfig):
    fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("pad_vocab_multiple", "init_from")}
    config = transformers.BertConfig(**fields, attn_implementation="sdpa")
    return transformers.BertForPreTraining(config)


def random_inputs(cfg: ModelConfig, B: int = 4, T: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(5, cfg.vocab_size, (B, T), generator=g)
    valid_lens = torch.tensor([T, T - 3, 7, 5][:B])
    segments = (torch.arange(T)[None, :] >= (valid_lens[:, None] // 2)).long()
    return tokens, segments, valid_lens


POSITIONS = torch.tensor([[1, 4, 0], [2, 3, 9], [1, 5, 6], [3, 0, 0]])  # (B=4, P=3) prediction slots


def outputs_and_grads(model: BertForPreTraining, *inputs, packed=None):
    """One forward and backward of `model` from seed 0 (so that dropout draws the same masks):
    the last layer (unpacked), the MLM and NSP logits, and every parameter's gradient."""
    torch.manual_seed(0)
    out = model(*inputs, packed=packed)
    (out.mlm_logits.square().mean() + out.nsp_logits.square().mean()).backward()
    encoded = out.encoded if packed is None else packed.unpack(out.encoded)
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    return encoded.detach(), out.mlm_logits.detach(), out.nsp_logits.detach(), grads


def assert_same_results(a, b) -> None:
    """outputs_and_grads of two paths agree (to float rounding)."""
    for x, y in zip(a[:3], b[:3]):
        torch.testing.assert_close(y, x)
    for name, grad in a[3].items():
        torch.testing.assert_close(b[3][name], grad, msg=name)


def test_state_dict_keys_and_shapes_equal_hugging_face():
    ours = BertForPreTraining(SMALL).state_dict()
    theirs = hf_model(SMALL).state_dict()
    assert list(ours) == list(theirs)
    assert all(ours[k].shape == theirs[k].shape for k in ours)
    assert set(TIED_ALIASES) <= set(ours)


@pytest.mark.parametrize("act", ["gelu", "relu", "gelu_new"])
def test_logits_equal_hugging_face_with_our_weights(act):
    cfg = dataclasses.replace(SMALL, hidden_act=act)
    torch.manual_seed(0)
    ours = BertForPreTraining(cfg).eval()
    theirs = hf_model(cfg).eval()
    theirs.load_state_dict(ours.state_dict(), strict=True)
    tokens, segments, valid_lens = random_inputs(cfg)
    attention_mask = (torch.arange(tokens.shape[1])[None, :] < valid_lens[:, None]).long()
    with torch.no_grad():
        out = ours(tokens, segments, valid_lens)
        ref = theirs(input_ids=tokens, token_type_ids=segments, attention_mask=attention_mask)
    for row, n in enumerate(valid_lens.tolist()):  # padded positions are don't-care in both
        torch.testing.assert_close(out.mlm_logits[row, :n], ref.prediction_logits[row, :n], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.nsp_logits, ref.seq_relationship_logits, rtol=1e-5, atol=1e-5)


def test_decoder_is_tied_to_word_embeddings():
    model = BertForPreTraining(SMALL)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias


@pytest.mark.parametrize("preset, expected", [("base", 110_106_428), ("large", 336_226_108)])
def test_parameter_counts_equal_hugging_face(preset, expected):
    cfg = dataclasses.replace(preset_config(preset).model, vocab_size=30522)  # the tokenizer's size
    counts = parameter_counts(cfg)
    assert counts["total"] == expected  # the issue's figure for BertForPreTraining, 30,522 tokens
    with torch.device("meta"):
        hf = hf_model(cfg)
    assert counts["total"] == hf.num_parameters()
    assert counts["total"] == sum(v for k, v in counts.items() if k not in ("total", "total_with_padding"))
    by_part = dict.fromkeys(PARTS, 0)  # the built model's, each tied parameter once under its first name
    for name, param in hf.named_parameters():
        by_part[next(part for part, prefix in PARTS.items() if name.startswith(prefix))] += param.numel()
    assert {part: counts[part] for part in PARTS} == by_part
    with torch.device("meta"):
        assert counts["total_with_padding"] == sum(p.numel() for p in BertForPreTraining(cfg).parameters())
    # bertcli pads the embedding and decoder rows to a multiple of 64 (30,528): 6 rows of H, and 6 biases.
    assert counts["total_with_padding"] - counts["total"] == 6 * cfg.hidden_size + 6


def test_mlm_head_runs_only_at_gathered_positions():
    torch.manual_seed(0)
    model = BertForPreTraining(SMALL).eval()
    tokens, segments, valid_lens = random_inputs(SMALL)
    positions = torch.tensor([[1, 3, 0], [2, 2, 0], [6, 1, 0], [4, 0, 0]])
    with torch.no_grad():
        full = model(tokens, segments, valid_lens).mlm_logits  # (B, T, V)
        gathered = model(tokens, segments, valid_lens, positions).mlm_logits  # (B, P, V)
    assert gathered.shape == (4, 3, SMALL.vocab_size)
    torch.testing.assert_close(gathered, full.gather(1, positions[..., None].expand(-1, -1, SMALL.vocab_size)))


def test_padding_does_not_leak_into_real_positions():
    torch.manual_seed(0)
    model = BertForPreTraining(SMALL).eval()
    tokens, segments, valid_lens = random_inputs(SMALL)
    changed = tokens.clone()
    for row, n in enumerate(valid_lens.tolist()):
        changed[row, n:] = torch.randint(5, SMALL.vocab_size, (tokens.shape[1] - n,))
    with torch.no_grad():
        a = model(tokens, segments, valid_lens)
        b = model(changed, segments, valid_lens)
    for row, n in enumerate(valid_lens.tolist()):
        torch.testing.assert_close(a.encoded[row, :n], b.encoded[row, :n])
    torch.testing.assert_close(a.nsp_logits, b.nsp_logits)


def test_vocabulary_padding_rows_are_never_in_the_logits():
    cfg = dataclasses.replace(SMALL, pad_vocab_multiple=64)
    model = BertForPreTraining(cfg)
    assert model.bert.embeddings.word_embeddings.weight.shape[0] == 128
    tokens, segments, valid_lens = random_inputs(cfg)
    out = model(tokens, segments, valid_lens, torch.zeros(4, 2, dtype=torch.long))
    assert out.mlm_logits.shape == (4, 2, 99)
    out.mlm_logits.sum().backward()
    assert torch.all(model.bert.embeddings.word_embeddings.weight.grad[99:] == 0)


def test_initialisation_follows_bert():
    torch.manual_seed(0)
    model = BertForPreTraining(dataclasses.replace(preset_config("tiny").model, vocab_size=8000))
    std = model.config.initializer_range
    weight = model.bert.encoder.layer[0].intermediate.dense.weight
    assert abs(weight.std().item() - std) < 0.1 * std
    assert torch.all(model.bert.encoder.layer[0].intermediate.dense.bias == 0)
    assert torch.all(model.bert.embeddings.LayerNorm.weight == 1)
    assert torch.all(model.bert.embeddings.word_embeddings.weight[model.config.pad_token_id] == 0)


def test_flops_formula_matches_issue_form_when_ffn_is_4h():
    cfg = dataclasses.replace(preset_config("base").model, vocab_size=30528)  # a multiple of 64: no padding
    L, H, V, s, p = cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size, 128, 0.15
    assert flops_per_token(cfg, s, p) == pytest.approx(72 * L * H * H + 12 * L * H * s + 6 * p * (H * H + V * H))


def test_unpadded_forward_and_backward_equal_the_padded_ones():
    """train.unpad: the encoder on the packed real tokens (here with the CPU reference attention)
    gives the padded path's logits, last layer and gradients. Without dropout: with it, the masks are
    drawn over (N, H) instead of (B, T, H), so the paths agree in distribution, not bit for bit."""
    cfg = dataclasses.replace(SMALL, attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0, pad_vocab_multiple=8)
    tokens, segments, valid_lens = random_inputs(cfg, B=4, T=16)
    torch.manual_seed(0)
    model = BertForPreTraining(cfg)
    padded = outputs_and_grads(model, tokens, segments, valid_lens, POSITIONS)
    model.zero_grad()
    pk = packing(valid_lens, tokens.shape[1])
    unpadded = outputs_and_grads(model, tokens, segments, valid_lens, POSITIONS, packed=pk)
    keep = torch.arange(tokens.shape[1])[None, :] < valid_lens[:, None]
    assert torch.all(unpadded[0][~keep] == 0)
    padded[0][~keep] = 0  # padding rows: whatever the padded path computed there
    assert_same_results(padded, unpadded)


def test_unpadded_path_refuses_attention_dropout():
    model = BertForPreTraining(SMALL).train()  # attention_probs_dropout_prob 0.1
    tokens, segments, valid_lens = random_inputs(SMALL)
    with pytest.raises(ValueError, match="attention dropout"):
        model(tokens, segments, valid_lens, packed=packing(valid_lens, tokens.shape[1]))


@pytest.mark.parametrize("training", [True, False])
def test_a_batch_without_padding_runs_unmasked_and_equals_the_masked_path(training):
    """valid_lens None (what the trainer passes for a batch with no padding: no attention mask, so
    SDPA may take a faster kernel) gives what the key-padding mask of full rows gives: outputs and
    gradients, in training with dropout (the same seed draws the same masks) and in evaluation."""
    cfg = dataclasses.replace(SMALL, pad_vocab_multiple=8)  # dropout 0.1 on hidden states and attention
    tokens, segments, _ = random_inputs(cfg, B=4, T=16)
    model = BertForPreTraining(cfg).train(training)
    masked = outputs_and_grads(model, tokens, segments, torch.full((4,), 16), POSITIONS)
    model.zero_grad()
    assert_same_results(masked, outputs_and_grads(model, tokens, segments, None, POSITIONS))


@pytest.mark.parametrize("packed", [False, True])
def test_fused_qkv_equals_three_projections(packed):
    """Issue 21: Q, K and V from one product over the concatenated weights give what the three
    Linears give (the reference path): outputs and every gradient, padded and packed, with dropout
    (the same seed draws the same masks)."""
    cfg = dataclasses.replace(SMALL, pad_vocab_multiple=8, attention_probs_dropout_prob=0.0 if packed else 0.1)
    tokens, segments, valid_lens = random_inputs(cfg, B=4, T=16)
    pk = packing(valid_lens, tokens.shape[1]) if packed else None
    model = BertForPreTraining(cfg).train()
    results = []
    for fused in (False, True):
        for attention in model.modules():
            if isinstance(attention, BertSelfAttention):
                attention.fused_qkv = fused
        model.zero_grad(set_to_none=True)
        results.append(outputs_and_grads(model, tokens, segments, valid_lens, POSITIONS, packed=pk))
    assert_same_results(*results)


def test_layer_norm_keeps_bf16_under_bf16_autocast_and_is_nn_layer_norm_otherwise():
    """Issue 21: outside bf16 autocast LayerNorm is nn.LayerNorm, bit for bit; under it, the output
    is bf16 and equals the norm computed in fp32 from the same input, rounded once (forward and
    the gradients of input, weight and bias); so the residual stream stays bf16 through a block."""
    torch.manual_seed(0)
    ours, reference = LayerNorm(32, eps=1e-12), torch.nn.LayerNorm(32, eps=1e-12)
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_()
    reference.load_state_dict(ours.state_dict())
    x = torch.randn(4, 7, 32)
    assert torch.equal(ours(x), reference(x))
    with torch.autocast("cpu", dtype=torch.float16):  # fp16 autocast: autocast's own norm
        assert torch.equal(ours(x.half()), reference(x.half()))
    for dtype in (torch.float32, torch.bfloat16):  # the embeddings' fp32 sum, a block's bf16 residual
        inputs = x.to(dtype).detach().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = ours(inputs)
        assert out.dtype == torch.bfloat16
        # fp64 reference with the weights as the kernel takes them (in the input's dtype)
        upcast = inputs.detach().double().requires_grad_()
        w, b = (p.to(dtype).double() for p in (ours.weight, ours.bias))
        expected = torch.nn.functional.layer_norm(upcast, (32,), w, b, 1e-12)
        torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=2**-8)  # one bf16 rounding
        grad = torch.randn_like(expected)
        out.backward(grad.to(out.dtype))
        ref_grads = torch.autograd.grad(expected, (upcast, w, b), grad)
        for got, want in zip((inputs.grad, ours.weight.grad, ours.bias.grad), ref_grads):
            assert (got.double() - want).norm() / want.norm() < 2**-6  # bf16 gradients: ~2^-8
        ours.zero_grad()
    model = BertForPreTraining(SMALL)
    tokens, segments, valid_lens = random_inputs(SMALL)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(tokens, segments, valid_lens)
    assert out.encoded.dtype == torch.bfloat16
