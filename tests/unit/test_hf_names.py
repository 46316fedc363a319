"""The Hugging Face name map (hf_names): export's to_hf and import's from_hf are inverse on a tiny
model's weights, a weight the map does not know is refused, and the legacy names read as ours."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import safetensors.torch
import torch
from conftest import SMALL_MODEL

from bertcli import hf_names, weights
from bertcli.errors import UsageError
from bertcli.hf_import import load_hf_weights
from bertcli.model import BertForPreTraining
from bertcli.sizes import padded_vocab_size


def tiny_weights(multiple: int) -> tuple[dict[str, torch.Tensor], object]:
    cfg = dataclasses.replace(SMALL_MODEL, pad_vocab_multiple=multiple)
    torch.manual_seed(0)
    return BertForPreTraining(cfg).state_dict(), cfg


@pytest.mark.parametrize("multiple", [1, 64])
def test_to_hf_then_from_hf_gives_the_weights_back(multiple):
    ours, cfg = tiny_weights(multiple)
    V, padded = cfg.vocab_size, padded_vocab_size(cfg)
    assert (padded > V) == (multiple > 1)  # 99 token ids: padded to 128, or not at all
    theirs = hf_names.to_hf(ours, cfg)
    stored = set(ours) - set(hf_names.TIED_ALIASES)
    assert set(theirs) == stored  # Hugging Face's names are ours; the tied aliases are in no file
    for key in hf_names.VOCAB_ROWS:
        assert theirs[key].shape[0] == V and torch.equal(theirs[key], ours[key][:V])
    back = hf_names.from_hf(theirs, cfg)
    assert set(back) == stored
    for key in stored:
        if key in hf_names.VOCAB_ROWS:  # the padding rows come back as zeros: never looked up, never targets
            assert torch.equal(back[key][:V], ours[key][:V]) and not back[key][V:].any(), key
            assert back[key].shape == ours[key].shape, key
        else:
            assert torch.equal(back[key], ours[key]), key


@pytest.mark.parametrize(
    "key", ["secret.payload", "bert.encoder.layer.0.attention.self.qkv.weight", "bert.encoder.layer.0.query.weight"]
)
def test_a_weight_the_map_does_not_know_is_refused(key):
    """export's check of a checkpoint's weights file (weights.check_file) refuses it before to_hf names it."""
    ours, cfg = tiny_weights(64)
    shapes = {k: tuple(v.shape) for k, v in ours.items() if k not in hf_names.TIED_ALIASES} | {key: (2,)}
    with pytest.raises(UsageError, match=rf"model.safetensors: .*1 unexpected \(e.g. {re.escape(key)}\)"):
        weights.check_shapes(shapes, hf_names.weight_shapes(cfg), Path("model.safetensors"))


def test_legacy_names_are_read_as_ours():
    renames = {
        "embeddings.LayerNorm.gamma": "bert.embeddings.LayerNorm.weight",  # a bare BertModel, TF-converted
        "bert.encoder.layer.1.output.LayerNorm.beta": "bert.encoder.layer.1.output.LayerNorm.bias",
        "encoder.layer.11.intermediate.dense.weight": "bert.encoder.layer.11.intermediate.dense.weight",
        "pooler.dense.bias": "bert.pooler.dense.bias",
        "cls.seq_relationship.weight": "cls.seq_relationship.weight",
        "bert.embeddings.position_ids": None,  # a buffer of old transformers versions
        "cls.predictions.decoder.weight": None,  # a tied alias: its target carries it
    }
    assert {key: hf_names.our_key(key) for key in renames} == renames


def test_an_hf_tensor_the_map_does_not_know_is_refused_by_the_one_fit_check(tmp_path):
    """from_hf keeps an unknown tensor under its name, so that check_fits names it with the model's other misfits."""
    ours, cfg = tiny_weights(64)
    theirs = hf_names.to_hf(ours, cfg)
    del theirs["bert.embeddings.token_type_embeddings.weight"]
    theirs["secret.payload"] = torch.zeros(3)
    safetensors.torch.save_file(theirs, tmp_path / "model.safetensors")
    with pytest.raises(UsageError, match=r"1 missing \(e.g. bert.embeddings.token_type.*1 unexpected \(e.g. secret"):
        load_hf_weights(tmp_path, cfg)


@pytest.mark.parametrize("preset", ["tiny", "base", "large"])
def test_weight_shapes_are_those_of_the_built_model(preset):
    """hf_names.weight_shapes (torch-free, what a weights file's header is checked against before
    torch loads) gives every weight of BertForPreTraining with its shape, vocabulary rows padded."""
    from bertcli.config_load import preset_config

    cfg = dataclasses.replace(preset_config(preset).model, vocab_size=1003)  # padded to 1,008 or 1,024
    with torch.device("meta"):
        model = BertForPreTraining(cfg)
    built = {k: tuple(v.shape) for k, v in model.state_dict().items() if k not in hf_names.TIED_ALIASES}
    assert hf_names.weight_shapes(cfg) == built
