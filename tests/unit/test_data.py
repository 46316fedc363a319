"""Examples: pair structure, masking statistics, determinism, and the loss ignoring padded slots."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import assert_same_batch, micro_config

from bertcli.config import DataConfig
from bertcli.data import Corpus, SpecialTokens, chunks
from bertcli.data.corpus import synthetic_corpus
from bertcli.data.examples import IGNORE, Batch, Example, ExampleBuilder, collate, truncate_pair
from bertcli.model import BertForPreTraining
from bertcli.trainer import pretraining_loss

SP = SpecialTokens()


def one_token_per_document_corpus(num_docs: int = 40, seed: int = 0) -> Corpus:
    """Every token of document d is 10 + d, so the document of any token is known."""
    rng = np.random.default_rng(seed)
    sentences = rng.integers(2, 6, size=num_docs)
    lengths = rng.integers(3, 12, size=int(sentences.sum()))
    doc_of_segment = np.repeat(np.arange(num_docs), sentences)
    tokens = np.concatenate([np.full(n, 10 + d) for n, d in zip(lengths, doc_of_segment)])
    return Corpus(
        tokens=tokens.astype(np.uint16),
        seg_offsets=np.concatenate([[0], np.cumsum(lengths)]),
        doc_offsets=np.concatenate([[0], np.cumsum(sentences)]),
        vocab_size=10 + num_docs,
        special=SP,
    )


def test_pair_layout():
    cfg = micro_config()
    builder = ExampleBuilder(synthetic_corpus(cfg.data.synthetic, cfg.model.vocab_size), cfg.data, cfg.train.batch_size)
    for i in range(200):
        e = builder.example(0, 0, i)
        # [CLS] first, then exactly one [SEP] in the middle and one at the end (labels restore masked ones)
        original = e.tokens.copy()
        original[e.pred_positions] = e.pred_labels
        seps = np.flatnonzero(original == SP.sep)
        assert original[0] == SP.cls and len(seps) == 2 and seps[1] == len(original) - 1
        assert np.all(e.segments[: seps[0] + 1] == 0) and np.all(e.segments[seps[0] + 1 :] == 1)
        assert len(e.tokens) <= cfg.data.max_seq_length
        assert not np.isin(e.pred_positions, np.concatenate([[0], seps])).any(), "special tokens are never chosen"
        assert np.all(np.diff(e.pred_positions) > 0)


def test_batch_is_a_pure_function_of_seed_and_step_and_splits_like_one_batch():
    cfg = micro_config()
    builder = ExampleBuilder(synthetic_corpus(cfg.data.synthetic, cfg.model.vocab_size), cfg.data, cfg.train.batch_size)
    a, b = builder.batch(7, 3, range(8)), builder.batch(7, 3, range(8))
    assert_same_batch(a, b)
    assert not torch.equal(a.input_ids, builder.batch(7, 4, range(8)).input_ids)
    assert not torch.equal(a.input_ids, builder.batch(8, 3, range(8)).input_ids)
    # Rows 4..7 of a batch are the same examples whether built alone or with rows 0..3.
    half = builder.batch(7, 3, range(4, 8))
    for row in range(4):
        n = int(half.valid_lens[row])
        assert torch.equal(half.input_ids[row, :n], a.input_ids[row + 4, :n])
        assert torch.equal(half.mlm_labels[row], a.mlm_labels[row + 4])


def small_windows(monkeypatch, block: int = 16, window: int = 4, calibration: int = 8) -> None:
    """Windows of `window` blocks of about `block` segments (chunks.Windows), so that a small corpus has several."""
    monkeypatch.setattr(ExampleBuilder, "BLOCK_SEGMENTS", block)
    monkeypatch.setattr(ExampleBuilder, "WINDOW_BLOCKS", window)
    monkeypatch.setattr(chunks, "CALIBRATION_BLOCKS", calibration)


def large_corpus(num_docs: int, seed: int = 0) -> Corpus:
    """Documents of 1-8 sentences of 3-30 tokens, made without a Python loop per document."""
    rng = np.random.default_rng(seed)
    sentences = rng.integers(1, 9, size=num_docs)
    lengths = rng.integers(3, 31, size=int(sentences.sum()))
    return Corpus(
        tokens=rng.integers(5, 100, size=int(lengths.sum())).astype(np.uint16),
        seg_offsets=np.concatenate([[0], np.cumsum(lengths)]),
        doc_offsets=np.concatenate([[0], np.cumsum(sentences)]),
        vocab_size=100,
        special=SP,
    )


@pytest.mark.parametrize("piece", [ExampleBuilder.PIECE, 3])
@pytest.mark.parametrize("windows", ["one", "several"])
def test_an_epoch_cuts_every_document_from_its_start_and_shows_each_sentence_once(monkeypatch, piece, windows):
    """Google's create_instances_from_document: chunks from each document's first sentence; each
    sentence is in an A or a true B once per epoch (B's unused sentences start the next chunk);
    the same when the epoch is cut in windows of blocks that may split a document at its pieces."""
    monkeypatch.setattr(ExampleBuilder, "PIECE", piece)  # long documents are cut in pieces first
    if windows == "several":
        small_windows(monkeypatch)
    corpus = one_token_per_document_corpus(num_docs=300)
    builder = ExampleBuilder(corpus, DataConfig(max_seq_length=24, short_seq_prob=0.3), 8)
    assert (builder.windows.num_windows > 1) == (windows == "several")
    index = builder.build_epoch(0, ExampleBuilder.TRAIN, 0)
    doc_of = np.repeat(np.arange(corpus.num_documents), np.diff(corpus.doc_offsets))  # (S,)
    starts, ends = corpus.doc_offsets[:-1], corpus.doc_offsets[1:]
    piece_last = {min(s + k + piece, e) - 1 for s, e in zip(starts, ends) for k in range(0, e - s, piece)}
    shown = np.zeros(corpus.num_segments, dtype=int)
    for first, count, a_count, random_next in zip(index.first, index.count, index.a_count, index.random_next):
        first, count, a_count = int(first), int(count), int(a_count)
        assert doc_of[first] == doc_of[first + count - 1], "a chunk stays in its document"
        assert 1 <= a_count <= count and (random_next or a_count < count)
        shown[first : first + (a_count if random_next else count)] += 1
    assert shown.min() == 1
    # Seen twice: only the sentence before one left alone (a piece's last, or one that reaches its target
    # alone), paired with it as A rather than given a forced random B.
    lengths, lone = np.diff(corpus.seg_offsets), {s - 1 for s in piece_last}
    for first, count, a_count, random_next, target, _ in zip(*index):
        if count == 2 and a_count == 1 and not random_next and lengths[first + 1] >= target:
            lone.add(int(first))
    assert set(np.flatnonzero(shown == 2)) <= lone and shown.max() == 2
    assert set(starts.tolist()) <= set(index.first.tolist()), "every document starts a chunk"
    again, later = builder.build_epoch(0, ExampleBuilder.TRAIN, 0), builder.build_epoch(0, ExampleBuilder.TRAIN, 1)
    assert all(np.array_equal(x, y) for x, y in zip(index, again)), "an epoch is a function of (seed, epoch)"
    assert not np.array_equal(np.sort(index.first), np.sort(later.first)), "a new cut each epoch"


@pytest.mark.parametrize("windows", ["one", "several"])
def test_examples_far_into_training_are_random_access(monkeypatch, windows):
    """Step k's examples need no earlier epoch and no history: a fresh builder (a resumed run, a
    worker process) gives what one that built every step before gives."""
    if windows == "several":
        small_windows(monkeypatch)
    corpus = one_token_per_document_corpus()
    cfg = DataConfig(max_seq_length=32, max_predictions_per_seq=5)
    walked = ExampleBuilder(corpus, cfg, 8)
    assert (walked.windows.num_windows > 1) == (windows == "several")
    epoch_length = (
        len(walked.build_epoch(3, ExampleBuilder.TRAIN, 0).first)
        if windows == "one"
        else int(walked.windows.slots.sum())
    )
    step = 5 * epoch_length // 8 + 2  # in epoch 5
    for s in range(step - epoch_length // 8 - 1, step + 1):  # through the end of epoch 4
        batch = walked.batch(3, s, range(8))
    fresh = ExampleBuilder(corpus, cfg, 8).batch(3, step, range(8))
    assert_same_batch(batch, fresh)
    if windows == "several":
        return
    # Example i of step k is chunk k * 8 + i - 5 * epoch_length of epoch 5.
    epoch5 = walked.build_epoch(3, ExampleBuilder.TRAIN, 5)
    for i in range(8):
        first, end, *_ = walked.chunk(3, ExampleBuilder.TRAIN, step * 8 + i)
        j = step * 8 + i - 5 * epoch_length
        assert (first, end) == (epoch5.first[j], epoch5.first[j] + epoch5.count[j])


def test_a_corpus_of_one_window_is_cut_as_one_epoch():
    """Up to a window's size, the epoch is chunks.cut_epoch's cut of the whole corpus, seeded by
    (seed, stream, epoch): the examples of a small corpus are those it had before windows."""
    corpus = one_token_per_document_corpus(num_docs=300)
    cfg = DataConfig(max_seq_length=24, short_seq_prob=0.3)
    builder = ExampleBuilder(corpus, cfg, 8)
    for stream, epoch in ((ExampleBuilder.TRAIN, 0), (ExampleBuilder.EVAL, 2)):
        whole = chunks.cut_epoch(
            corpus.seg_offsets,
            corpus.doc_offsets,
            max_tokens=cfg.max_seq_length - 3,
            cfg=cfg,
            rng=np.random.default_rng([5, stream, epoch]),
        )
        assert all(np.array_equal(x, y) for x, y in zip(builder.build_epoch(5, stream, epoch), whole))


def test_windows_place_an_epoch_s_chunks_in_its_positions(monkeypatch):
    """With several windows, the positions of epoch e hold the chunks of epoch e's cut, nearly all of
    them once (a window whose count misses its estimate repeats or leaves out the difference)."""
    small_windows(monkeypatch)
    corpus = one_token_per_document_corpus(num_docs=400)
    builder = ExampleBuilder(corpus, DataConfig(max_seq_length=24), 8)
    length = int(builder.windows.slots.sum())
    for epoch in (0, 1):
        cut = builder.build_epoch(3, ExampleBuilder.TRAIN, epoch)
        every = {tuple(int(x) for x in c) for c in zip(*cut)}
        shown = [builder.chunk(3, ExampleBuilder.TRAIN, epoch * length + g) for g in range(length)]
        placed = {
            (first, end - first, a_end - first, int(random_next), target, skip)
            for first, end, a_end, random_next, target, skip in shown
        }
        assert placed <= every
        assert len(placed) > 0.9 * len(every)


def test_reaching_an_example_takes_the_memory_of_a_window_whatever_the_corpus(monkeypatch):
    """The memory a fresh builder (a resumed run, an example worker: made before the workers fork)
    allocates to build a batch, at the first step and in a later epoch, does not grow with the
    corpus: it cuts one window, never the epoch. Corpora of about 4,000 and 40,000 documents,
    windows of about 1,024 sentences."""
    small_windows(monkeypatch, block=128, window=8, calibration=8)
    import tracemalloc

    peaks = []
    for num_docs in (4_000, 40_000):
        corpus = large_corpus(num_docs)
        cfg = DataConfig(max_seq_length=64)
        length = int(ExampleBuilder(corpus, cfg, 8).windows.slots.sum())
        builders = [ExampleBuilder(corpus, cfg, 8) for _ in range(2)]
        tracemalloc.start()
        for builder, step in zip(builders, (0, length // 8 + 3)):  # epoch 0, and epoch 1
            builder.batch(1, step, range(8))
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < 1.5 * peaks[0], f"{peaks[0]:,} bytes for {4_000:,} documents, {peaks[1]:,} for {40_000:,}"


def test_masking_and_nsp_statistics_on_a_large_sample():
    corpus = one_token_per_document_corpus()
    cfg = DataConfig(max_seq_length=64, max_predictions_per_seq=64)
    builder = ExampleBuilder(corpus, cfg, 4000)
    chosen = candidates = masked = randomised = kept = random_next = 0
    n = 4000
    for i in range(n):
        e = builder.example(1, 0, i)
        original = e.tokens.copy()
        original[e.pred_positions] = e.pred_labels
        sep = int(np.flatnonzero(original == SP.sep)[0])
        a_docs = set(original[1:sep].tolist())
        b_docs = set(original[sep + 1 : -1].tolist())
        assert len(a_docs) == 1 and len(b_docs) == 1
        if e.nsp_label == 1:
            random_next += 1
            assert a_docs != b_docs, "a random next sentence never comes from A's document"
        else:
            assert a_docs == b_docs
        candidates += len(original) - 3
        chosen += len(e.pred_positions)
        now = e.tokens[e.pred_positions]
        masked += int((now == SP.mask).sum())
        kept += int((now == e.pred_labels).sum())
        randomised += int(((now != SP.mask) & (now != e.pred_labels)).sum())
    assert abs(random_next / n - 0.5) < 0.03
    assert abs(chosen / candidates - 0.15) < 0.01
    # A random replacement can draw the original token by chance (1 in ~40 here): count it as kept.
    assert abs(masked / chosen - 0.8) < 0.02
    assert abs((randomised + kept) / chosen - 0.2) < 0.02 and abs(randomised / chosen - 0.1) < 0.02


def test_max_predictions_caps_the_choice():
    cfg = micro_config("data.max_predictions_per_seq=2", "data.masked_lm_prob=0.5")
    builder = ExampleBuilder(synthetic_corpus(cfg.data.synthetic, cfg.model.vocab_size), cfg.data, cfg.train.batch_size)
    counts = []
    for i in range(50):
        e = builder.example(0, 0, i)
        candidates = len(e.tokens) - 3  # all but [CLS] and the two [SEP]
        counts.append(len(e.pred_positions))
        assert counts[-1] == min(2, max(1, round(candidates * 0.5)), candidates)
    assert counts.count(2) > 40, "the cap binds: half of any real row is more than 2"


def test_truncation_keeps_within_budget_and_trims_the_longer_side():
    rng = np.random.default_rng(0)
    a, b = np.arange(30), np.arange(100, 105)
    ta, tb = truncate_pair(a, b, 20, rng)
    assert len(ta) + len(tb) == 20 and len(tb) == 5  # only the longer side was cut
    assert np.all(np.isin(ta, a)) and np.all(np.diff(ta) == 1)  # still a contiguous piece of A


def test_padded_prediction_slots_do_not_change_the_loss():
    """d2l's weighting bug: padded slots must not enter the MLM mean (numerator or denominator)."""
    cfg = micro_config()
    builder = ExampleBuilder(synthetic_corpus(cfg.data.synthetic, cfg.model.vocab_size), cfg.data, cfg.train.batch_size)
    batch = builder.batch(0, 0, range(8))
    torch.manual_seed(0)
    model = BertForPreTraining(cfg.model).eval()

    def loss(b: Batch):
        with torch.no_grad():
            out = model(b.input_ids, b.token_type_ids, b.valid_lens, b.pred_positions)
        return pretraining_loss(out, b, cfg.train.mlm_weight, cfg.train.nsp_weight)

    base = loss(batch)
    # Ten more padded slots per row, pointing at arbitrary positions.
    extra = 10
    wider = dataclasses.replace(
        batch,
        pred_positions=torch.cat([batch.pred_positions, torch.randint(0, 8, (8, extra))], dim=1),
        mlm_labels=torch.cat([batch.mlm_labels, torch.full((8, extra), IGNORE)], dim=1),
    )
    padded = loss(wider)
    torch.testing.assert_close(padded.total, base.total)
    # And the value is the plain mean over real predictions, computed by hand.
    with torch.no_grad():
        logits = model(batch.input_ids, batch.token_type_ids, batch.valid_lens, batch.pred_positions).mlm_logits
    real = batch.mlm_labels != IGNORE
    by_hand = torch.nn.functional.cross_entropy(logits[real], batch.mlm_labels[real])
    torch.testing.assert_close(base.stats[1], by_hand)
    assert base.stats[4] == real.sum()


def test_pairs_need_two_documents():
    corpus = Corpus(
        tokens=np.arange(10, 20, dtype=np.uint16),
        seg_offsets=np.array([0, 5, 10]),
        doc_offsets=np.array([0, 2]),
        vocab_size=30,
        special=SP,
    )
    from bertcli.errors import UsageError

    with pytest.raises(UsageError, match="at least 2 documents"):
        ExampleBuilder(corpus, DataConfig(max_seq_length=16), 8)


def _one_document_run(tmp_path, documents: int, *overrides: str):
    from conftest import text_run

    corpus = tmp_path / "docs.txt"
    corpus.write_text(
        "\n\n".join(
            f"Document {d} is here. It talks about Python lists.\nA second line of it." for d in range(documents)
        )
        + "\n"
    )
    return text_run(
        tmp_path / f"run{documents}",
        corpus,
        "data.tokenizer.vocab_size=100",
        "train.max_steps=2",
        "train.eval_every=1",
        "train.eval_examples=4",
        *overrides,
    )


@pytest.mark.parametrize(
    "documents, overrides, advice, fix",
    [
        (
            1,
            ["data.pairs=false", "train.nsp_weight=0"],
            "set data.validation_fraction: 0 (no held-out evaluation)",
            ["data.validation_fraction=0"],
        ),
        (
            1,
            [],
            "set data.validation_fraction: 0, data.pairs: false and train.nsp_weight: 0",
            ["data.validation_fraction=0", "data.pairs=false", "train.nsp_weight=0"],
        ),
        (5, [], "raise data.validation_fraction to 0.5", ["data.validation_fraction=0.5"]),
        (
            1,
            ["data.validation_fraction=0"],
            "or set data.pairs: false and train.nsp_weight: 0 (no NSP)",
            ["data.pairs=false", "train.nsp_weight=0"],
        ),
    ],
)
def test_a_corpus_too_small_gets_advice_that_works(tmp_path, cli, documents, overrides, advice, fix):
    """One document trains without sentence pairs; each error's advice, taken, makes the run work."""
    config = _one_document_run(tmp_path, documents, *overrides)
    result = cli("pretrain", "--config", config, "--quiet")
    assert result.code == 2 and advice in result.err, result.err
    assert "raise data.validation_fraction" not in result.err or documents >= 4  # no advice that cannot work
    result = cli("pretrain", "--config", config, "--quiet", *[a for o in fix for a in ("--set", o)])
    assert result.code == 0 and "done: step 2" in result.err, result.err


def test_a_corpus_of_one_document_is_refused_before_the_tokenizer_is_trained(tmp_path, cli, monkeypatch):
    """One document (no blank line) cannot give sentence pairs nor a held-out split: refused after one
    reading pass, not after training a tokenizer on it (10-20 s on 12-20 MB) and writing the shards."""
    import time

    from bertcli.data import prepare as prepare_mod

    def trained(*args, **kwargs):
        raise AssertionError("the tokenizer was trained on a corpus that is refused anyway")

    monkeypatch.setattr(prepare_mod.wordpiece, "train_wordpiece", trained)
    monkeypatch.setattr(prepare_mod, "prepare_units", trained)
    corpus = tmp_path / "one.txt"
    corpus.write_text("".join(f"Line {i} of the only document talks about Python lists.\n" for i in range(20_000)))
    from conftest import text_run

    config = text_run(tmp_path / "run", corpus)
    start = time.perf_counter()
    result = cli("prepare", "--config", config)
    assert (
        result.code == 2 and f"data.corpus={str(corpus)!r}" in result.err and "data.validation_fraction" in result.err
    ), result.err
    assert len(result.err_lines) == 1 and time.perf_counter() - start < 10, result.err
    assert not (tmp_path / "run" / "data").exists()


def test_random_replacements_are_every_non_special_id_wherever_the_specials_are():
    V = 40
    for special in (SpecialTokens(), SpecialTokens(pad=0, unk=17, cls=2, sep=3, mask=V - 1)):  # [MASK] last
        ids = special.random_regular(np.random.default_rng(0), V, 40_000)
        counts = np.bincount(ids, minlength=V)
        assert counts[list(special.ids)].sum() == 0 and len(counts) == V
        regular = np.delete(counts, special.ids)
        assert regular.min() > 0.8 * regular.mean() and regular.max() < 1.2 * regular.mean()  # uniform
    # bertcli's own vocabularies (specials first): the same draws as before, so runs replay unchanged
    assert np.array_equal(
        SpecialTokens().random_regular(np.random.default_rng(3), V, 100),
        np.random.default_rng(3).integers(5, V, size=100),
    )


def test_a_loaded_vocabulary_with_mask_last_trains(tmp_path, cli, trained, small_corpus):
    """A real vocab.txt whose [MASK] has the highest id (random replacement drew from an empty range)."""
    from conftest import text_run

    tokens = (trained / "data" / "vocab.txt").read_text().splitlines()
    tokens.remove("[MASK]")
    (tmp_path / "vocab.txt").write_text("\n".join(tokens + ["[MASK]"]) + "\n")
    config = text_run(
        tmp_path / "run",
        small_corpus,
        f"data.tokenizer.path={tmp_path / 'vocab.txt'}",
        "train.max_steps=2",
        "train.eval_every=0",
        "data.random_token_prob=0.5",
        "data.mask_token_prob=0.5",
    )
    result = cli("pretrain", "--config", config, "--quiet")
    assert result.code == 0 and "done: step 2" in result.err, result.err


def test_a_batch_has_padding_when_a_row_is_shorter_than_its_width():
    """What the trainer asks (on the host copy) before leaving out the attention mask: rows all of
    one length are still padded when collate rounds the width up to a multiple of 8."""

    def batch(*lengths):
        return collate(
            [
                Example(
                    tokens=np.arange(n) + 5,
                    segments=np.zeros(n, dtype=np.int64),
                    pred_positions=np.array([1]),
                    pred_labels=np.array([7]),
                    nsp_label=0,
                )
                for n in lengths
            ],
            max_predictions=2,
            pad_id=0,
            max_length=64,
        )

    assert not batch(16, 16).has_padding()
    assert batch(12, 12).has_padding() and batch(12, 12).input_ids.shape[1] == 16
    assert batch(16, 9).has_padding()


@pytest.mark.parametrize("windows", ["one", "several"])
def test_packed_rows_of_an_epoch_hold_every_token_once(monkeypatch, windows):
    """Without pairs an epoch's rows tile the corpus: a row that ends inside a sentence (or a sentence longer than a
    row) goes on in the next row, so each token is in exactly one row, only a piece's last row is short, and a row
    that ends at a document's last token leaves no [SEP] to the next."""
    if windows == "several":
        small_windows(monkeypatch)
        monkeypatch.setattr(ExampleBuilder, "PIECE", 8)  # pieces of 8 sentences, blocks of about 16
    corpus = one_token_per_document_corpus(num_docs=400)  # sentences of 3 to 11 tokens
    at, doc = int(corpus.seg_offsets[7]), int(np.searchsorted(corpus.doc_offsets, 6, side="right")) - 1
    tokens = np.insert(np.asarray(corpus.tokens), at, np.full(40, 10 + doc, dtype=np.uint16))
    offsets = corpus.seg_offsets + 40 * (np.arange(len(corpus.seg_offsets)) >= 7)  # sentence 6: over 3 rows
    corpus = Corpus(tokens=tokens, seg_offsets=offsets, doc_offsets=corpus.doc_offsets, vocab_size=410, special=SP)
    builder = ExampleBuilder(corpus, DataConfig(pairs=False, max_seq_length=16, max_predictions_per_seq=2), 8)
    assert (builder.windows.num_windows > 1) == (windows == "several")
    cut, seen, short = builder.build_epoch(3, ExampleBuilder.TRAIN, 0), [], 0
    for first, count, skip in zip(cut.first.tolist(), cut.count.tolist(), cut.skip.tolist()):
        row, ends = builder._packed(first, first + count, skip)
        assert len(row) and 0 not in ends, (first, count, skip)  # a document's [SEP] never starts a row
        seen.append(np.delete(row, ends))
        short += len(row) < 13  # (13: a row's last [SEP] ends its last document)
    assert np.array_equal(np.sort(np.concatenate(seen)), np.sort(tokens))
    pieces = -(-(len(offsets) - 1) // builder.PIECE)
    assert short <= pieces, (short, pieces)


def test_windows_give_packed_rows_of_sentences_longer_than_a_row_their_positions(monkeypatch):
    """Each window's positions (its estimated chunk count) hold its packed rows, also where sentences are longer than
    a row and outnumber them: a position short would leave rows out of every epoch."""
    small_windows(monkeypatch)
    monkeypatch.setattr(ExampleBuilder, "PIECE", 8)
    corpus = one_token_per_document_corpus(num_docs=400)  # sentences of 3 to 11 tokens, rows of 3
    builder = ExampleBuilder(corpus, DataConfig(pairs=False, max_seq_length=5, max_predictions_per_seq=1), 8)
    rows = len(builder.build_epoch(3, ExampleBuilder.TRAIN, 0).first)
    assert builder.windows.num_windows > 1 and rows > 2 * corpus.num_segments
    assert abs(int(builder.windows.slots.sum()) - rows) < 0.02 * rows, (int(builder.windows.slots.sum()), rows)


def test_rows_without_pairs_are_packed_across_documents_with_a_sep_after_each():
    """RoBERTa's FULL-SENTENCES: short documents (about 30 tokens here) fill rows of 64, a [SEP] ending each
    document inside a row (never a masked position), so under 5% of the token slots are padding; the batch at
    step k is the same from a fresh builder."""
    corpus = one_token_per_document_corpus(num_docs=300)  # every token of document d is 10 + d
    cfg = DataConfig(pairs=False, max_seq_length=64, max_predictions_per_seq=10)
    builder = ExampleBuilder(corpus, cfg, 16)
    batches = [builder.batch(7, step, range(16)) for step in range(4)]
    padding = 1 - sum(int(b.valid_lens.sum()) for b in batches) / sum(b.input_ids.numel() for b in batches)
    assert padding < 0.05, padding
    assert_same_batch(ExampleBuilder(corpus, cfg, 16).batch(7, 3, range(16)), batches[3])
    crossing = 0
    for i in range(16):
        e = builder.example(7, 2, i)
        original = e.tokens.copy()
        original[e.pred_positions] = e.pred_labels
        assert original[0] == SP.cls and original[-1] == SP.sep and not np.isin(e.pred_labels, [SP.sep]).any()
        docs = [set(piece.tolist()) for piece in np.split(original[1:-1], np.flatnonzero(original[1:-1] == SP.sep))]
        docs = [d - {SP.sep} for d in docs]
        assert all(len(d) == 1 for d in docs), docs  # each span between [SEP]s is one document's
        numbers = [d.pop() - 10 for d in docs]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers))) and e.documents == (
            numbers[0],
            numbers[-1],
        )
        crossing += len(numbers) > 1
    assert crossing >= 12, "rows run on across document ends"
