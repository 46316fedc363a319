"""Hugging Face weight names: the same keys, vocabulary rows unpadded, no tied aliases; legacy names on import."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING

from bertcli.config import ModelConfig
from bertcli.sizes import padded_vocab_size

if TYPE_CHECKING:  # only from_hf makes tensors: the names are read without torch
    import torch

# config.json's fields: BertConfig's, which ModelConfig's carry but its two of bertcli's own.
HF_FIELDS = [f.name for f in dataclasses.fields(ModelConfig) if f.name not in ("pad_vocab_multiple", "init_from")]

# Every weight of bertcli's BertForPreTraining ("{}": a layer number), under its Hugging Face key.
ATTENTION = ("self.query", "self.key", "self.value", "output.dense", "output.LayerNorm")
LAYER_MODULES = (*(f"attention.{m}" for m in ATTENTION), "intermediate.dense", "output.dense", "output.LayerNorm")
MODULES = (
    "bert.embeddings.LayerNorm",
    *(f"bert.encoder.layer.{{}}.{m}" for m in LAYER_MODULES),
    "bert.pooler.dense",
    "cls.predictions.transform.dense",
    "cls.predictions.transform.LayerNorm",
    "cls.seq_relationship",
)
KEYS = (
    *(f"bert.embeddings.{table}_embeddings.weight" for table in ("word", "position", "token_type")),
    "cls.predictions.bias",
    *(f"{module}.{kind}" for module in MODULES for kind in ("weight", "bias")),
)


def weight_keys(cfg: ModelConfig) -> set[str]:
    """Every key a weights file of a model of `cfg` holds (bertcli's names, layers numbered)."""
    return {key.format(i) for key in KEYS for i in (range(cfg.num_hidden_layers) if "{}" in key else [0])}


def weight_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every weight of a model of `cfg`, vocabulary rows padded, from the config's numbers alone."""
    h, i, V = cfg.hidden_size, cfg.intermediate_size, padded_vocab_size(cfg)
    by_suffix = (  # the first suffix a key ends with gives its shape
        ("word_embeddings.weight", (V, h)),
        ("position_embeddings.weight", (cfg.max_position_embeddings, h)),
        ("token_type_embeddings.weight", (cfg.type_vocab_size, h)),
        ("attention.output.dense.weight", (h, h)),
        ("intermediate.dense.weight", (i, h)),
        ("intermediate.dense.bias", (i,)),
        ("output.dense.weight", (h, i)),  # the feed-forward block's second product
        ("predictions.bias", (V,)),
        ("seq_relationship.weight", (2, h)),
        ("seq_relationship.bias", (2,)),
        ("LayerNorm.weight", (h,)),
        ("weight", (h, h)),
        ("bias", (h,)),  # weight: Q, K, V, pooler, MLM transform
    )
    return {key: next(shape for suffix, shape in by_suffix if key.endswith(suffix)) for key in weight_keys(cfg)}


# In state_dict() but in no weights file: aliases of tied parameters, which follow their targets when loaded.
TIED_ALIASES = {
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}

# Tensors with a row per token id: padded_vocab_size(cfg) rows in bertcli, vocab_size in Hugging Face.
VOCAB_ROWS = ("bert.embeddings.word_embeddings.weight", "cls.predictions.bias")

# Import only: TF checkpoints' LayerNorm gamma and beta, a bare BertModel's keys, old transformers' position_ids.
LEGACY = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}
BARE_PREFIXES = ("embeddings.", "encoder.", "pooler.")
DROPPED_SUFFIXES = ("position_ids",)


def our_key(key: str) -> str | None:
    """bertcli's name of HF (or TF) key `key`, an unknown one kept for the shape check; None: a buffer or an alias."""
    for old, new in LEGACY.items():
        key = key.replace(old, new)
    if key.endswith(DROPPED_SUFFIXES) or key in TIED_ALIASES:
        return None
    return "bert." + key if key.startswith(BARE_PREFIXES) else key


def our_keys(keys: Iterable[str]) -> dict[str, str]:
    """bertcli's name -> the file's key; two keys of one weight (`X`, `bert.X`) are a ValueError: which is it?"""
    names: dict[str, str] = {}
    for key in keys:
        if (new := our_key(key)) in names:
            raise ValueError(f"holds both {names[new]} and {key}, two tensors for the one weight {new}")
        if new is not None:
            names[new] = key
    return names


def to_hf(state_dict: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """bertcli weights (keys checked: weights.check_file) under HF names; vocabulary padding, tied aliases dropped."""
    kept = {k: v for k, v in state_dict.items() if k not in TIED_ALIASES}
    return {k: v[: cfg.vocab_size].contiguous() if k in VOCAB_ROWS else v for k, v in kept.items()}


def from_hf(state_dict: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """HF weights under bertcli's names, vocabulary rows zero-padded (another row count: the shape check refuses)."""
    import torch

    weights = {new: state_dict[key] for new, key in our_keys(state_dict).items()}
    V, padded = cfg.vocab_size, padded_vocab_size(cfg)
    for key in VOCAB_ROWS:
        if key in weights and weights[key].shape[0] == V and padded > V:
            pad = torch.zeros((padded - V, *weights[key].shape[1:]), dtype=weights[key].dtype)
            weights[key] = torch.cat([weights[key], pad])
    return weights
