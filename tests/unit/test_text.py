"""Real text: reading, the tokenizer, `prepare` (shards, manifest, caching, errors), Google-style
pairs and whole-word masking on real text, evaluation, and exact resume on real text."""

from __future__ import annotations

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
from conftest import TEXT, assert_same_batch, prepared_files, read_metrics, text_run
from tokenizers import Tokenizer, models, trainers

from bertcli import layout
from bertcli.config import TokenizerConfig
from bertcli.config_load import load_config, preset_config
from bertcli.data.corpus import is_held_out
from bertcli.data.examples import IGNORE, ExampleBuilder
from bertcli.data.prepare import make_plan, prepare
from bertcli.data.prepared import load_prepared
from bertcli.data.scan import FORMAT_VERSION, SAMPLE, unchanged_bytes, unit_phase
from bertcli.data.text import read_sentences, read_text, split_sentences
from bertcli.data.tokenizer import SPECIAL, Casing, _bert_pipeline, scan_characters, train_wordpiece
from bertcli.errors import UsageError
from bertcli.resolve import load_run
from bertcli.trainer import pretrain


def train(config: Path, **kwargs) -> dict:
    return pretrain(load_run(config), quiet=True, **kwargs)


# ------------------------------------------------------------------ reading


def test_sentence_splitter():
    assert split_sentences(
        "The module defines functions. See e.g. the docs. Dr. Who met J. Smith. "
        "It returns 3. Then it stops! Really? Yes."
    ) == [
        "The module defines functions.",
        "See e.g. the docs.",
        "Dr. Who met J. Smith.",
        "It returns 3.",
        "Then it stops!",
        "Really?",
        "Yes.",
    ]
    assert split_sentences("short line") == ["short line"]
    # Closing quotes and brackets stay with their sentence, not dropped.
    quoted = (
        'The man at the door said "hello there." Then he left. It ended here (see above.) Next one. '
        "\u201cYes, certainly!\u201d And so on [as noted.] Done."
    )
    assert split_sentences(quoted) == [
        'The man at the door said "hello there."',
        "Then he left.",
        "It ended here (see above.)",
        "Next one.",
        "\u201cYes, certainly!\u201d",
        "And so on [as noted.]",
        "Done.",
    ]


def test_splitting_and_cutting_lose_no_character_of_real_text():
    """Sentence splitting and the cutting of over-long lines only cut: every character but the white
    space at a cut is kept, on the bundled real text (dropping closing quotes and brackets loses 131
    characters of python-docs)."""
    from bertcli.data.text import cut_long_line

    text = gzip.decompress(SAMPLE.read_bytes()).decode()
    for line in text.splitlines():
        assert "".join(line.split()) == "".join("".join(split_sentences(line)).split()), line
    whole = " ".join(text.splitlines())
    assert "".join(whole.split()) == "".join("".join(cut_long_line(whole, limit=1000)).split())


def test_reading_text_gzip_folders_and_jsonl(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("First doc line one.\nLine two.\n\n\nSecond doc.\n")
    with gzip.open(tmp_path / "sub" / "b.txt.gz", "wt") as fh:
        fh.write("Third doc.\n")
    (tmp_path / "c.jsonl").write_text(  # with a byte-order mark, as Windows editors save it
        "\ufeff"
        + json.dumps({"text": "Fourth doc.\nStill fourth."})
        + "\n\n"
        + json.dumps({"text": "Fifth doc.", "id": 5})
        + "\n"
    )
    (tmp_path / "ignored.md").write_text("not a corpus file\n")
    from bertcli.data.scan import corpus_files

    assert "Fourth doc." in "".join(read_text([tmp_path / "c.jsonl"])), "the first record is read"
    items = list(read_sentences(corpus_files(tmp_path)))
    assert items == [
        "First doc line one.",
        "Line two.",
        None,
        "Second doc.",
        None,
        "Fourth doc.",
        "Still fourth.",
        None,
        "Fifth doc.",
        None,
        "Third doc.",
        None,
    ]


@pytest.mark.parametrize(
    "content, facts",
    [
        (b"good line\nbad \xff byte\n", ("byte 14", "line 2", "UTF-8")),
        (b"text\x00with nul\n", ("NUL",)),
        # UTF-16 text is text in another encoding, not binary data to remove: named so, with the converter
        ("Hello world.\n".encode("utf-16"), ("UTF-16", "iconv -f UTF-16")),
        ("Hello world.\n".encode("utf-16-le"), ("UTF-16", "iconv -f UTF-16")),  # no byte-order mark
        ("Grüße.\n".encode("utf-32"), ("UTF-32", "iconv -f UTF-32")),
        (b"PK\x03\x04\x00\x00", ("zip",)),
    ],
    ids=["invalid-utf8", "nul", "utf16", "utf16-no-bom", "utf32", "zip"],
)
def test_bad_bytes_name_file_and_offset(tmp_path, content, facts):
    """The corpus as prepare reads it (its files checked, then read): refused with the file named and
    what is wrong with its bytes."""
    from bertcli.data.scan import corpus_files

    bad = tmp_path / "bad.txt"
    bad.write_bytes(content)
    with pytest.raises(UsageError) as info:
        list(read_sentences(corpus_files(bad)))
    message = str(info.value)
    assert message.startswith(f"{bad}: ") and "\n" not in message, message
    assert all(fact in message for fact in facts), message
    if content.startswith(b"text\x00"):  # the reader itself names the offset of a NUL byte
        with pytest.raises(UsageError, match=re.escape(f"{bad}: byte 4: a NUL byte")):
            list(read_sentences([bad]))


def test_a_gzip_file_under_a_plain_name_is_read_by_its_content(tmp_path):
    from bertcli.data.scan import corpus_files

    (tmp_path / "plain.txt").write_bytes(gzip.compress(b"Hello world.\n\nA second document.\n", mtime=0))
    assert list(read_sentences(corpus_files(tmp_path / "plain.txt"))) == [
        "Hello world.",
        None,
        "A second document.",
        None,
    ]


# ------------------------------------------------------------------ prepare


def test_prepare_writes_shards_manifest_and_tokenizer(tmp_path, small_corpus):
    config = text_run(tmp_path, small_corpus)
    folder = prepare(load_run(config), quiet=True)
    assert folder == tmp_path / "data"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["format_version"] == FORMAT_VERSION and manifest["dtype"] == "uint16"
    assert manifest["corpus"]["files"][0]["bytes"] == small_corpus.stat().st_size
    assert len(manifest["corpus"]["files"][0]["sha256"]) == 64
    prepared = load_prepared(folder)
    assert prepared.vocab_size == manifest["tokenizer"]["vocab_size"] <= 1000
    assert (folder / "vocab.txt").read_text().splitlines()[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    train, valid = prepared.corpus("train"), prepared.corpus("valid")
    assert train.num_documents + valid.num_documents == 60
    assert valid.num_documents == 6  # every 10th document with validation_fraction 0.1
    assert train.num_tokens == manifest["splits"]["train"]["tokens"] == int(train.seg_offsets[-1])
    assert np.all(np.diff(np.asarray(train.seg_offsets)) > 0), "no empty sentences"
    # The shards decode back to the text they came from (the first document is held out when its unit's phase says so).
    held = is_held_out(0, 0.1, unit_phase(manifest["units"][0]["content"], 10))
    first = prepared.tokenizer.decode(np.asarray((valid if held else train).segment(0)).tolist())
    first_line = small_corpus.read_text().splitlines()[0].lower()
    assert first_line.startswith(first[:20])


def test_prepare_is_cached_and_redone_when_the_corpus_changes(tmp_path, small_corpus, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(small_corpus.read_text())
    config = text_run(tmp_path / "run", corpus)
    cfg = load_run(config)
    folder = prepare(cfg, quiet=True)
    tokens = _unit(folder) / "train" / "tokens.bin"
    before = (tokens.stat().st_mtime_ns, json.loads((folder / "manifest.json").read_text())["created"])
    capsys.readouterr()
    result = pretrain(load_run(config), quiet=False, stop_at=1)  # pretrain reuses it (and says so: not quiet)
    assert result["step"] == 1
    err = capsys.readouterr().err
    assert "up to date" in err
    # A sentence alone in a 48-token example is paired with the one before: about 51% random, no warning.
    assert err.count("% of the NSP pairs will have a random next sentence") == 0, err
    assert tokens.stat().st_mtime_ns == before[0], "not re-tokenized"
    assert json.loads((folder / "manifest.json").read_text())["created"] == before[1], "the manifest was not rewritten"
    corpus.write_text(corpus.read_text() + "\nOne more document about something new.\n")
    prepare(cfg, quiet=True)
    assert "up to date" not in capsys.readouterr().err
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["splits"]["train"]["documents"] + manifest["splits"]["valid"]["documents"] == 61


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda d: d / "missing.txt", ("missing.txt: not found", "data.corpus")),
        (lambda d: (d / "empty.txt").write_text("\n\n  \n") and d / "empty.txt", "the corpus is empty"),
        (
            lambda d: (d / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1")) and d / "latin1.txt",
            "latin1.txt: byte 3 (line 1): not valid UTF-8",
        ),
        (
            lambda d: (d / "few.txt").write_text("One doc.\n\nTwo docs.\n\nThree docs.\n") and d / "few.txt",
            "too small for the held-out split",
        ),
        (lambda d: (d / "folder").mkdir() or d / "folder", "no *.txt and *.jsonl files (plain, .gz, .bz2 or .xz)"),
    ],
)
def test_bad_corpora_exit_2_with_one_line_and_no_output(tmp_path, cli, make, needle):
    corpus = make(tmp_path)
    config = text_run(tmp_path / "run", corpus)
    result = cli("prepare", "--config", config, "--quiet")
    assert result.code == 2, result.err
    needles = needle if isinstance(needle, tuple) else (needle,)
    assert len(result.err_lines) == 1 and all(n in result.err for n in needles), result.err
    assert result.err.startswith("bertcli: error: ") and "Traceback" not in result.err
    assert not (tmp_path / "run" / "data").exists(), "no partial prepared data left behind"
    assert not list((tmp_path / "run").glob(".tmp-*"))


def test_vocab_size_that_disagrees_with_the_tokenizer_is_an_error(tmp_path, small_corpus):
    config = text_run(tmp_path, small_corpus, "model.vocab_size=5000")
    with pytest.raises(UsageError, match="set model.vocab_size: null"):
        train(config)


def test_existing_vocab_txt_is_used_as_the_tokenizer(tmp_path, small_corpus):
    first = text_run(tmp_path / "a", small_corpus)
    folder = prepare(load_run(first), quiet=True)
    second = text_run(tmp_path / "b", small_corpus, f"data.tokenizer.path={folder / 'vocab.txt'}")
    again = load_prepared(prepare(load_run(second), quiet=True))
    assert again.manifest["tokenizer"]["source"] == str(folder / "vocab.txt")
    a, b = load_prepared(folder).corpus("train"), again.corpus("train")
    assert np.array_equal(np.asarray(a.tokens), np.asarray(b.tokens)), "vocab.txt reproduces the trained tokenizer"


# Words whose inner characters are hard to get right, each with letters that occur nowhere else:
# control characters and (stripped) accents vanish and join their neighbours (U+001C ends a line
# in JSON Lines), a character lowercases to two, punctuation and CJK end words, case, a BOM, text
# split across blocks and files.
TRICKY = (
    "a\u0007\u0436 \u0451\u001c\u0439 c\u0301\u0437 \u0301e \u0130stanbul x.\u0449 "
    "\u0444\u4e2d\u0446 \u00a9\u044a \u0392\u0395\u03a1\u03a4 \u00dfo o\u00df \ufeffword tab\there\n\nTwo\u2028docs \u044e"
)


@pytest.mark.parametrize("lowercase, strip_accents", [(True, True), (True, False), (False, False)])
def test_inner_characters_are_the_continuation_pieces_the_trainer_makes(
    tmp_path, small_corpus, lowercase, strip_accents
):
    (tmp_path / "docs.txt").write_text(small_corpus.read_text()[:30_000])
    (tmp_path / "tricky.txt").write_text(TRICKY)
    (tmp_path / "tricky.jsonl").write_text(json.dumps({"text": TRICKY[::-1]}) + "\n")
    files = [tmp_path / "docs.txt", tmp_path / "tricky.txt", tmp_path / "tricky.jsonl"]
    cfg = TokenizerConfig(vocab_size=300, lowercase=lowercase, strip_accents=strip_accents)
    # The trainer as it is: its "##c" pieces (ids vary from process to process, the set does not).
    plain = _bert_pipeline(
        Tokenizer(models.WordPiece(unk_token="[UNK]")), Casing(do_lower_case=lowercase, strip_accents=strip_accents)
    )
    plain.train_from_iterator(
        (s for s in read_sentences(files) if s is not None),
        trainer=trainers.WordPieceTrainer(vocab_size=300, special_tokens=list(SPECIAL)),
    )
    made = sorted(t[2:] for t in plain.get_vocab() if t.startswith("##") and len(t) == 3)
    assert len(made) > 30
    assert scan_characters(read_text(files, block=5), cfg).inner == made


@pytest.mark.parametrize("lowercase, strip_accents", [(True, True), (False, False)])
def test_every_character_is_the_alphabet_the_trainer_makes(tmp_path, small_corpus, lowercase, strip_accents):
    """The characters a sampled vocabulary is given (the trainer's initial alphabet): on the whole
    corpus, exactly the ones the trainer finds itself, so that a corpus within the budget gets the
    vocabulary it always got."""
    (tmp_path / "docs.txt").write_text(small_corpus.read_text()[:30_000])
    (tmp_path / "tricky.txt").write_text(TRICKY)
    (tmp_path / "tricky.jsonl").write_text(json.dumps({"text": TRICKY[::-1]}) + "\n")
    files = [tmp_path / "docs.txt", tmp_path / "tricky.txt", tmp_path / "tricky.jsonl"]
    plain = _bert_pipeline(
        Tokenizer(models.WordPiece(unk_token="[UNK]")), Casing(do_lower_case=lowercase, strip_accents=strip_accents)
    )
    plain.train_from_iterator(
        (s for s in read_sentences(files) if s is not None),
        trainer=trainers.WordPieceTrainer(vocab_size=300, special_tokens=list(SPECIAL)),
    )
    alphabet = sorted(t for t in plain.get_vocab() if len(t) == 1)
    chars = scan_characters(
        read_text(files, block=5), TokenizerConfig(lowercase=lowercase, strip_accents=strip_accents)
    )
    assert len(alphabet) > 50 and chars.every == alphabet
    assert (
        chars.count
        == scan_characters(read_text(files), TokenizerConfig()).count
        == sum(len(text) - text.count("\n") for text in read_text(files))
    )  # however the text is cut


def test_continuation_pieces_are_ordinary_vocabulary(small_corpus):
    sentences = [s for s in read_sentences([small_corpus]) if s is not None]
    cfg = TokenizerConfig(vocab_size=500)
    tok = train_wordpiece(sentences, cfg, scan_characters(sentences, cfg))
    vocab = tok.get_vocab()
    assert vocab["##a"] > vocab["[MASK]"] == 4
    assert sorted(t.content for t in tok.get_added_tokens_decoder().values()) == sorted(SPECIAL)
    # Literal "##a" is text (punctuation, then a letter), never the piece "##a" as a special token.
    assert tok.encode("##a [MASK]", add_special_tokens=False).tokens == ["#", "#", "a", "[MASK]"]


def test_prepare_is_bit_for_bit_the_same_in_two_processes(tmp_path, small_corpus):
    """huggingface/tokenizers#1794: the trainer's "##" pieces took ids in hash-map order."""
    configs = [text_run(tmp_path / name, small_corpus) for name in ("a", "b")]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bertcli", "prepare", "--config", str(c), "--quiet"],
            stderr=subprocess.PIPE,
            text=True,
        )
        for c in configs
    ]
    assert all(p.wait(timeout=120) == 0 for p in procs), [p.stderr.read() for p in procs]
    a, b = prepared_files(tmp_path / "a" / "data"), prepared_files(tmp_path / "b" / "data")
    assert list(a) == list(b) and len(a) == 14  # manifest, tokenizer, vocab; a unit's 7 files; the index's 4
    for name in a:
        assert a[name] == b[name], name


# ------------------------------------------------------------------ a vocabulary trained on a sample (issue 20)


def test_a_line_sample_is_a_share_spread_over_the_corpus_whatever_the_order():
    from bertcli.data.text import LineSample

    lines = [f"Line {i} of the corpus, about topic {i % 97}." for i in range(20_000)]
    total = sum(map(len, lines))
    sample = LineSample(total // 4, total)
    taken = [line for line in lines if sample(line)]
    assert not sample.whole and sample.chars == sum(map(len, taken)) and sample.lines == len(taken)
    assert abs(sample.chars / (total // 4) - 1) < 0.05  # the budget, give or take chance
    chosen = set(taken)
    halves = [sum(len(line) for line in part if line in chosen) for part in (lines[:10_000], lines[10_000:])]
    assert all(abs(h / (total // 8) - 1) < 0.1 for h in halves), halves  # from the head and the tail alike
    again = LineSample(total // 4, total)
    assert [line for line in reversed(lines) if again(line)] == taken[::-1], "a line's fate is its own"
    for budget in (total, 2 * total):
        everything = LineSample(budget, total)
        assert everything.whole and all(map(everything, lines))


MADE_UP = [a + b + c for a in ("zor", "quel", "vax", "dru") for b in ("vak", "min", "tos") for c in ("", "ith")]


def _two_halves() -> tuple[str, str]:
    """A corpus's head (English, the bundled sample's) and a tail of made-up words that the head lacks."""
    rng = np.random.default_rng(0)
    head = gzip.decompress(SAMPLE.read_bytes()).decode().split("\n\n")[:30]
    tail = ["\n".join(" ".join(rng.choice(MADE_UP, 12)).capitalize() + "." for _ in range(20)) for _ in range(30)]
    return "\n\n".join(head) + "\n\n", "\n\n".join(tail) + "\n"


def test_the_vocabulary_sample_comes_from_the_whole_corpus_in_any_order(tmp_path, cli):
    head, tail = _two_halves()
    (tmp_path / "one.txt").write_text(head + tail)
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "a.txt").write_text(tail)  # read first
    (tmp_path / "parts" / "b.txt").write_text(head)
    budget = f"data.tokenizer.sample_chars={len(head + tail) // 3}"
    vocabularies = []
    for name, corpus in (("one", tmp_path / "one.txt"), ("parts", tmp_path / "parts")):
        result = cli("prepare", "--config", text_run(tmp_path / f"run-{name}", corpus, budget), "--quiet")
        assert result.code == 0, result.err
        assert "the vocabulary was trained on a sample of" in result.err
        vocabularies.append((tmp_path / f"run-{name}" / "data" / "vocab.txt").read_text())
    assert vocabularies[0] == vocabularies[1], "the same lines train it, whatever the files and their order"
    vocab = set(vocabularies[0].splitlines())
    assert len(vocab & set(MADE_UP)) >= len(MADE_UP) // 2, "pieces from the tail"
    assert {"the", "and", "function"} <= vocab, "pieces from the head"


def test_a_sampled_vocabulary_is_recorded_shown_and_keeps_every_character(tmp_path, cli):
    from bertcli.data.text import LineSample
    from bertcli.data.tokenizer import scan_characters
    from bertcli.summary import format_report

    head, tail = _two_halves()
    corpus = tmp_path / "corpus.txt"
    for n in range(100):  # a line of rare characters that the sample leaves out
        rare = f"Rare glyphs {n}: \u2603\u00a7 \u4e2d\u6587 \u00f8re\u00f0 \u03a9mega."
        corpus.write_text(head + rare + "\n\n" + tail)
        total = scan_characters(read_text([corpus]), TokenizerConfig()).count
        if not LineSample(total // 3, total)(rare):
            break
    config = text_run(tmp_path / "run", corpus, f"data.tokenizer.sample_chars={total // 3}")
    assert cli("prepare", "--config", config, "--quiet").code == 0
    prepared = load_prepared(tmp_path / "run" / "data")
    sample = prepared.manifest["tokenizer"]["sample"]
    assert sample["whole"] is False and sample["sample_chars"] == total // 3 and sample["corpus_chars"] == total
    assert 0 < sample["chars"] < total and 0 < sample["lines"]
    tok = prepared.tokenizer
    assert tok.token_to_id("[UNK]") not in tok.encode(rare).ids, tok.encode(rare).tokens
    report = json.loads(cli("inspect", tmp_path / "run" / "data", "--json").out)
    assert report["vocabulary_sample"].startswith(f"a sample of {sample['lines']:,} lines, {sample['chars']:,} of ")
    assert f"vocabulary from  a sample of {sample['lines']:,} lines" in format_report(report)


def test_a_changed_sample_budget_prepares_again_where_it_can_matter(tmp_path, small_corpus, cli):
    size = small_corpus.stat().st_size
    config = text_run(tmp_path, small_corpus)
    runs = {}
    for budget in (size // 3, size // 2, size // 2, 2 * size, 3 * size, 0):
        result = cli("prepare", "--config", config, "--quiet", "--set", f"data.tokenizer.sample_chars={budget}")
        assert result.code == 0, result.err
        runs[budget] = ("up to date" in result.err, load_prepared(tmp_path / "data").manifest["tokenizer"]["sample"])
    assert runs[size // 3][1]["chars"] < runs[size // 2][1]["chars"], "a larger sample"
    assert runs[size // 2][0], "the same budget again: reused"
    assert not runs[2 * size][0] and runs[2 * size][1]["whole"], "the whole corpus now: prepared again"
    # Any budget the corpus fits in (0: no limit) trains on the whole of it: the same data, not prepared again.
    assert runs[3 * size][0] and runs[0][0]


# ------------------------------------------------------------------ examples on real text


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, small_corpus):
    folder = tmp_path_factory.mktemp("prepared")
    config = text_run(folder, small_corpus)
    return load_prepared(prepare(load_run(config), quiet=True))


def test_pair_statistics_on_real_text(prepared):
    cfg = preset_config(
        "tiny",
        [*TEXT, "data.max_seq_length=128", "data.max_predictions_per_seq=40", "model.max_position_embeddings=128"],
    ).data
    corpus = prepared.corpus("train")
    builder = ExampleBuilder(corpus, cfg, 3000)
    n, labels, chosen, candidates, masked, kept = 3000, [], 0, 0, 0, 0
    for i in range(n):
        e = builder.example(5, 0, i)
        labels.append(e.nsp_label)
        a_doc, b_doc = e.documents
        assert (a_doc != b_doc) if e.nsp_label == 1 else (a_doc == b_doc)
        assert len(e.tokens) <= 128
        candidates += len(e.tokens) - 3
        chosen += len(e.pred_positions)
        now = e.tokens[e.pred_positions]
        masked += int((now == corpus.special.mask).sum())
        kept += int((now == e.pred_labels).sum())
    share_random = np.mean(labels)
    assert abs(share_random - 0.5) < 0.05, share_random  # a few forced by one-sentence documents
    assert abs(chosen / candidates - 0.15) < 0.01
    assert abs(masked / chosen - 0.8) < 0.02 and abs(kept / chosen - 0.1) < 0.02


def test_whole_word_masking_never_splits_a_word(prepared):
    cfg = preset_config("tiny", [*TEXT, "data.whole_word_mask=true"]).data
    corpus = prepared.corpus("train")
    builder = ExampleBuilder(corpus, cfg, 1500)
    continuation = corpus.continuation
    words_with_pieces = 0
    for i in range(1500):
        e = builder.example(6, 0, i)
        original = e.tokens.copy()
        original[e.pred_positions] = e.pred_labels
        special = np.isin(np.arange(len(original)), [0, len(original) - 1]) | (original == corpus.special.sep)
        chosen = set(e.pred_positions.tolist())
        for p in range(1, len(original)):
            joined = continuation[original[p]] and not special[p - 1] and not special[p]
            if joined:
                assert (p in chosen) == (p - 1 in chosen), f"example {i} splits a word at {p}"
                words_with_pieces += p in chosen
    assert words_with_pieces > 20, "the check saw multi-piece words"


def test_single_spans_without_nsp(tmp_path, small_corpus):
    config = text_run(tmp_path, small_corpus, "data.pairs=false", "train.nsp_weight=0", "data.masked_lm_prob=0.3")
    result = train(config)
    assert result["step"] == 12 and "nsp_acc" not in result["metrics"]
    cfg = load_config(config)
    e = ExampleBuilder(load_prepared(tmp_path / "data").corpus("train"), cfg.data, 1).example(0, 0, 0)
    assert e.nsp_label == IGNORE and np.all(e.segments == 0) and (e.tokens == 3).sum() <= 1 + (e.pred_labels == 3).sum()
    records = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "train"]
    assert all(r["mlm_loss"] is not None and "nsp_loss" not in r for r in records)


def test_pairs_false_with_nsp_weight_is_a_config_error():
    with pytest.raises(UsageError, match="NSP needs pairs"):
        preset_config("tiny", ["data.pairs=false"])


# ------------------------------------------------------------------ training on real text


def test_evaluation_best_checkpoint_and_self_contained_checkpoints(tmp_path, small_corpus, cli):
    config = text_run(tmp_path, small_corpus)
    train(config)
    evals = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "eval"]
    assert [r["step"] for r in evals] == [6, 12]
    for key in ("mlm_loss", "mlm_acc", "perplexity", "nsp_loss", "nsp_acc", "mlm_acc_baseline"):
        assert all(isinstance(r[key], float) for r in evals), key
    best = tmp_path / "checkpoints" / "best"
    assert layout.is_checkpoint(best)
    best_loss = json.loads((best / "trainer_state.json").read_text())["eval_metrics"]["mlm_loss"]
    assert best_loss == min(r["mlm_loss"] for r in evals)
    for ckpt in (best, tmp_path / "checkpoints" / "step-0000012"):
        assert (ckpt / "tokenizer.json").is_file() and (ckpt / "vocab.txt").is_file()
    assert [s for s, _ in layout.list_checkpoints(tmp_path)] == [8, 12], "best is not a step checkpoint"
    # inspect says which step best holds and its loss, not the path alone
    best_step = json.loads((best / "trainer_state.json").read_text())["step"]
    report = json.loads(cli("inspect", tmp_path, "--json").out)["training"]
    assert (report["best_step"], report["best_mlm_loss"]) == (best_step, best_loss)
    text = cli("inspect", tmp_path).out
    assert f" {best} (step {best_step}, held-out MLM loss {best_loss:.4f})\n" in text, text


def test_exact_resume_on_real_text(tmp_path, small_corpus):
    # Both runs read the same prepared data (preparing again would give the same files, but costs time).
    shared = f"data.prepared_dir={tmp_path / 'data'}"
    one = text_run(tmp_path / "one", small_corpus, shared)
    two = text_run(tmp_path / "two", small_corpus, shared)
    train(one)
    train(two, stop_at=6)
    train(two)
    a = tmp_path / "one" / "checkpoints" / "step-0000012" / "model.safetensors"
    b = tmp_path / "two" / "checkpoints" / "step-0000012" / "model.safetensors"
    from safetensors.torch import load_file

    wa, wb = load_file(a), load_file(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_resume_on_a_changed_corpus_says_so_and_replaces_best(tmp_path, small_corpus, cli):
    """A corpus file added (or edited, or removed) between two slices of a run changes the examples the
    later steps see and the held-out set: the resume says both, and best is replaced at the next
    evaluation rather than kept or replaced by comparing losses on two held-out sets."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(small_corpus, corpus / "a.txt")
    config = text_run(tmp_path / "run", corpus)
    assert cli("pretrain", "--config", config, "--quiet", "--stop-at", "6").code == 0
    ckpts = tmp_path / "run" / "checkpoints"
    best = ckpts / "best"

    def resume_notes(result, where: str) -> list[str]:  # the lines of what resuming checkpoint `where` changes
        return [line for line in result.err_lines if line.startswith(f"resuming {where} ")]

    same = cli("pretrain", "--config", config, "--stop-at", "7")  # the same corpus: nothing to say
    assert same.code == 0 and resume_notes(same, "step-0000006") == [], same.err
    assert not any(line.startswith(f"{best} ") for line in same.err_lines), same.err
    then = json.loads((ckpts / "step-0000007" / "trainer_state.json").read_text())["prepared_data"]["documents"]
    (corpus / "a.txt").write_text((corpus / "a.txt").read_text() + "\n\nA new document. It has two sentences.\n")
    changed = cli("pretrain", "--config", config, "--stop-at", "8")
    assert changed.code == 0, changed.err
    notes = resume_notes(changed, "step-0000007")
    assert len(notes) == 2, changed.err  # the examples of the steps from here on; the held-out set
    assert re.search(rf"\b{then}\b.*\b{then + 1}\b", notes[0]), notes  # the documents then and now
    assert "held-out" in notes[1], notes
    assert [line for line in changed.err_lines if line.startswith(f"{best} ")], changed.err  # best is replaced
    state = json.loads((ckpts / "step-0000008" / "trainer_state.json").read_text())
    assert state["prepared_data"]["documents"] == then + 1


def test_prepared_data_stands_in_for_a_corpus_that_is_not_there(tmp_path, small_corpus, cli):
    """Data prepared on one machine and trained on another (or the corpus unmounted): where the run's
    prepared data is whole and of the run's settings it stands in for the corpus, said; else one line
    says why not, and nothing on disk changes."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(small_corpus, corpus / "a.txt")
    config = text_run(tmp_path / "run", corpus)
    assert cli("pretrain", "--config", config, "--quiet", "--stop-at", "2").code == 0
    corpus.rename(tmp_path / "elsewhere")
    data = tmp_path / "run" / "data"
    assert make_plan(load_run(config), force=False, run_tokenizer=None).action == "stand_in"
    resumed = cli("pretrain", "--config", config, "--quiet", "--stop-at", "3")
    assert resumed.code == 0, resumed.err
    warnings = [line for line in resumed.err_lines if line.startswith(f"warning: {corpus} ")]
    assert len(warnings) == 1 and str(data) in warnings[0], resumed.err
    assert [s for s, _ in layout.list_checkpoints(tmp_path / "run")] == [2, 3]
    prepared = prepared_files(data)

    def refused(result) -> str:
        """The one error line of a refusal (exit 2), no traceback."""
        assert result.code == 2 and "Traceback" not in result.err, result.err
        errors = [line for line in result.err_lines if line.startswith("bertcli: error: ")]
        assert len(errors) == 1, result.err
        return errors[0]

    other = refused(cli("pretrain", "--config", config, "--stop-at", "4", "--set", "data.validation_fraction=0.2"))
    assert all(fact in other for fact in (f"{corpus}:", str(data), "data.validation_fraction", "0.1", "0.2")), other
    forced = refused(cli("prepare", "--config", config, "--force"))
    assert all(fact in forced for fact in (f"{corpus}:", str(data), "--force")), forced
    assert prepared_files(data) == prepared, "the refusals change nothing"
    assert [s for s, _ in layout.list_checkpoints(tmp_path / "run")] == [2, 3]
    corpus.mkdir()  # an empty folder where it was, as an unmounted mount point leaves
    empty = cli("pretrain", "--config", config, "--quiet", "--stop-at", "4")
    assert empty.code == 0, empty.err
    warnings = [line for line in empty.err_lines if line.startswith(f"warning: {corpus} ")]
    assert len(warnings) == 1 and str(data) in warnings[0], empty.err
    assert [s for s, _ in layout.list_checkpoints(tmp_path / "run")][-1] == 4
    corpus.rmdir()
    unit = next((data / "units").iterdir()) / "train" / "tokens.bin"
    unit.write_bytes(unit.read_bytes()[:-2])  # cut
    cut = unit.read_bytes()
    damaged = refused(cli("prepare", "--config", config))
    assert all(fact in damaged for fact in (f"{corpus}:", str(data), "train/tokens.bin")), damaged
    assert unit.read_bytes() == cut, "nothing prepared: there is no corpus to prepare from"
    # inspect names the corpus to put back before the prepare it advises (which would be refused as above)
    inspected = refused(cli("inspect", data))
    assert all(fact in inspected for fact in (str(data), str(corpus), f"bertcli prepare --config {config}")), inspected
    report = json.loads(cli("inspect", tmp_path / "run", "--json").out)["training"]
    assert len(report["damaged"]) == 1 and str(corpus) in report["damaged"][0], report


def test_inspect_of_prepared_data_says_when_its_corpus_files_differ_now(tmp_path, small_corpus, cli):
    """A file added to the corpus, or written to, since it was prepared is said by inspect."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(small_corpus, corpus / "a.txt")
    config = text_run(tmp_path / "run", corpus)
    assert cli("prepare", "--config", config, "--quiet").code == 0
    data = tmp_path / "run" / "data"
    assert json.loads(cli("inspect", data, "--json").out)["corpus_now"] is None
    (corpus / "b.txt").write_text("A new document. It has two sentences.\n")
    with open(corpus / "a.txt", "a") as fh:
        fh.write("\nOne more line.\n")
    report = json.loads(cli("inspect", data, "--json").out)
    now = report["corpus_now"]
    assert isinstance(now, str) and "1 added" in now and "1 written" in now and "gone" not in now, now
    assert now in cli("inspect", data).out
    assert cli("prepare", "--config", config, "--quiet").code == 0
    assert json.loads(cli("inspect", data, "--json").out)["corpus_now"] is None


def test_inspect_prepared_data(tmp_path, small_corpus, cli):
    config = text_run(tmp_path, small_corpus)
    assert cli("prepare", "--config", config, "--quiet").code == 0
    report = json.loads(cli("inspect", tmp_path / "data", "--json").out)
    assert report["kind"] == "prepared data"
    assert report["splits"]["train"]["documents"] == 54 and report["vocab_size"] <= 1000
    assert 0 <= report["unknown_rate"] < 0.01 and 0 < report["padding_share"] < 1
    assert report["segment_length_p95"] >= report["segment_length_mean"] > 0
    assert report["example"]["text"].startswith("[CLS]") and "→" in report["example"]["text"]
    text = cli("inspect", tmp_path / "data").out
    assert "documents" in text and "unknown tokens" in text and "padding" in text


def test_inspect_prepared_data_of_one_document(tmp_path, small_corpus, cli):
    """One document (one book), prepared with --set data.pairs=false as the error says, is shown by
    `inspect DATA` (which prepare suggests), though the run's config file says pairs true."""
    book = tmp_path / "book.txt"
    book.write_text("\n".join(line for line in small_corpus.read_text().splitlines() if line.strip()) + "\n")
    config = text_run(tmp_path / "run", book, "data.validation_fraction=0")
    no_pairs = ["--set", "data.pairs=false", "--set", "train.nsp_weight=0"]
    assert cli("prepare", "--config", config, "--quiet", *no_pairs).code == 0
    result = cli("inspect", tmp_path / "run" / "data")
    assert result.code == 0, result.err
    assert "note: one training document makes no NSP pairs: shown as with data.pairs false" in result.out
    assert "example (no sentence pair; " in result.out and "[SEP]" in result.out
    report = json.loads(cli("inspect", tmp_path / "run" / "data", "--json").out)
    assert report["example"]["nsp_label"] is None and report["splits"]["train"]["documents"] == 1


def test_init_with_corpus_and_missing_corpus(tmp_path, small_corpus, cli):
    result = cli("init", tmp_path / "run", "--corpus", small_corpus)
    assert result.code == 0 and f"corpus: {small_corpus}" in (tmp_path / "run" / "config.yaml").read_text()
    missing = cli("init", tmp_path / "other", "--corpus", tmp_path / "nothing")
    assert missing.code == 2 and len(missing.err_lines) == 1, missing.err
    assert f"{tmp_path / 'nothing'}: not found" in missing.err and not (tmp_path / "other").exists()


# ------------------------------------------------------------------ damaged prepared data (issue 18)


def _unit(folder: Path, number: int = 0) -> Path:
    """The folder of unit `number` of prepared data."""
    return folder / "units" / json.loads((folder / "manifest.json").read_text())["units"][number]["key"]


def _index(folder: Path) -> Path:
    return folder / "index" / json.loads((folder / "manifest.json").read_text())["index"]


def _cut(path: Path, size: int) -> None:
    path.write_bytes(path.read_bytes()[:size])


def _edit_json(path: Path, **changes) -> None:
    manifest = json.loads(path.read_text())
    manifest.update(changes)
    path.write_text(json.dumps(manifest))


def _set_id(path: Path, at: int, value: int) -> None:
    ids = np.fromfile(path, dtype=np.uint16)
    ids[at] = value
    ids.tofile(path)


def _swap_offsets(path: Path) -> None:
    offsets = np.fromfile(path, dtype=np.int64)
    offsets[[2, 3]] = offsets[[3, 2]]
    offsets.tofile(path)


def _move_boundaries(path: Path) -> None:
    """Every other interior boundary moved to one past the one before: the offsets still rise."""
    offsets = np.fromfile(path, dtype=np.int64)
    moved = offsets.copy()
    moved[1:-1:2] = offsets[0:-2:2] + 1
    assert (np.diff(moved) > 0).all() and not np.array_equal(moved, offsets)
    moved.tofile(path)


def _link_outside(path: Path) -> None:
    secret = path.parent.parent / "secret.txt"
    secret.write_text("SECRET\n")
    path.unlink()
    path.symlink_to(secret)


DAMAGE = [  # (id, damage(folder), the facts the one line must hold: {unit} and {index} are their folders' names)
    (
        "truncated-tokens",
        lambda d: _cut(_unit(d) / "train" / "tokens.bin", 100_000),
        ("units/{unit}/train/tokens.bin", "100,000"),
    ),
    ("emptied-tokens", lambda d: _cut(_unit(d) / "train" / "tokens.bin", 0), ("units/{unit}/train/tokens.bin", "0 ")),
    (  # the 6 held-out documents' 7 offsets are 56 bytes: offsets are int64 in any folder, whatever the token dtype
        "emptied-doc-offsets",
        lambda d: _cut(_unit(d) / "valid" / "doc_offsets.bin", 0),
        ("units/{unit}/valid/doc_offsets.bin", "0 ", "manifest.json", "56"),
    ),
    (
        "emptied-index",
        lambda d: _cut(_index(d) / "valid" / "doc_offsets.bin", 0),
        ("index/{index}/valid/doc_offsets.bin", "0 ", "manifest.json", "56"),
    ),
    (
        "id-out-of-range",
        lambda d: _set_id(_unit(d) / "valid" / "tokens.bin", 5, 60_000),
        ("units/{unit}/valid/tokens.bin", "60,000"),
    ),
    ("manifest-dtype", lambda d: _edit_json(d / "manifest.json", dtype="uint32"), ("tokens.bin", "manifest.json")),
    (
        "flipped-doc-offsets",
        lambda d: _swap_offsets(_unit(d) / "train" / "doc_offsets.bin"),
        ("units/{unit}/train/doc_offsets.bin",),
    ),
    (  # the index and the unit disagree: both named, as either may be the damaged one
        "flipped-seg-offsets",
        lambda d: _swap_offsets(_index(d) / "valid" / "seg_offsets.bin"),
        ("index/{index}/valid/seg_offsets.bin", "units/{unit}/valid"),
    ),
    (
        "moved-index-boundaries",  # still rising: only the units' own offsets tell
        lambda d: _move_boundaries(_index(d) / "train" / "seg_offsets.bin"),
        ("index/{index}/train/seg_offsets.bin", "units/{unit}/train"),
    ),
    (
        "moved-unit-boundaries",  # still rising from 0 to its counts: only the index tells
        lambda d: _move_boundaries(_unit(d) / "train" / "seg_offsets.bin"),
        ("index/{index}/train/seg_offsets.bin", "units/{unit}/train"),
    ),
    (
        "moved-index-documents",
        lambda d: _move_boundaries(_index(d) / "train" / "doc_offsets.bin"),
        ("index/{index}/train/doc_offsets.bin", "units/{unit}/train"),
    ),
    (
        "edited-vocab",
        lambda d: (d / "vocab.txt").write_text((d / "vocab.txt").read_text().replace("[MASK]", "[MSK]")),
        ("vocab.txt",),
    ),
    (
        "edited-tokenizer",
        lambda d: _edit_json(d / "tokenizer.json", truncation=None, version="9"),
        ("tokenizer.json",),
    ),
    ("symlinked-vocab", lambda d: _link_outside(d / "vocab.txt"), ("vocab.txt", "symbolic link")),
    (
        "symlinked-shard",
        lambda d: _link_outside(_unit(d) / "train" / "seg_offsets.bin"),
        ("units/{unit}/train/seg_offsets.bin", "symbolic link"),
    ),
    (
        "missing-shard",
        lambda d: (_index(d) / "valid" / "doc_offsets.bin").unlink(),
        ("index/{index}/valid/doc_offsets.bin", "missing"),
    ),
    ("missing-unit", lambda d: shutil.rmtree(_unit(d)), ("units/{unit}", "missing")),
]


def _listing(folder: Path) -> dict[str, tuple[bool, bytes]]:
    """Every entry under `folder` by relative path: whether it is a link, and a file's bytes."""
    return {
        p.relative_to(folder).as_posix(): (p.is_symlink(), p.read_bytes() if p.is_file() else b"")
        for p in sorted(folder.rglob("*"))
    }


@pytest.mark.parametrize("case", DAMAGE, ids=[c[0] for c in DAMAGE])
def test_damaged_prepared_data_is_named_in_one_line(case, prepared, tmp_path, cli):
    """Every load checks the files against the manifest: `inspect` (which cannot prepare again) refuses
    with one line naming the file and the fix, never a numpy error or a silent wrong figure, and
    changes nothing."""
    name, damage, facts = case
    folder = tmp_path / "data"
    shutil.copytree(prepared.folder, folder)
    keys = {"unit": _unit(folder).name, "index": _index(folder).name}
    damage(folder)
    before = _listing(folder)
    result = cli("inspect", folder)
    assert result.code == 2 and len(result.err_lines) == 1, result.err
    assert "Traceback" not in result.err and result.out == ""
    line = result.err_lines[0]
    assert line.startswith(f"bertcli: error: {folder}: "), line
    assert all(fact.format(**keys) in line for fact in facts), (facts, line)
    assert "bertcli prepare --config" in line, line
    assert _listing(folder) == before, "inspect changes nothing"
    assert "--force" in line, line


def test_damaged_prepared_data_is_prepared_again_with_a_line(tmp_path, small_corpus, capsys):
    """`prepare` (and so `pretrain`) prepares damaged data again, saying why; a symbolic link in the
    folder is removed, never followed, and what it pointed to is left alone."""
    corpus = tmp_path / "docs.txt"  # four documents: two quick prepares
    corpus.write_text("\n\n".join(small_corpus.read_text().split("\n\n")[:4]) + "\n")
    cfg = load_run(text_run(tmp_path / "run", corpus, "data.tokenizer.vocab_size=200", "data.validation_fraction=0"))
    folder = prepare(cfg, quiet=True)
    good = (_unit(folder) / "train" / "tokens.bin").read_bytes()
    _cut(_unit(folder) / "train" / "tokens.bin", 1000)
    _link_outside(folder / "vocab.txt")
    plan = make_plan(cfg, force=False, run_tokenizer=None)
    assert (plan.action, plan.warning) == ("fresh", True) and "vocab.txt" in plan.why, plan  # damage: said
    capsys.readouterr()
    prepare(cfg, quiet=True)
    err = capsys.readouterr().err
    assert len([line for line in err.splitlines() if str(folder) in line and "vocab.txt" in line]) == 1, err
    assert (_unit(folder) / "train" / "tokens.bin").read_bytes() == good
    assert not (folder / "vocab.txt").is_symlink() and "SECRET" not in (folder / "vocab.txt").read_text()
    assert (tmp_path / "run" / "secret.txt").read_text() == "SECRET\n"


@pytest.mark.parametrize("damaged", ["unit", "index"])
def test_a_unit_and_the_index_that_disagree_are_both_written_again(tmp_path, small_corpus, capsys, damaged):
    """A unit's offsets moved (still rising from 0 to its counts) disagree with the index, their second
    copy. Which one is damaged cannot be told: the index written again from the damaged unit would
    make the data "intact" from then on, its sentence and document boundaries moved."""
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n\n".join(small_corpus.read_text().split("\n\n")[:4]) + "\n")
    cfg = load_run(text_run(tmp_path / "run", corpus, "data.tokenizer.vocab_size=200", "data.validation_fraction=0"))
    folder = prepare(cfg, quiet=True)
    files = [_unit(folder) / "train" / "seg_offsets.bin", _index(folder) / "train" / "seg_offsets.bin"]
    good = [f.read_bytes() for f in files]
    _move_boundaries(files[0] if damaged == "unit" else files[1])
    capsys.readouterr()
    prepare(cfg, quiet=True)
    err = capsys.readouterr().err
    assert "train/seg_offsets.bin does not hold the offsets of units/" in err and "one of the two is damaged" in err
    assert "preparing 1 of 1 units" in err, err
    assert [f.read_bytes() for f in files] == good
    prepare(cfg, quiet=True)
    assert "up to date" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["garbage", "unreadable"])
def test_a_damaged_manifest_is_prepared_again_not_a_dead_end(tmp_path, small_corpus, capsys, damage):
    """The manifest is the proof that bertcli wrote the folder; damaged, the folder's units/ (names only
    bertcli writes) still prove it, so `prepare` prepares it again (it refused, --force or not)."""
    from bertcli.data.prepared import read_manifest

    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n\n".join(small_corpus.read_text().split("\n\n")[:4]) + "\n")
    cfg = load_run(text_run(tmp_path / "run", corpus, "data.tokenizer.vocab_size=200", "data.validation_fraction=0"))
    folder = prepare(cfg, quiet=True)
    good = (_unit(folder) / "train" / "tokens.bin").read_bytes()
    if damage == "garbage":
        (folder / "manifest.json").write_bytes(b"\x00\xff not json")
    else:
        (folder / "manifest.json").chmod(0)
    if damage == "unreadable" and os.access(folder / "manifest.json", os.R_OK):
        pytest.skip("root reads a file of mode 000")
    capsys.readouterr()
    prepare(cfg, quiet=True)
    assert "preparing it again" in capsys.readouterr().err
    assert (_unit(folder) / "train" / "tokens.bin").read_bytes() == good
    assert read_manifest(folder)[0]["format_version"] == FORMAT_VERSION


def test_an_older_format_is_prepared_again_with_a_line(prepared, tmp_path):
    from bertcli.data.prepared import read_manifest

    folder = tmp_path / "data"
    shutil.copytree(prepared.folder, folder)
    _edit_json(folder / "manifest.json", format_version=2)
    manifest, why_not = read_manifest(folder)
    assert (
        manifest is None
        and why_not == f"is of format version 2 (this bertcli reads and writes version {FORMAT_VERSION})"
    )


def test_a_same_size_edit_with_its_time_restored_is_seen(tmp_path):
    """The cache hashes a small corpus again at every check (not only when size or time changed)."""
    from bertcli.data.prepared import cache_check
    from bertcli.data.scan import file_entries as _file_entries

    corpus = tmp_path / "c.txt"
    corpus.write_text("The first document.\n\nThe second one.\n")
    before = _file_entries([corpus], [])
    stat = corpus.stat()
    corpus.write_text("The first document.\n\nThe second two.\n")
    os.utime(corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert corpus.stat().st_size == before[0]["bytes"] and corpus.stat().st_mtime_ns == before[0]["mtime_ns"]
    assert _file_entries([corpus], before)[0]["sha256"] != before[0]["sha256"]
    assert cache_check(corpus.stat().st_size).startswith("the same SHA-256 for every corpus file (all hashed again")


def test_leftovers_of_a_killed_prepare_are_removed_at_the_next_start(tmp_path):
    from bertcli import store

    dead = 2**22 + 12345  # above the default pid_max: no such process
    (tmp_path / f".tmp-data.{dead}" / "train").mkdir(parents=True)
    (tmp_path / f".tmp-data.{dead}" / "train" / "tokens.bin").write_bytes(b"\0" * 10)
    (tmp_path / f".tmp-data.{os.getppid()}").mkdir()  # a live process's: left alone
    (tmp_path / f".tmp-data.{dead + 1}").mkdir()
    (tmp_path / f".tmp-data.{dead + 1}" / "notes.md").write_text("mine")  # not bertcli's: left alone
    (tmp_path / f".tmp-old-data.{dead}").mkdir()  # moved aside, its replacement never arrived: put back
    (tmp_path / f".tmp-old-data.{dead}" / "manifest.json").write_text("{}")
    store.clean_folder_leftovers(tmp_path / "data", layout.PREPARED)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["data", f".tmp-data.{os.getppid()}", f".tmp-data.{dead + 1}"]
    )
    assert (tmp_path / "data" / "manifest.json").read_text() == "{}"


# ------------------------------------------------------------------ short documents: NSP pairs (issue 18)


def test_random_next_share_is_the_share_training_draws():
    from bertcli.data.chunks import random_next_share
    from bertcli.data.corpus import Corpus, SpecialTokens

    rng = np.random.default_rng(0)
    cfg = preset_config("tiny", [*TEXT]).data
    for sentences in (1, 8):  # one-sentence documents: nearly all random; longer ones: about random_next_prob
        counts = rng.integers(sentences, sentences + 1, size=400)
        lengths = rng.integers(5, 30, size=int(counts.sum()))
        seg = np.concatenate([[0], np.cumsum(lengths)])
        doc = np.concatenate([[0], np.cumsum(counts)])
        corpus = Corpus(np.ones(int(seg[-1]), dtype=np.uint16), seg, doc, 100, SpecialTokens())
        drawn = ExampleBuilder(corpus, cfg, 8).build_epoch(3, ExampleBuilder.TRAIN, 0).random_next.mean()
        share = random_next_share(seg, doc, cfg, 3)
        assert share == drawn
        assert share > 0.99 if sentences == 1 else abs(share - cfg.random_next_prob) < 0.1


def test_one_sentence_documents_are_said_by_prepare_and_inspect(tmp_path, cli):
    corpus = tmp_path / "lines.jsonl"
    corpus.write_text(
        "".join(json.dumps({"text": f"Sentence number {i} is about topic {i % 7}."}) + "\n" for i in range(100))
    )
    config = text_run(tmp_path / "run", corpus, "data.tokenizer.vocab_size=200")
    result = cli("prepare", "--config", config, "--quiet")
    assert result.code == 0, result.err
    warnings = [line for line in result.err_lines if line.startswith("warning:")]
    assert len(warnings) == 1 and "100.0% of the NSP pairs will have a random next sentence" in warnings[0]
    assert "random next sentences 100.0% of pairs (data.random_next_prob 50%)" in result.err
    report = json.loads(cli("inspect", tmp_path / "run" / "data", "--json").out)
    assert report["random_next_share"] == 1.0 and report["random_next_warning"] == warnings[0]
    from bertcli.summary import format_report

    assert "random next      100.0% of NSP pairs" in format_report(report) and warnings[0] in format_report(report)


# ------------------------------------------------------------------ reading corpora (issue 18)


def test_a_huge_line_is_read_in_pieces_in_bounded_memory(tmp_path):
    import tracemalloc

    from bertcli.data.text import MAX_LINE_CHARS

    path = tmp_path / "one.txt"
    words = " ".join(f"w{i % 997}" for i in range(100_000))  # 580 kB, no sentence end
    path.write_text("A first document.\n\n" + words + "\n")
    tracemalloc.start()
    items = [len(s) if s else s for s in read_sentences([path])]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert items[:2] == [len("A first document."), None] and items[-1] is None and None not in items[2:-1]
    assert max(items[2:-1]) <= MAX_LINE_CHARS and sum(items[2:-1]) >= len(words) - len(items)
    assert peak < 400_000, peak  # parts of 64 KiB, never the whole line


def test_a_corpus_folder_reads_compressed_files_any_case_and_says_what_it_skips(tmp_path, capsys):
    import bz2
    import lzma

    from bertcli.data.scan import corpus_files

    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    (root / "A.TXT").write_text("Upper case name.\n")
    (root / "b.txt.bz2").write_bytes(bz2.compress(b"From bzip2.\n"))
    (root / "sub" / "c.JSONL.xz").write_bytes(lzma.compress(json.dumps({"text": "From xz."}).encode() + b"\n"))
    (root / "notes.md").write_text("not a corpus file\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "d.txt").write_text("Through a link.\n")
    (root / "linked").symlink_to(elsewhere)  # followed
    (root / "sub" / "loop").symlink_to(root)  # a loop: not followed twice
    capsys.readouterr()
    files = corpus_files(root)
    err = capsys.readouterr().err
    assert [f.relative_to(root).as_posix() for f in files] == ["A.TXT", "b.txt.bz2", "linked/d.txt", "sub/c.JSONL.xz"]
    assert list(read_sentences(files)) == [
        "Upper case name.",
        None,
        "From bzip2.",
        None,
        "Through a link.",
        None,
        "From xz.",
        None,
    ]
    assert (
        f"{root}: skipped 1 file(s) that are not *.txt and *.jsonl files (plain, .gz, .bz2 or .xz): "
        f"{root / 'notes.md'}" in err
    )
    assert (
        f"skipped 1 folder(s) or file(s) reached a second time through a symbolic link (read once): "
        f"{root / 'sub' / 'loop'}" in err
    )
    (root / "b.txt.bz2").write_bytes(bz2.compress(b"From bzip2.\n")[:20])
    with pytest.raises(
        UsageError,
        match=r"b\.txt\.bz2: line 1.*the bzip2 file is cut short; download or compress it again \(bzip2 -t",
    ):
        list(read_sentences(files))


@pytest.mark.parametrize("suffix", [".bz2", ".xz"])
def test_a_multi_stream_file_is_read_whole_and_a_damaged_later_stream_is_refused(tmp_path, suffix):
    """pbzip2 and pixz write one stream after another. bz2.open and lzma.open end the file quietly at
    bytes that do not start a stream: a damaged second stream would cut the corpus in two with exit 0
    (gzip refuses the same damage)."""
    import bz2
    import lzma

    compress = bz2.compress if suffix == ".bz2" else lzma.compress
    first, second = b"One stream.\n\n", b"And a second one.\n"
    good, bad = tmp_path / f"good.txt{suffix}", tmp_path / f"bad.txt{suffix}"
    padding = b"\0" * 8 if suffix == ".xz" else b""  # xz's stream padding is no damage
    good.write_bytes(compress(first) + padding + compress(second))
    assert list(read_sentences([good])) == ["One stream.", None, "And a second one.", None]
    damaged = bytearray(compress(second))
    damaged[0] ^= 0xFF  # the second stream's header
    bad.write_bytes(compress(first) + bytes(damaged))
    tool = "bzip2" if suffix == ".bz2" else "xz"
    with pytest.raises(
        UsageError, match=rf"bad\.txt\{suffix}: line 3, compressed byte [0-9,]+: the {tool} file is damaged"
    ):
        list(read_sentences([bad]))
    bad.write_bytes(compress(first) + b"junk\n")  # trailing bytes that are no stream at all
    with pytest.raises(UsageError, match=f"the {tool} file is damaged"):
        list(read_sentences([bad]))


def test_a_corpus_folder_skips_the_vocabularies_and_metrics_of_models_and_runs_in_it(tmp_path, capsys):
    """A model folder inside the corpus (an export, a checkpoint, all-MiniLM-L6-v2) had its vocab.txt
    trained on as text: 98.8% of the sentences were the vocabulary list, exit 0, unsaid."""
    from bertcli.data.scan import corpus_files

    root = tmp_path / "project"
    marks = {"export": "config.json", "data": "manifest.json", "tok": "tokenizer.json", "ckpt": "trainer_state.json"}
    for folder, mark in marks.items():
        (root / folder).mkdir(parents=True)
        (root / folder / mark).write_text("{}")
        (root / folder / "vocab.txt").write_text("[PAD]\n[UNK]\n##s\n")
    (root / "run").mkdir()
    (root / "run" / "config.yaml").write_text("train: {}\n")
    (root / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
    (root / "text").mkdir()
    (root / "text" / "a.txt").write_text("Real text.\n")
    (root / "text" / "vocab.txt").write_text("A text of the user's that is named vocab.txt.\n")
    capsys.readouterr()
    files = corpus_files(root)
    assert [f.relative_to(root).as_posix() for f in files] == ["text/a.txt", "text/vocab.txt"]
    err = capsys.readouterr().err
    assert f"{root}: skipped 5 file(s) of a model, tokenizer, prepared data or run" in err


def test_a_corpus_folder_skips_hidden_entries_and_copies_are_said(tmp_path, capsys):
    """A corpus folder's .ipynb_checkpoints/ holds notebook copies of its files: read as text, their
    documents would be trained on twice. Hidden folders and files are skipped with the other skips'
    line; files of the same bytes are warned of (their hashes are at hand)."""
    from bertcli.data.scan import corpus_files
    from bertcli.data.scan import file_entries as _file_entries

    root = tmp_path / "corpus"
    for name in ("a/one.txt", ".ipynb_checkpoints/one-checkpoint.txt", ".notes.txt", "a/.draft.txt", "b/copy.txt"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("The same document.\n")
    (root / "a" / "two.txt").write_text("Another document.\n")
    for empty in ("a/empty.txt", "b/empty.txt"):  # the same (no) bytes, but no documents: no copies
        (root / empty).write_text("")
    capsys.readouterr()
    files = corpus_files(root)
    assert [f.relative_to(root).as_posix() for f in files] == [
        "a/empty.txt",
        "a/one.txt",
        "a/two.txt",
        "b/copy.txt",
        "b/empty.txt",
    ]
    skipped = capsys.readouterr().err.splitlines()
    assert len(skipped) == 1 and skipped[0].startswith(f"{root}: skipped 3 "), skipped
    hidden = [root / ".ipynb_checkpoints", root / ".notes.txt", root / "a" / ".draft.txt"]
    assert skipped[0].endswith(": " + ", ".join(map(str, hidden))), skipped
    _file_entries(files, [])
    warning = capsys.readouterr().err.splitlines()
    assert len(warning) == 1 and warning[0].startswith("warning: 1 "), warning  # one file is a copy
    assert f"{root / 'b' / 'copy.txt'} and {root / 'a' / 'one.txt'}" in warning[0], warning  # it, and what it copies


def test_a_file_with_cr_line_ends_is_said(tmp_path, capsys):
    """Classic Mac OS line ends (CR alone): read as one line, its documents merged, unsaid."""
    from bertcli.data.scan import file_entries as _file_entries

    lf, cr, crlf, cr_gz = (tmp_path / name for name in ("lf.txt", "cr.txt", "crlf.txt", "cr.txt.gz"))
    text = "One sentence here.\nAnother one.\n\nA second document.\n"
    lf.write_text(text)
    cr.write_bytes(text.replace("\n", "\r").encode())
    crlf.write_bytes(text.replace("\n", "\r\n").encode())
    cr_gz.write_bytes(gzip.compress(text.replace("\n", "\r").encode()))
    capsys.readouterr()
    _file_entries([lf, cr, crlf, cr_gz], [])
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(": its lines end in CR alone")[0] for line in lines] == [f"warning: {cr}", f"warning: {cr_gz}"]


@pytest.mark.parametrize(
    "name, content, facts",
    [
        ("rows.csv", b"id,text\n1,A document.\n", ("CSV", 'one JSON line {"text": ...} per document')),
        ("docs.jsonl.zst", b"\x28\xb5\x2f\xfd" + bytes(20), ("zstd", "zstd -d")),  # a zstd frame's magic
        ("books.zip", b"PK\x03\x04" + bytes(26), ("zip", "extract its files into a folder")),  # a zip's first entry
        ("notes.TXT", b"A document.\n", None),  # text under any other name is read as text
        ("corpus", b"A document.\n", None),
    ],
)
def test_a_corpus_file_named_as_a_data_format_is_refused_with_what_to_do(tmp_path, name, content, facts):
    from bertcli.data.scan import corpus_files

    path = tmp_path / name
    path.write_bytes(content)
    if facts is None:
        assert corpus_files(path) == [path]
        return
    with pytest.raises(UsageError) as info:
        corpus_files(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and all(fact in message for fact in facts), message


def test_a_json_array_named_as_the_corpus_is_said_as_one(tmp_path):
    """A .json file that holds an array is told to write one record per line (its first byte tells),
    not to rename it .jsonl, which the next prepare would refuse."""
    from bertcli.data.scan import corpus_files

    (tmp_path / "data.json").write_text('  [{"text": "a"}, {"text": "b"}]\n')
    with pytest.raises(UsageError) as info:
        corpus_files(tmp_path / "data.json")
    array = str(info.value)
    assert array.startswith(f"{tmp_path / 'data.json'}: ") and "JSON array" in array and "jq -c" in array, array
    (tmp_path / "lines.json").write_text('{"text": "a"}\n')
    with pytest.raises(UsageError) as info:
        corpus_files(tmp_path / "lines.json")
    lines = str(info.value)
    assert lines.startswith(f"{tmp_path / 'lines.json'}: ") and ".jsonl" in lines and "jq" not in lines, lines


@pytest.mark.parametrize(
    "record, needle",
    [
        ('{"text": "no end\n', "line 2: not valid JSON (Invalid control character at column 17)"),
        ('{"text": "a\tb"}\n', "line 2: not valid JSON (Invalid control character at column 12)"),
        ('{"text": "x" "y"}\n', "line 2: not valid JSON (Expecting ',' delimiter at column 14)"),
        ('{"content": "x"}\n', 'line 2: no "text" string field'),
        ('{"text": null}\n', 'line 2: no "text" string field'),
        # a list of records saved whole, on one line or pretty-printed
        ('[{"text": "a"}, {"text": "b"}]\n', "line 2: a JSON array; write one object per line (jq -c"),
        ('[\n  {"text": "a"}\n]\n', "line 2: a JSON array; write one object per line (jq -c"),
    ],
)
def test_a_bad_jsonl_record_says_the_line_and_what_to_fix(tmp_path, record, needle):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n' + record)
    with pytest.raises(UsageError) as info:
        list(read_sentences([path]))
    assert str(info.value).startswith(f"{path}: {needle}"), str(info.value)


def test_a_vocabulary_grown_past_its_size_by_the_corpus_characters_is_said(tmp_path, capsys):
    """Every character of the corpus is a token, whatever data.tokenizer.vocab_size asks: 3,000 distinct
    CJK characters make a vocabulary of about 2,900 for 1,000 asked, and prepare says why."""
    import random

    rng = random.Random(0)
    chars = [chr(c) for c in range(0x4E00, 0x4E00 + 3000)]
    docs = ["\n".join("".join(rng.choice(chars) for _ in range(30)) + "。" for _ in range(5)) for _ in range(60)]
    (tmp_path / "cjk.txt").write_text("\n\n".join(docs) + "\n")
    cfg = load_run(text_run(tmp_path / "run", tmp_path / "cjk.txt", "data.tokenizer.vocab_size=1000"))
    prepare(cfg, quiet=True)
    size = load_prepared(tmp_path / "run" / "data").vocab_size
    err = capsys.readouterr().err
    warning = [line for line in err.splitlines() if line.startswith("warning:") and f"{size:,}" in line]
    assert size > 2000 and len(warning) == 1, err
    # the size made and asked; the corpus's characters, each a token (all but the 5 special tokens); the fix
    facts = (f"{size / 1000:.1f}x", "data.tokenizer.vocab_size", "1,000", f"({size - 5:,})", "data.tokenizer.path")
    assert all(fact in warning[0] for fact in facts), warning


def test_a_lone_surrogate_in_a_jsonl_record_is_refused_naming_the_line(tmp_path):
    """JSON may escape a lone surrogate ("\\ud800"), which is no character: refused with the file and
    line by both readers (the tokenizer trainer's stream met it first: a UnicodeEncodeError, exit 1);
    a surrogate pair (an emoji) is text."""
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine \\ud83d\\ude00"}\n{"text": "x \\uD800 y"}\n')
    needle = f"{path}: line 2: the text holds a lone surrogate (\\ud800), which is no Unicode character"
    with pytest.raises(UsageError, match=re.escape(needle)):
        list(read_sentences([path]))
    with pytest.raises(UsageError, match=re.escape(needle)):
        list(read_text([path]))
    path.write_text('{"text": "fine \\ud83d\\ude00"}\n')
    assert list(read_sentences([path])) == ["fine \U0001f600", None]
    path.write_bytes(b'{"text": "a \xed\xa0\x80 b"}\n')  # a surrogate written as bytes (CESU-8): no UTF-8
    assert "\ud800" not in "".join(read_text([path]))  # (json.loads of the bytes let it through)
    with pytest.raises(UsageError, match="byte 12 \\(line 1\\): not valid UTF-8"):
        list(read_sentences([path]))


# ------------------------------------------------------------------ units: workers, parts, updates in place (issue 20)


def _stamps(folder: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime) of every file under units/, by path: a file rewritten or replaced changes both."""
    return {
        p.relative_to(folder).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in sorted((folder / "units").rglob("*"))
        if p.is_file()
    }


def _run(folder: Path, corpus: Path, *overrides: str) -> Path:
    """A run on a units_corpus: its units hold about 4 documents, so every 4th is held out."""
    return text_run(folder, corpus, "data.validation_fraction=0.25", *overrides)


def _units_of(folder: Path, file_number: int) -> set[str]:
    """The keys of the units that hold (parts of) corpus file number `file_number`."""
    manifest = json.loads((folder / "manifest.json").read_text())
    return {u["key"] for u in manifest["units"] if any(p[0] == file_number for p in u["pieces"])}


def _said(err: str, data: Path) -> str:
    """What prepare said it found in prepared folder `data` and does: its first line naming the folder."""
    return next(line for line in err.splitlines() if str(data) in line)


@pytest.fixture
def units_corpus(tmp_path, small_corpus, monkeypatch):
    """A folder of three text files of 15 documents each (about 30 KB), with units of 8 KiB: each file
    is cut into parts at document boundaries, so the corpus is a dozen units."""
    from bertcli.data import scan as scan_module

    monkeypatch.setattr(scan_module, "UNIT_BYTES", 8 << 10)
    docs = small_corpus.read_text().split("\n\n")
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i, name in enumerate("abc"):
        (folder / f"{name}.txt").write_text("\n\n".join(docs[15 * i : 15 * (i + 1)]) + "\n")
    return folder, docs


def test_one_and_two_workers_write_the_same_prepared_folder(tmp_path, units_corpus):
    folder, docs = units_corpus
    (folder / "d.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[45:60]))
    files = {}
    for workers in (1, 2):
        cfg = load_run(_run(tmp_path / f"w{workers}", folder))
        files[workers] = prepared_files(prepare(cfg, quiet=True, workers=workers))
    assert sum(name.endswith("unit.json") for name in files[1]) >= 8, sorted(files[1])
    assert list(files[1]) == list(files[2])
    for name in files[1]:
        assert files[1][name] == files[2][name], name


def test_adding_a_file_prepares_only_its_units_and_equals_a_fresh_prepare(tmp_path, units_corpus, capsys):
    folder, docs = units_corpus
    cfg = load_run(_run(tmp_path / "run", folder))
    data = prepare(cfg, quiet=True)
    before, tokenizer = _stamps(data), (data / "tokenizer.json").read_bytes()
    (folder / "b2.txt").write_text("\n\n".join(docs[45:55]) + "\n")  # file number 2 of a, b, b2, c
    plan = make_plan(cfg, force=False, run_tokenizer=None)
    assert (plan.action, plan.source) == ("update", "kept"), plan  # with the tokenizer it has
    capsys.readouterr()
    prepare(cfg, quiet=True)
    said = _said(capsys.readouterr().err, data)
    added = _units_of(data, 2)
    total = len(json.loads((data / "manifest.json").read_text())["units"])
    assert len(added) >= 2 and {u.key for u in plan.make} == added, (added, plan.make)
    # the units prepared, of how many, and those kept
    assert f"{len(added)} of {total}" in said and re.search(rf"\b{total - len(added)}\b", said), said
    after = _stamps(data)
    assert {rel: stamp for rel, stamp in after.items() if rel.split("/")[1] not in added} == before, "rewritten"
    assert (data / "tokenizer.json").read_bytes() == tokenizer
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["tokenizer"]["trained_on"] == {
        "files": 3,
        "bytes": sum(f.stat().st_size for f in folder.iterdir() if f.name != "b2.txt"),
    }
    # The rate is of the tokens prepared (the units added), not of the whole corpus
    new_tokens = sum(sum(s["tokens"] for s in u["splits"].values()) for u in manifest["units"] if u["key"] in added)
    assert manifest["prepared_tokens"] == new_tokens < manifest["splits"]["train"]["tokens"]
    assert manifest["tokens_per_s"] == pytest.approx(new_tokens / manifest["seconds"])
    # A fresh prepare of the whole new corpus with that tokenizer writes the same units, index and counts.
    fresh = prepare(
        load_run(_run(tmp_path / "fresh", folder, f"data.tokenizer.path={data / 'tokenizer.json'}")), quiet=True
    )
    a, b = prepared_files(data), prepared_files(fresh)
    assert list(a) == list(b)
    for name in a:
        if name != "manifest.json":
            assert a[name] == b[name], name
    ma, mb = json.loads(a["manifest.json"]), json.loads(b["manifest.json"])
    assert {k: v for k, v in ma.items() if k != "tokenizer"} == {k: v for k, v in mb.items() if k != "tokenizer"}


def test_removing_a_file_and_changing_one_part_of_another(tmp_path, units_corpus, capsys):
    folder, _ = units_corpus
    cfg = load_run(_run(tmp_path / "run", folder))
    data = prepare(cfg, quiet=True)
    gone = _units_of(data, 2)  # c.txt's
    manifest = json.loads((data / "manifest.json").read_text())
    part = manifest["corpus"]["files"][0]["parts"][1]  # the second part of a.txt: an edit in its middle
    text = bytearray((folder / "a.txt").read_bytes())
    at = next(i for i in range((part["start"] + part["end"]) // 2, part["end"]) if chr(text[i]).islower())
    text[at] = ord("x" if text[at] != ord("x") else "y")
    changed = {u["key"] for u in manifest["units"] if u["pieces"] == [[0, part["start"], part["end"]]]}
    before = _stamps(data)
    (folder / "a.txt").write_bytes(bytes(text))
    (folder / "c.txt").unlink()
    plan = make_plan(cfg, force=False, run_tokenizer=None)
    assert plan.action == "update" and len(plan.make) == 1, plan.make  # the changed part's unit alone
    assert {u["key"] for u in manifest["units"]} - {u.key for u in plan.units} == gone | changed
    capsys.readouterr()
    prepare(cfg, quiet=True)
    said = _said(capsys.readouterr().err, data)
    assert "a.txt" in said and "c.txt" in said, said  # the files changed and gone
    after = _stamps(data)
    assert not any((data / "units" / key).exists() for key in gone | changed)
    kept = {rel: stamp for rel, stamp in before.items() if rel.split("/")[1] not in gone | changed}
    assert {rel: stamp for rel, stamp in after.items() if rel in kept} == kept and len(after) == len(kept) + 7
    assert sorted(p.name for p in (data / "index").iterdir()) == [
        json.loads((data / "manifest.json").read_text())["index"]
    ]
    load_prepared(data)  # checks every file against the manifest


def test_a_changed_setting_of_every_unit_is_named_not_called_a_corpus_change(tmp_path, units_corpus, capsys):
    """data.validation_fraction changed (in every unit's key) prepares every unit again: the line names
    the setting and no corpus file, so that nobody goes looking for a changed file."""
    from bertcli.data.scan import file_changes

    folder, _ = units_corpus
    config = _run(tmp_path / "run", folder)
    data = prepare(load_run(config), quiet=True)
    names = [f.name for f in sorted(folder.iterdir())]
    changed = load_run(config, ["data.validation_fraction=0.2"])
    plan = make_plan(changed, force=False, run_tokenizer=None)
    assert plan.action == "update" and len(plan.make) == len({u.key for u in plan.units}), plan
    assert file_changes(plan.old["corpus"]["files"], plan.entries, folder) == "", "no corpus file changed"
    capsys.readouterr()
    prepare(changed, quiet=True)
    said = _said(capsys.readouterr().err, data)
    assert all(fact in said for fact in ("data.validation_fraction", "0.25", "0.2")), said
    assert not any(name in said for name in names), said
    (folder / "a.txt").write_text((folder / "a.txt").read_text() + "\n\nA new document here.\n")
    prepare(load_run(config), quiet=True)  # the setting back, and a file changed: both said, the file named
    said = _said(capsys.readouterr().err, data)
    assert "a.txt" in said and "data.validation_fraction" in said, said
    (folder / "a.txt").write_text((folder / "a.txt").read_text() + "\n\nOne more document.\n")
    prepare(changed, quiet=True)  # both: both said
    said = _said(capsys.readouterr().err, data)
    assert all(fact in said for fact in ("a.txt", "data.validation_fraction", "0.25", "0.2")), said


def test_renaming_files_writes_only_a_new_index(tmp_path, units_corpus, capsys):
    folder, _ = units_corpus
    cfg = load_run(_run(tmp_path / "run", folder))
    data = prepare(cfg, quiet=True)
    before = _stamps(data)
    (folder / "a.txt").rename(folder / "d.txt")  # now last: the same units in another order

    def only_a_new_index() -> str:
        plan = make_plan(cfg, force=False, run_tokenizer=None)
        assert (plan.action, plan.make, plan.index_ok) == ("update", [], False), plan
        capsys.readouterr()
        prepare(cfg, quiet=True)
        return _said(capsys.readouterr().err, data)

    said = only_a_new_index()
    assert "a.txt" in said and "d.txt" in said, said  # the file renamed, and its new name
    assert _stamps(data) == before
    assert load_prepared(data).manifest["units"][-1]["pieces"][0][0] == 2, "d.txt's units come last in the index"
    # A copy of a file added, then removed: no unit to prepare, and said as the copy alone (not as a
    # rename of the file it copies)
    shutil.copy(folder / "b.txt", folder / "b copy.txt")
    said = only_a_new_index()
    assert "b copy.txt" in said and "b.txt" not in said, said
    (folder / "b copy.txt").unlink()
    said = only_a_new_index()
    assert "b copy.txt" in said and "b.txt" not in said, said
    assert _stamps(data) == before


@pytest.mark.parametrize("name", ["tokens.bin", "seg_offsets.bin", "doc_offsets.bin"])
def test_a_damaged_unit_is_prepared_again_alone(tmp_path, units_corpus, capsys, name):
    """Its offsets too: the index check, which reads each unit's offsets, read the cut file (numpy's
    'not a multiple of the data-type size', exit 1) before the unit was prepared again."""
    folder, _ = units_corpus
    cfg = load_run(_run(tmp_path / "run", folder))
    data = prepare(cfg, quiet=True)
    unit = _unit(data, 3)
    good = (unit / "train" / name).read_bytes()
    _cut(unit / "train" / name, 10)
    before = {rel: stamp for rel, stamp in _stamps(data).items() if not rel.startswith(f"units/{unit.name}")}
    plan = make_plan(cfg, force=False, run_tokenizer=None)
    assert (plan.action, [u.key for u in plan.make], plan.warning) == ("update", [unit.name], True), plan
    capsys.readouterr()
    prepare(cfg, quiet=True)
    said = _said(capsys.readouterr().err, data)
    assert f"units/{unit.name}/train/{name}" in said and re.search(r"\b10\b", said), said  # the file, its size
    assert (unit / "train" / name).read_bytes() == good
    assert {rel: stamp for rel, stamp in _stamps(data).items() if rel in before} == before


def test_a_corpus_mostly_new_gets_a_new_tokenizer(tmp_path, units_corpus, capsys):
    folder, docs = units_corpus
    cfg = load_run(_run(tmp_path / "run", folder))
    data = prepare(cfg, quiet=True)
    (folder / "b.txt").unlink()
    (folder / "c.txt").unlink()
    (folder / "e.txt").write_text("\n\n".join(docs[30:60]) + "\n")
    plan = make_plan(cfg, force=False, run_tokenizer=None)
    assert (plan.action, plan.source, plan.tok) == ("fresh", "train", None), plan  # a tokenizer to train
    new = 1 - unchanged_bytes(plan.entries, plan.old["corpus"]["files"]) / sum(e["bytes"] for e in plan.entries)
    assert new > 0.5
    capsys.readouterr()
    prepare(cfg, quiet=True)
    said = _said(capsys.readouterr().err, data)
    assert f"{100 * new:.0f}%" in said and "tokenizer" in said, said  # the share that is new: the reason
    assert json.loads((data / "manifest.json").read_text())["tokenizer"]["trained_on"]["files"] == 2


def test_a_file_added_to_a_corpus_of_one_unit_keeps_the_tokenizer(tmp_path, small_corpus, capsys):
    """The share of the corpus that is new is counted by content: a small corpus is one unit, which
    a file added changes whole. A 5% addition said "100% of the corpus is new" and trained another
    vocabulary; it keeps the tokenizer, and equals a fresh prepare with that tokenizer given."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    docs = small_corpus.read_text().split("\n\n")
    (folder / "a.txt").write_text("\n\n".join(docs[:57]) + "\n")
    cfg = load_run(_run(tmp_path / "run", folder))
    data = prepare(cfg, quiet=True)
    assert len(json.loads((data / "manifest.json").read_text())["units"]) == 1
    tokenizer = (data / "tokenizer.json").read_bytes()
    (folder / "b.txt").write_text("\n\n".join(docs[57:60]) + "\n")
    capsys.readouterr()
    prepare(cfg, quiet=True)
    err = capsys.readouterr().err
    assert "new tokenizer" not in err and (data / "tokenizer.json").read_bytes() == tokenizer, err
    (tmp_path / "tok.json").write_bytes(tokenizer)
    given = prepare(
        load_run(_run(tmp_path / "given", folder, f"data.tokenizer.path={tmp_path / 'tok.json'}")), quiet=True
    )
    assert [u["key"] for u in json.loads((given / "manifest.json").read_text())["units"]] == [
        u["key"] for u in json.loads((data / "manifest.json").read_text())["units"]
    ]


def test_units_a_stopped_prepare_finished_are_reused(tmp_path, units_corpus, capsys):
    """A unit renamed into place counts as finished even when its manifest never came (a kill)."""
    folder, docs = units_corpus
    cfg = load_run(_run(tmp_path / "run", folder))
    data = prepare(cfg, quiet=True)
    (folder / "e.txt").write_text("\n\n".join(docs[45:50]) + "\n")
    elsewhere = prepare(
        load_run(_run(tmp_path / "other", folder, f"data.tokenizer.path={data / 'tokenizer.json'}")), quiet=True
    )
    finished = _units_of(elsewhere, 3)
    for key in finished:  # as a prepare killed after renaming them leaves them
        shutil.copytree(elsewhere / "units" / key, data / "units" / key)
    before = _stamps(data)
    plan = make_plan(cfg, force=False, run_tokenizer=None)
    assert (plan.action, plan.make) == ("update", []) and finished <= set(plan.records), plan  # none to prepare
    capsys.readouterr()
    prepare(cfg, quiet=True)
    said = _said(capsys.readouterr().err, data)
    assert "e.txt" in said, said  # the file added
    assert {rel: stamp for rel, stamp in _stamps(data).items() if rel in before} == before
    load_prepared(data)


def test_an_error_in_a_worker_is_the_same_one_line(tmp_path, units_corpus):
    folder, _ = units_corpus
    tokenizer = prepare(load_run(_run(tmp_path / "first", folder)), quiet=True) / "tokenizer.json"
    head = (folder / "b.txt").read_bytes()[:20000]
    (folder / "b.txt").write_bytes(head + b"caf\xe9\n")  # in b.txt's third part
    messages = []
    for workers in (1, 2):
        cfg = load_run(_run(tmp_path / f"w{workers}", folder, f"data.tokenizer.path={tokenizer}"))
        with pytest.raises(UsageError) as info:
            prepare(cfg, quiet=True, workers=workers)
        messages.append(str(info.value))
        assert not (tmp_path / f"w{workers}" / "data").exists() and not list((tmp_path / f"w{workers}").glob(".tmp-*"))
    line = head.count(b"\n") + 1
    assert messages[0] == messages[1], messages
    assert messages[0].startswith(f"{folder / 'b.txt'}: ") and "\n" not in messages[0], messages
    assert all(fact in messages[0] for fact in ("byte 20003", f"line {line}", "UTF-8")), messages


def _parts(path: Path, every: int) -> list:
    """The file cut as prepare cuts it, with each part's first line number."""
    from bertcli.data.text import Part, document_cuts

    data = path.read_bytes()
    bounds = [0, *document_cuts(path, every), len(data)]
    return [Part(path, a, b, data[:a].count(b"\n") + 1) for a, b in zip(bounds, bounds[1:])]


def test_a_file_read_in_parts_gives_the_documents_of_the_whole(tmp_path, monkeypatch, small_corpus):
    """Cuts fall after a blank line (text) or a line (JSON Lines) past each multiple of the unit size, so
    the parts read one after the other give exactly the sentences and document ends of the whole file:
    long lines read in pieces, lines of white space, CRLF, runs of blank lines."""
    from bertcli.data import text

    monkeypatch.setattr(text, "READ_BYTES", 64)  # lines longer than this are read in pieces
    docs = small_corpus.read_text().split("\n\n")[:12]
    long_line = " ".join(["A long line of words goes on."] * 500)  # over MAX_LINE_CHARS: cut into pieces
    body = (
        "\n\n".join(docs[:4])
        + "\n \t\n"
        + long_line
        + "\r\n\r\n\n\n"
        + "\n\n".join(docs[4:8])
        + "\n"
        + " " * 2000
        + "\n"
        + "\n\n".join(docs[8:])
        + "\n\nlast words without an end"
    )
    path = tmp_path / "c.txt"
    path.write_text(body)
    whole = list(read_sentences([path]))
    for every in (100, 700, 5000):
        parts = _parts(path, every)
        assert len(parts) >= (3 if every < 5000 else 2), (every, parts)
        for part in parts[1:]:  # each part starts right after a blank line
            before = path.read_bytes()[: part.start].split(b"\n")[-2]
            assert not before.strip(), (every, part)
        assert [s for part in parts for s in read_sentences([part])] == whole, every
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    assert [s for part in _parts(jsonl, 500) for s in read_sentences([part])] == list(read_sentences([jsonl]))
    # The cuts are a function of the text: an insertion near the start keeps the later parts' bytes.
    cuts = [p.start for p in _parts(path, 700)]
    path.write_text("Inserted words.\n\n" + body)
    assert [c + 17 for c in cuts[2:]] == [p.start for p in _parts(path, 700)][2:]
    # An error in a later part names the byte and line of the whole file.
    path.write_bytes(path.read_bytes()[:3000] + b"caf\xe9" + path.read_bytes()[3000:])
    errors = []
    for pieces in ([path], _parts(path, 700)):
        with pytest.raises(UsageError) as info:
            for piece in pieces:
                list(read_sentences([piece]))
        errors.append(str(info.value))
    assert errors[0] == errors[1] and "byte 3003 (line" in errors[0]


def test_a_large_file_in_units_gives_the_example_stream_of_one_unit(tmp_path, small_corpus, monkeypatch):
    """With nothing held out, a file prepared in many units and in one write the same index and tokens:
    training reads the same examples. (With documents held out, each unit holds out its own every k-th
    document, so the two splits differ.)"""
    from bertcli.data import scan as scan_module

    cfg = preset_config("tiny", [*TEXT, "data.validation_fraction=0"]).data
    batches = []
    for unit_bytes in (1 << 30, 8 << 10):
        monkeypatch.setattr(scan_module, "UNIT_BYTES", unit_bytes)
        prepared = load_prepared(
            prepare(
                load_run(text_run(tmp_path / str(unit_bytes), small_corpus, "data.validation_fraction=0")), quiet=True
            )
        )
        units = len(prepared.manifest["units"])
        assert units == 1 if unit_bytes > 1 << 20 else units > 10, units
        train = prepared.corpus("train")
        builder = ExampleBuilder(train, cfg, 16)
        batches.append(
            (
                np.asarray(train.seg_offsets).copy(),
                np.asarray(train.doc_offsets).copy(),
                train.tokens[0 : train.num_tokens].copy(),
                builder.batch(42, 3, range(16)),
            )
        )
    (seg_a, doc_a, tokens_a, batch_a), (seg_b, doc_b, tokens_b, batch_b) = batches
    assert np.array_equal(seg_a, seg_b) and np.array_equal(doc_a, doc_b) and np.array_equal(tokens_a, tokens_b)
    assert_same_batch(batch_a, batch_b)


def test_an_older_format_folder_is_prepared_again_whole_with_a_line(tmp_path, small_corpus, capsys):
    cfg = load_run(text_run(tmp_path / "run", small_corpus))
    folder = prepare(cfg, quiet=True)
    shutil.rmtree(folder / "units")
    shutil.rmtree(folder / "index")
    for split in ("train", "valid"):  # format 3's layout
        (folder / split).mkdir()
        for name in ("tokens", "seg_offsets", "doc_offsets"):
            (folder / split / f"{name}.bin").write_bytes(b"\0" * 16)
    _edit_json(folder / "manifest.json", format_version=3)
    capsys.readouterr()
    prepare(cfg, quiet=True)
    assert (
        f"prepared data in {folder} is of format version 3 (this bertcli reads and writes version "
        f"{FORMAT_VERSION}): preparing it again"
    ) in capsys.readouterr().err
    assert sorted(p.name for p in folder.iterdir()) == [
        "index",
        "manifest.json",
        "tokenizer.json",
        "units",
        "vocab.txt",
    ]
    load_prepared(folder)


# ------------------------------------------------------------------ documents and files as users have them (issue 34)


def test_include_and_exclude_choose_a_folders_files_and_unnamed_text_is_read_by_its_content(tmp_path, capsys):
    """Globs select a folder's files (by default *.txt and *.jsonl, as before); a selected file of no corpus
    name is read where it holds UTF-8 text (README, a gzip of text) and skipped where it does not."""
    from bertcli.data.scan import corpus_files

    root = tmp_path / "docs"
    contents = {
        "a.txt": b"A text file.\n",
        "sub/b.txt": b"Another one.\n",
        "README": b"Read me first.\n",
        "changelog.Debian.gz": gzip.compress(b"Version two fixed a bug.\n", mtime=0),
        "notes.md": b"Notes.\n",
        "blob": b"\x00\x01binary data",  # no suffix, a NUL byte
        "latin1": "caf\xe9 au lait\n".encode("latin-1"),  # no suffix, not UTF-8
        "image.gz": gzip.compress(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", mtime=0),  # a gzip of binary data
        "rows.csv": b"id,text\n1,A document.\n",  # a kind prepare refuses by name: skipped in a folder
    }
    for name, data in contents.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    relative = lambda files: [f.relative_to(root).as_posix() for f in files]  # noqa: E731
    assert relative(corpus_files(root)) == ["a.txt", "sub/b.txt"]
    assert relative(corpus_files(root, ["*.TXT"], ["a.*"])) == ["sub/b.txt"]  # a glob matches the name or the path
    capsys.readouterr()
    files = corpus_files(root, ["*"], ["sub/*", "*.md"])
    assert relative(files) == ["README", "a.txt", "changelog.Debian.gz"]
    err = capsys.readouterr().err
    assert f"{root}: skipped 4 file(s) that are not plain UTF-8 text" in err and str(root / "blob") in err, err
    assert f"{root}: skipped 2 file(s) data.exclude" in err, err
    assert list(read_sentences(files)) == [
        "Read me first.",
        None,
        "A text file.",
        None,
        "Version two fixed a bug.",
        None,
    ]


def _pages(root: Path, pages: int, paragraphs: int) -> Path:
    """Man pages as a folder holds them: files without a suffix, one-sentence paragraphs separated by blank lines."""
    words = "cache socket parser buffer thread signal module stream".split()
    for p in range(pages):
        (root / f"page{p:03d}").parent.mkdir(parents=True, exist_ok=True)
        lines = [f"The {words[(p + k) % 8]} of page {p} keeps {words[k % 8]} {k} open." for k in range(paragraphs)]
        (root / f"page{p:03d}").write_text("\n\n".join(lines) + "\n")
    return root


def test_document_file_gives_real_next_sentences_and_packing_fills_rows(tmp_path, cli):
    """Short files whose paragraphs are blank-line documents: every pair's B is random (a document of one
    sentence has no next one). `data.document: file` prepares them again as documents with real next sentences
    (the random share within 2 points of random_next_prob: averaged over seeds, as one epoch of so tiny a corpus
    is a sample of ~1,000 pairs), and without pairs rows are packed nearly full; `inspect DATA` shows both figures
    as the config beside the data builds them."""
    from bertcli.data.prepared import random_next
    from bertcli.summary import data_report, format_report

    pages = _pages(tmp_path / "man", pages=60, paragraphs=40)
    settings = ["data.include=['*']", "data.tokenizer.vocab_size=300", "data.max_seq_length=24"]
    config, folder = text_run(tmp_path / "run", pages, *settings), tmp_path / "run" / "data"

    def shares(config: Path) -> list[float]:  # the random-next share of 8 seeds' first epochs
        manifest, data = json.loads((folder / "manifest.json").read_text()), load_run(config).data
        return [random_next(folder, manifest, data, seed)[0] for seed in range(8)]

    assert cli("prepare", "--config", config, "--quiet").code == 0
    assert json.loads((folder / "manifest.json").read_text())["splits"]["train"]["documents"] > 2000
    assert min(shares(config)) > 0.9
    reused = cli("prepare", "--config", config).err  # the data reused: its share said once, as a warning
    assert "up to date" in reused and reused.count("warning: 100.0% of the NSP pairs will have a random") == 1
    config = text_run(tmp_path / "run", pages, *settings, "data.document=file")
    result = cli("prepare", "--config", config)
    assert result.code == 0 and "data.document 'blank_line' -> 'file'" in result.err, result.err
    assert abs(np.mean(shares(config)) - 0.5) <= 0.02
    after = data_report(folder)
    assert after["splits"]["train"]["documents"] + after["splits"]["valid"]["documents"] == 60
    assert abs(after["random_next_share"] - 0.5) <= 0.03 and after["random_next_prob"] == 0.5, after
    assert cli("prepare", "--config", config).err.count("up to date") == 1
    text_run(tmp_path / "run", pages, *settings, "data.document=file", "data.pairs=false", "train.nsp_weight=0")
    packed = json.loads(cli("inspect", folder, "--json").out)
    assert packed["padding_share"] < 0.05 and packed["random_next_share"] is None, packed
    assert "padding" in format_report(packed)
    assert f"data.pairs false: the config at {tmp_path / 'run' / 'config.yaml'}" in format_report(packed)  # its basis
