"""Hugging Face names, in one declarative map (as torchtitan's state_dict_adapter.py): the
Hugging Face key of each bertcli weight, the tied aliases no file stores, the tensors that carry
bertcli's padded vocabulary rows, the legacy names accepted on import, and the config.json
fields. `to_hf` (export) and `from_hf` (import) are the only translations between the two.

bertcli's modules carry `BertForPreTraining`'s names, so each key maps to itself; what differs is
bookkeeping: the vocabulary rows are padded to a multiple of model.pad_vocab_multiple for speed
(to_hf drops the padding, from_hf adds it back), and no file stores the tied aliases.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from bertcli.config import ModelConfig
from bertcli.sizes import padded_vocab_size

if TYPE_CHECKING:  # only from_hf makes tensors: the names are read without torch
    import torch

# config.json's fields: BertConfig's, which ModelConfig's carry but its two of bertcli's own.
HF_FIELDS = [f.name for f in dataclasses.fields(ModelConfig) if f.name not in ("pad_vocab_multiple", "init_from")]

# Every weight of bertcli's BertForPreTraining ("{}": a layer number). The rule: its Hugging Face
# key is the same name; a module renamed in model.py gets its Hugging Face name in TO_HF.
KEYS = (
    "bert.embeddings.word_embeddings.weight",
    "bert.embeddings.position_embeddings.weight",
    "bert.embeddings.token_type_embeddings.weight",
    "bert.embeddings.LayerNorm.weight",
    "bert.embeddings.LayerNorm.bias",
    *(
        f"bert.encoder.layer.{{}}.{part}.{kind}"
        for part in (
            "attention.self.query",
            "attention.self.key",
            "attention.self.value",
            "attention.output.dense",
            "attention.output.LayerNorm",
            "intermediate.dense",
            "output.dense",
            "output.LayerNorm",
        )
        for kind in ("weight", "bias")
    ),
    "bert.pooler.dense.weight",
    "bert.pooler.dense.bias",
    "cls.predictions.bias",
    "cls.predictions.transform.dense.weight",
    "cls.predictions.transform.dense.bias",
    "cls.predictions.transform.LayerNorm.weight",
    "cls.predictions.transform.LayerNorm.bias",
    "cls.seq_relationship.weight",
    "cls.seq_relationship.bias",
)
TO_HF = {key: key for key in KEYS}


def weight_keys(cfg: ModelConfig) -> set[str]:
    """Every key a weights file of a model of `cfg` holds (bertcli's names, layers numbered)."""
    return {key.format(i) for key in KEYS for i in (range(cfg.num_hidden_layers) if "{}" in key else [0])}


def weight_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every weight of a model of `cfg` (weight_keys), vocabulary rows padded
    (padded_vocab_size), from the config's numbers alone: what a weights file is checked against
    before anything of its size is built."""
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
        ("weight", (h, h)),  # query, key, value, pooler, the MLM head's transform
        ("bias", (h,)),
    )
    return {key: next(shape for suffix, shape in by_suffix if key.endswith(suffix)) for key in weight_keys(cfg)}


FROM_HF = {hf: ours for ours, hf in TO_HF.items()}

# In state_dict() but in no weights file (bertcli's or Hugging Face's): aliases of other parameters
# (tied weights), which follow their targets when loaded.
TIED_ALIASES = {
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}

# Tensors with a row per token id: padded_vocab_size(cfg) rows in bertcli, vocab_size in Hugging Face.
VOCAB_ROWS = ("bert.embeddings.word_embeddings.weight", "cls.predictions.bias")

# Accepted on import only. Original TF-converted checkpoints name LayerNorm's parameters gamma and beta;
# a bare BertModel has no "bert." prefix; old transformers versions store position_ids, a buffer.
LEGACY = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}
BARE_PREFIXES = ("embeddings.", "encoder.", "pooler.")
DROPPED_SUFFIXES = ("position_ids",)

_LAYER = re.compile(r"(?<=\.layer\.)\d+(?=\.)")  # the layer number of an encoder key


def _mapped(key: str, names: dict[str, str]) -> str | None:
    """`key` through `names` (TO_HF or FROM_HF), its layer number kept; None if `names` lacks it."""
    template = _LAYER.sub("{}", key, count=1)
    if template not in names:
        return None
    number = _LAYER.search(key)
    return names[template].format(number.group(0)) if number else names[template]


def hf_key(key: str) -> str:
    """The Hugging Face key of bertcli weight `key`; a ValueError for a key the map does not know."""
    name = _mapped(key, TO_HF)
    if name is None:
        raise ValueError(f"{key}: not a weight of bertcli's BertForPreTraining, so it has no Hugging Face name")
    return name


def our_key(key: str) -> str | None:
    """bertcli's name for Hugging Face (or original TF-converted) key `key`; None for what no model
    loads (a buffer, a tied alias). A key the map does not know keeps its name: checkpoint.check_fits,
    the one check of weights against a model, then names it with the model's other misfits."""
    for old, new in LEGACY.items():
        key = key.replace(old, new)
    if key.endswith(DROPPED_SUFFIXES) or key in TIED_ALIASES:
        return None
    if key.startswith(BARE_PREFIXES):
        key = "bert." + key
    return _mapped(key, FROM_HF) or key


def our_keys(keys: Iterable[str]) -> dict[str, str]:
    """bertcli's name -> the file's key, for the keys of a weights file (our_key; those no model loads
    left out). Two keys of one weight (`X` and `bert.X`, `LayerNorm.gamma` and `LayerNorm.weight`)
    are a ValueError: which one a loader takes is a guess (transformers takes `bert.X`, a dict
    built in file order the last), and the two give other vectors when they differ."""
    names: dict[str, str] = {}
    for key in keys:
        new = our_key(key)
        if new is None:
            continue
        if new in names:
            raise ValueError(f"holds both {names[new]} and {key}, two tensors for the one weight {new}")
        names[new] = key
    return names


def to_hf(state_dict: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """bertcli weights (a state_dict, or a checkpoint's: with or without the tied aliases) under Hugging
    Face's names, the vocabulary padding rows dropped; a ValueError for a weight the map does not know."""
    out = {}
    for key, value in state_dict.items():
        if key in TIED_ALIASES:
            continue  # their targets carry them
        out[hf_key(key)] = value[: cfg.vocab_size].contiguous() if key in VOCAB_ROWS else value
    return out


def from_hf(state_dict: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Hugging Face weights under bertcli's names (our_key), the vocabulary rows padded with zeros to
    padded_vocab_size(cfg). A tensor of another number of rows is left as it is, for check_fits to refuse."""
    import torch

    weights = {new: state_dict[key] for new, key in our_keys(state_dict).items()}
    V, padded = cfg.vocab_size, padded_vocab_size(cfg)
    for key in VOCAB_ROWS:
        if key in weights and weights[key].shape[0] == V and padded > V:
            pad = torch.zeros((padded - V, *weights[key].shape[1:]), dtype=weights[key].dtype)
            weights[key] = torch.cat([weights[key], pad])
    return weights
