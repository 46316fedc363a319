"""Hugging Face BERT folders: config.json checked against the weights, the tokenizer against the model; no pickle."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import safetensors
from tokenizers import Tokenizer

from bertcli import hf_names, layout, weights
from bertcli.config import ModelConfig, TokenizerConfig
from bertcli.config_load import model_config_from_dict
from bertcli.data.tokenizer import find_tokenizer_file, load_tokenizer
from bertcli.errors import UsageError
from bertcli.hf_names import HF_FIELDS
from bertcli.layout import Kind
from bertcli.sbert import SentenceModel, read_sentence_model
from bertcli.store import read_json

if TYPE_CHECKING:  # the loaders import torch: configs and shapes are read without it (inspect)
    import torch

    from bertcli.model import BertForPreTraining


def read_hf_config(folder: Path) -> ModelConfig:
    file = Path(folder) / layout.HF_CONFIG
    raw = read_json(file)
    if raw.get("model_type", "bert") != "bert":
        raise UsageError(f"{file}: model_type is {raw.get('model_type')!r}; bertcli reads BERT models only")
    for key, (ours, what) in UNSUPPORTED.items():  # settings that change what the encoder computes
        if raw.get(key, ours) != ours:
            raise UsageError(f"{file}: {key} {raw[key]!r} is not supported ({what}); bertcli reads BERT encoders")
    values = {name: raw[name] for name in HF_FIELDS if raw.get(name) is not None}
    cfg = model_config_from_dict(values, str(file))  # strict: types, choices, divisibility
    weights.check_file(weights_file(folder), cfg, file, OPTIONAL_PARTS)  # before anything of its size is built
    return cfg


# config.json settings of BertModel that bertcli's encoder does not implement: the value it does, and what that means.
UNSUPPORTED = {
    "position_embedding_type": ("absolute", "absolute position embeddings only"),
    "is_decoder": (False, "bidirectional attention only: a decoder attends to earlier tokens only"),
    "add_cross_attention": (False, "no cross-attention"),
}

DECODER = "cls.predictions.decoder.weight"  # an MLM decoder of its own (tie_word_embeddings false)


def check_tied(folder: Path) -> None:
    """Refuse to continue from a folder with an MLM decoder of its own: bertcli's, tied, would drop it unsaid."""
    file = Path(folder) / layout.HF_CONFIG
    if read_json(file).get("tie_word_embeddings", True) is False:
        with safetensors.safe_open(weights_file(folder), "numpy") as f:
            if DECODER in f.keys():
                raise UsageError(f"{file}: tie_word_embeddings is false: bertcli ties {DECODER}; use a tied model")


# The parts a Hugging Face folder may lack (a bare BertModel, a BertForMaskedLM): initialised fresh.
PARTS = {"bert.pooler.": "pooler", "cls.predictions.": "MLM head", "cls.seq_relationship.": "NSP head"}
OPTIONAL_PARTS = tuple(PARTS)

# BERT's uncased tokenizer.json takes 15 bytes a token, its vocab.txt 8: one past 1 KiB a token is another model's.
TOKENIZER_BYTES_PER_TOKEN = 1024


def load_model_tokenizer(file: Path, cfg: ModelConfig) -> Tokenizer:
    """A model folder's tokenizer `file`, checked against `cfg`; one too large for vocab_size refused unread."""
    size, n = Path(file).stat().st_size, cfg.vocab_size
    if size > TOKENIZER_BYTES_PER_TOKEN * n + (1 << 20):
        raise UsageError(
            f"{file}: {size / 2**20:,.1f} MiB, too large for vocab_size {n:,}; restore the model's tokenizer"
        )
    tok = load_tokenizer(file, TokenizerConfig())  # a vocab.txt follows its tokenizer_config.json
    check_tokenizer(tok, cfg, file)
    return tok


@dataclass(frozen=True)
class EncoderFolder:
    """A Hugging Face (or sentence-transformers) folder given to `encode`, checked before torch loads."""

    sentence: SentenceModel | None
    folder: Path
    config: ModelConfig
    tokenizer: Tokenizer


def read_encoder_folder(path: Path) -> EncoderFolder | None:
    """`path` as an EncoderFolder, or None where it is no Hugging Face folder."""
    found = layout.identify(path)
    sentence = read_sentence_model(path) if found.kind is Kind.SENTENCE else None
    folder = sentence.transformer if sentence else path
    if not (found.kind is Kind.HF or (sentence is not None and layout.is_hf_folder(folder))):
        return None
    if not any((folder / name).is_file() for name in layout.TOKENIZER_FILES):  # before the weights load
        raise UsageError(f"{folder}: no tokenizer.json or vocab.txt; copy the model's tokenizer files into it")
    cfg = read_hf_config(folder)  # its sizes checked against the weights file
    check_finite_weights(folder)
    return EncoderFolder(sentence, folder, cfg, load_model_tokenizer(find_tokenizer_file(folder), cfg))


def tokenizer_limit(folder: Path) -> int | None:
    """tokenizer_config.json's model_max_length, what transformers truncates at; None: not a whole number >= 2."""
    file = Path(folder) / layout.TOKENIZER_CONFIG
    try:
        raw = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
    except (OSError, ValueError, RecursionError):
        return None
    length = raw.get("model_max_length") if isinstance(raw, dict) else None
    return length if isinstance(length, int) and not isinstance(length, bool) and length >= 2 else None


def check_tokenizer(tok: Tokenizer, cfg: ModelConfig, file: Path) -> None:
    """Refuse a tokenizer with ids past the model's vocab_size: they would index padding rows or nothing."""
    top, size = max(tok.get_vocab(with_added_tokens=True).values(), default=-1), cfg.vocab_size
    if top >= size:
        raise UsageError(f"{file}: token id {top:,} past vocab_size {size:,}; restore the model's tokenizer")


def weights_file(folder: Path) -> Path:
    folder = Path(folder)
    file = folder / layout.WEIGHTS
    if not file.is_file():
        pickle = " (not pytorch_model.bin: safetensors only)" if (folder / layout.HF_PICKLE).is_file() else ""
        raise UsageError(f"{folder}: no model.safetensors{pickle}; save it with save_pretrained(folder)")
    return file


def check_finite_weights(folder: Path) -> None:
    weights.check_finite_file(weights_file(folder), "restore it, or use another model")


def load_hf_weights(folder: Path, cfg: ModelConfig) -> tuple[dict[str, torch.Tensor], list[str]]:
    """A folder's weights under bertcli's names, checked against `cfg`, and the parts it lacks (initialised fresh)."""
    file = weights_file(folder)
    tensors = hf_names.from_hf(weights.load(file, "restore it, or use another model"), cfg)
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    missing = weights.check_shapes(shapes, hf_names.weight_shapes(cfg), file, optional=OPTIONAL_PARTS)
    fresh = sorted({name for prefix, name in PARTS.items() if any(k.startswith(prefix) for k in missing)})
    return {k: v.float() for k, v in tensors.items()}, fresh


def load_into(model: BertForPreTraining, folder: Path, uninitialised: bool = False) -> list[str]:
    """Load a folder into `model`; the parts it lacked, left fresh (initialised here where built `uninitialised`)."""
    tensors, fresh = load_hf_weights(folder, model.config)
    if uninitialised:
        missing = set(model.state_dict()) - set(tensors) - set(hf_names.TIED_ALIASES)
        for name, module in model.named_modules():  # a module owning a missing weight
            if any(f"{name}.{p}" in missing for p, _ in module.named_parameters(recurse=False)):
                model._init_weights(module)
    model.load_state_dict(tensors, strict=False)  # absent parts keep their fresh initialisation
    return fresh
