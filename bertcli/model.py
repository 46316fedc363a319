"""BERT for pretraining (d2l's BERTEncoder + MaskLM + NextSentencePred) as the original: post-LN, an MLM head tied to
the word embeddings and run at the predicted positions only, Hugging Face's `state_dict()` keys. Architecture only.
Shapes: B batch, T length, H hidden, nh heads of hd, N real tokens of a packed batch, P predictions per row, V vocab."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, partial
from itertools import islice
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from bertcli.config import ModelConfig
from bertcli.dropout import Dropout, attention
from bertcli.sizes import padded_vocab_size

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,  # exact (erf) GELU, as in Google BERT
    "gelu_new": partial(F.gelu, approximate="tanh"),
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "relu": F.relu,  # the d2l textbook's
}


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm whose output is bf16 under bf16 autocast, so the residual stream stays bf16 (half the bytes,
    no casts); statistics are fp32 either way, and fp16 autocast keeps fp32 norms for fp16's range."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device = x.device.type
        if not torch.is_autocast_enabled(device) or torch.get_autocast_dtype(device) != torch.bfloat16:
            return super().forward(x)
        with torch.autocast(device, enabled=False):
            if x.dtype != torch.bfloat16:  # the embeddings' fp32 sum: normalised in fp32, rounded once
                return super().forward(x).to(torch.bfloat16)
            bf16 = lambda t: t.to(torch.bfloat16)  # noqa: E731  (H,): negligible casts
            return F.layer_norm(x, self.normalized_shape, weight=bf16(self.weight), bias=bf16(self.bias), eps=self.eps)


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(padded_vocab_size(cfg), cfg.hidden_size, padding_idx=cfg.pad_token_id)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.hidden_dropout_prob)

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(B, T) ids -> (B, T, H); packed, (N,) ids and their (N,) positions -> (N, H)."""
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        if positions is None:
            x = x + self.position_embeddings.weight[: input_ids.shape[1]]  # (T, H), broadcast over B
        else:
            x = x + self.position_embeddings(positions)
        return self.dropout(self.LayerNorm(x))


class Packing(NamedTuple):
    """Where the real tokens of a padded (B, T) batch sit once packed into (N, ...); made on the host (`packing()`)."""

    indices: torch.Tensor  # (N,) int64: flat position b*T + t of each real token, row by row
    cu_seqlens: torch.Tensor  # (B+1,) int32: row b is packed[cu_seqlens[b]:cu_seqlens[b+1]]
    max_seqlen: int  # the longest row
    valid_lens: torch.Tensor  # (B,) int64
    width: int  # T, the padded width the batch came in

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Packing:
        return self._replace(indices=fn(self.indices), cu_seqlens=fn(self.cu_seqlens), valid_lens=fn(self.valid_lens))

    def to(self, device: torch.device, non_blocking: bool = False) -> Packing:
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Packing:
        return self._map(torch.Tensor.pin_memory)

    def pack(self, padded: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (N, ...)"""
        return padded.flatten(0, 1).index_select(0, self.indices)

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, T, ...), zeros at padding."""
        B = len(self.valid_lens)
        out = packed.new_zeros((B * self.width, *packed.shape[1:]))
        return out.index_copy(0, self.indices, packed).view(B, self.width, *packed.shape[1:])


def packing(valid_lens: torch.Tensor, width: int) -> Packing:
    """The Packing of a batch of `width` columns whose rows hold valid_lens real tokens (host tensors)."""
    valid_lens = valid_lens.cpu()
    keep = torch.arange(width)[None, :] < valid_lens[:, None]  # (B, T)
    cu_seqlens = F.pad(valid_lens.cumsum(0), (1, 0)).to(torch.int32)  # (B+1,): 0, then each row's end
    indices = keep.flatten().nonzero().squeeze(1)
    return Packing(indices, cu_seqlens, max_seqlen=int(valid_lens.max()), valid_lens=valid_lens, width=width)


def padding_mask(valid_lens: torch.Tensor, T: int) -> torch.Tensor:
    """Key-padding mask for SDPA, True where a key may be attended: (B,) -> (B, 1, 1, T)."""
    return (torch.arange(T, device=valid_lens.device) < valid_lens[:, None])[:, None, None, :]


@cache
def varlen_attn() -> Callable | None:
    """PyTorch's variable-length FlashAttention (CUDA, half precision), None where this torch lacks it."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pk: Packing) -> torch.Tensor:
    """(N, nh, hd) x3 -> (N, nh, hd): each packed row over its own tokens, no dropout (varlen FlashAttention|SDPA)."""
    varlen = varlen_attn()
    if varlen is not None and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        return varlen(q, k, v, cu_seq_q=pk.cu_seqlens, cu_seq_k=pk.cu_seqlens, max_q=pk.max_seqlen, max_k=pk.max_seqlen)
    heads = lambda t: pk.unpack(t).transpose(1, 2)  # noqa: E731  (B, nh, T, hd)
    out = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), attn_mask=padding_mask(pk.valid_lens, pk.width))
    return pk.pack(out.transpose(1, 2))


class BertSelfAttention(nn.Module):
    """Multi-head self-attention through SDPA (on CPUs in training with dropout: dropout.attention)."""

    fused_qkv = True  # False: three products, one per projection (the reference the fused one is tested against)

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.head_dim = cfg.hidden_size // cfg.num_attention_heads
        self.query, self.key, self.value = (nn.Linear(cfg.hidden_size, cfg.hidden_size) for _ in range(3))
        self.dropout_p = cfg.attention_probs_dropout_prob

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(..., H) -> q, k, v, each (..., nh, hd); fused, one product (x read once) of HF's three Linears' weights."""
        heads = (self.num_heads, self.head_dim)
        if not self.fused_qkv:
            return tuple(proj(x).unflatten(-1, heads) for proj in (self.query, self.key, self.value))
        weight = torch.cat([self.query.weight, self.key.weight, self.value.weight])  # (3H, H)
        bias = torch.cat([self.query.bias, self.key.bias, self.value.bias])  # (3H,)
        return F.linear(x, weight, bias).unflatten(-1, (3, *heads)).unbind(-3)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | Packing | None) -> torch.Tensor:
        if isinstance(attn_mask, Packing):  # x: (N, H), the real tokens only
            if self.training and self.dropout_p > 0:
                raise ValueError("the unpadded path has no attention dropout: needs attention_probs_dropout_prob 0")
            return packed_attention(*self.qkv(x), attn_mask).flatten(1)  # (N, H)
        q, k, v = (t.transpose(1, 2) for t in self.qkv(x))  # (B, nh, T, hd)
        out = attention(q, k, v, attn_mask, dropout_p=self.dropout_p if self.training else 0.0)
        return out.transpose(1, 2).flatten(2)  # (B, T, H)


class BertOutput(nn.Module):
    """Back to H, dropout, the residual, then LayerNorm (post-LN): the end of attention and of the FFN."""

    def __init__(self, cfg: ModelConfig, in_features: int) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features, cfg.hidden_size)
        self.LayerNorm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class BertLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention = nn.ModuleDict({"self": BertSelfAttention(cfg), "output": BertOutput(cfg, cfg.hidden_size)})
        self.intermediate = nn.ModuleDict({"dense": nn.Linear(cfg.hidden_size, cfg.intermediate_size)})
        self.act = ACTIVATIONS[cfg.hidden_act]
        self.output = BertOutput(cfg, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | Packing | None) -> torch.Tensor:
        x = self.attention.output(self.attention.self(x, attn_mask), x)
        return self.output(self.act(self.intermediate.dense(x)), x)


class BertPooler(nn.Module):
    """The tanh layer over [CLS] that feeds the NSP classifier."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, encoded: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(encoded[:, 0]))  # (B, H)


class BertModel(nn.Module):
    """d2l's BERTEncoder: embeddings, the encoder stack and the pooler."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = nn.ModuleDict({"layer": nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))})
        self.pooler = BertPooler(cfg)

    @property
    def blocks(self) -> nn.ModuleList:
        """The L encoder blocks in order: the units compiled and sharded one by one."""
        return self.encoder.layer

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        valid_lens: torch.Tensor | None = None,
        *,
        layer: int = -1,
        packed: Packing | None = None,
    ) -> torch.Tensor:
        """Hidden states after `layer` (ModelConfig.layer_index): (B, T) ids and (B,) valid_lens (None: no
        padding) -> (B, T, H); with the batch's Packing, on the real tokens alone: -> (N, H)."""
        if packed is not None:
            x = self.embeddings(packed.pack(input_ids), packed.pack(token_type_ids), packed.indices % packed.width)
            mask: torch.Tensor | Packing | None = packed
        else:
            x = self.embeddings(input_ids, token_type_ids)
            mask = None if valid_lens is None else padding_mask(valid_lens, input_ids.shape[1])
        for block in islice(self.blocks, self.config.layer_index(layer)):  # islice: no new ModuleList per call
            x = block(x, mask)
        return x

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        valid_lens: torch.Tensor | None = None,
        *,
        packed: Packing | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) ids -> the last layer (B, T, H) (packed: (N, H)) and the pooled [CLS] (B, H)."""
        encoded = self.hidden_states(input_ids, token_type_ids, valid_lens, packed=packed)
        if packed is not None:
            first = encoded.index_select(0, packed.cu_seqlens[:-1].long())  # (B, H): each row's [CLS]
            return encoded, self.pooler(first[:, None])
        return encoded, self.pooler(encoded)


class BertLMPredictionHead(nn.Module):
    """d2l's MaskLM: transform, then a decoder tied to the word embeddings plus its own bias."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        norm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.transform = nn.ModuleDict({"dense": nn.Linear(cfg.hidden_size, cfg.hidden_size), "LayerNorm": norm})
        self.act = ACTIVATIONS[cfg.hidden_act]
        self.decoder = nn.Linear(cfg.hidden_size, padded_vocab_size(cfg), bias=False)  # weight tied by the parent
        self.bias = nn.Parameter(torch.zeros(padded_vocab_size(cfg)))
        self.decoder.bias = self.bias  # HF's alias: the key cls.predictions.decoder.bias exists too

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.transform
        return self.decoder(t.LayerNorm(self.act(t.dense(x))))  # (..., V)


class PretrainingOutput(NamedTuple):
    encoded: torch.Tensor  # (B, T, H) last layer; packed: (N, H)
    mlm_logits: torch.Tensor  # (B, P, V) at pred_positions, or (B, T, V) when none are given; V unpadded
    nsp_logits: torch.Tensor  # (B, 2); class 0 = "B follows A"


class BertForPreTraining(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.bert = BertModel(cfg)
        nsp = nn.Linear(cfg.hidden_size, 2)  # d2l's NextSentencePred
        self.cls = nn.ModuleDict({"predictions": BertLMPredictionHead(cfg), "seq_relationship": nsp})
        self.apply(self._init_weights)
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def _init_weights(self, module: nn.Module) -> None:
        """BERT's initialisation: normal(0, initializer_range) weights, zero biases and padding row, unit LayerNorm."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
        if isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
        if isinstance(module, (nn.Linear, nn.LayerNorm, BertLMPredictionHead)) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()

    @property
    def blocks(self) -> nn.ModuleList:
        return self.bert.blocks

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        valid_lens: torch.Tensor | None = None,
        pred_positions: torch.Tensor | None = None,
        *,
        packed: Packing | None = None,
    ) -> PretrainingOutput:
        encoded, pooled = self.bert(input_ids, token_type_ids, valid_lens, packed=packed)
        # The MLM head (and its V-wide decoder) runs only at the P gathered positions (static shapes).
        if pred_positions is None:
            to_predict = encoded if packed is None else packed.unpack(encoded)  # (B, T, H)
        elif packed is not None:  # row b's position t is packed row cu_seqlens[b] + t
            rows = packed.cu_seqlens[:-1, None].long() + pred_positions  # (B, P)
            to_predict = encoded.index_select(0, rows.flatten()).view(*rows.shape, -1)  # (B, P, H)
        else:
            to_predict = encoded.gather(1, pred_positions[..., None].expand(-1, -1, encoded.shape[-1]))  # (B, P, H)
        mlm_logits = self.cls.predictions(to_predict)[..., : self.config.vocab_size]  # (B, P, V): no padding rows
        return PretrainingOutput(encoded, mlm_logits, self.cls.seq_relationship(pooled))
