"""`bertcli eval`: masked-LM figures on text (rows masked from (seed, row) alone: models of one tokenizer are scored on
the same positions, by trainer.evaluate) and the linear probe (probe.py), one JSON object."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from bertcli import console, hf_import, runtime
from bertcli.config import DataConfig, TrainConfig
from bertcli.data.corpus import Corpus
from bertcli.data.examples import IGNORE, Batch, Example, collate, mask_tokens
from bertcli.data.text import END_OF_DOCUMENT, read_sentences
from bertcli.data.tokenizer import special_tokens
from bertcli.encode import Encoder, load_encoder
from bertcli.errors import UsageError
from bertcli.labeled import Labeled
from bertcli.probe import probe
from bertcli.trainer import evaluate

MASKING = DataConfig(pairs=False, whole_word_mask=False)  # 15% of a row's tokens, 80% [MASK], 10% random, 10% kept


def pieces(tokenizer: Tokenizer, files: list[Path], width: int) -> Iterator[list[int]]:
    """The token ids of each document of `files`, in pieces of at most `width` (the last one of a document shorter)."""
    document: list[str] = []
    for item in read_sentences(files, split=False):
        if item is not END_OF_DOCUMENT:
            document.append(item)
            continue
        ids = [i for e in tokenizer.encode_batch(document, add_special_tokens=False) for i in e.ids]
        document = []
        yield from (ids[start : start + width] for start in range(0, len(ids), width))


def masked_batches(tok: Tokenizer, files: list[Path], *, length: int, seed: int, batch_size: int) -> Iterator[Batch]:
    """Rows of at most `length` tokens, masked from (seed, row), in batches of `batch_size` rows."""
    special, vocab = special_tokens(tok), tok.get_vocab_size(with_added_tokens=True)
    empty = np.zeros(1, np.int64)  # masking reads a corpus's vocabulary and special tokens, not its text
    corpus = Corpus(tokens=empty[:0], seg_offsets=empty, doc_offsets=empty, vocab_size=vocab, special=special)
    predictions = round(length * MASKING.masked_lm_prob) + 1  # the most a row of `length` masks
    cfg = dataclasses.replace(MASKING, max_seq_length=length, max_predictions_per_seq=predictions)
    examples: list[Example] = []
    for row, ids in enumerate(pieces(tok, files, length - 2)):
        tokens = np.array([special.cls, *ids, special.sep], dtype=np.int64)
        ends = np.zeros(len(tokens), dtype=bool)
        ends[[0, -1]] = True
        rng = np.random.default_rng([seed, row])  # a row's masks: a function of (seed, row) alone
        masked, positions, labels = mask_tokens(tokens, ends, cfg=cfg, corpus=corpus, rng=rng)
        segments = np.zeros_like(tokens)
        example = Example(
            tokens=masked, segments=segments, pred_positions=positions, pred_labels=labels, nsp_label=IGNORE
        )
        examples.append(example)
        if len(examples) == batch_size:
            yield collate(examples, predictions, special.pad, length)
            examples = []
    if examples:
        yield collate(examples, predictions, special.pad, length)


def masked_lm(enc: Encoder, files: list[Path], *, seed: int, batch_size: int = 32) -> dict[str, Any]:
    """Mean cross-entropy over the masked positions of `files`, accuracy, perplexity and the positions' count."""
    length = enc.trained_length or enc.max_length
    counts = {"positions": 0, "rows": 0}

    def counted() -> Iterator[Batch]:
        for batch in masked_batches(enc.tokenizer, files, length=length, seed=seed, batch_size=batch_size):
            counts["positions"] += int((batch.mlm_labels != IGNORE).sum())
            counts["rows"] += len(batch.valid_lens)
            yield batch

    batches = counted()
    first = next(batches, None)
    if first is None:
        raise UsageError(f"{', '.join(map(str, files))}: no text to score; give files with text in them")
    figures = evaluate(enc.model, itertools.chain([first], batches), enc.rt, TrainConfig(), nsp=False)
    return {"loss": figures["mlm_loss"], "accuracy": figures["mlm_acc"], "perplexity": figures["perplexity"], **counts}


def run(
    model: Path,
    *,
    hf: hf_import.EncoderFolder | None,
    files: list[Path],
    train: Labeled | None,
    test: Labeled | None,
    seed: int,
    device: str,
    batch_size: int,
) -> dict[str, Any]:
    """`bertcli eval`, its checks done (preflight.evaluate): the figures asked of `model`, null where not asked."""
    enc = load_encoder(model, runtime.parse_device(device, "--device"), hf=hf)
    result: dict[str, Any] = {"model": str(enc.source), "seed": seed, "mlm": None, "probe": None}
    if files and "MLM head" in enc.fresh:
        lacks = f"{enc.source}: has no MLM head (cls.predictions)"
        if train is None:
            raise UsageError(f"{lacks}: no masked-LM figures to give; score it with --probe TRAIN")
        console.error(f"bertcli eval: {lacks}; its masked-LM figures are left out (null)")
    elif files:
        result["mlm"] = masked_lm(enc, files, seed=seed, batch_size=batch_size)
    if train is not None:
        result["probe"] = probe(enc, None, train, test, seed=seed, batch_size=batch_size)
    return result


def summary(result: dict[str, Any]) -> list[str]:
    lines = []
    if m := result["mlm"]:
        figures = f"loss {m['loss']:.4f}, accuracy {m['accuracy']:.4f}, perplexity {m['perplexity']:.4g}"
        counts = f"{m['positions']:,} positions in {m['rows']:,} rows"
        lines.append(f"masked LM: {figures} ({counts}, seed {result['seed']})")
    if p := result["probe"]:
        figures = f"accuracy {p['accuracy']:.4f}, macro-F1 {p['macro_f1']:.4f}, majority class {p['majority']:.4f}"
        counts = f"{p['test']:,} test and {p['train']:,} train texts, {p['classes']} classes"
        lines.append(f"probe: {figures} ({counts}, {p['pooling']} pooling, L2 {p['l2']:g})")
    return [f"bertcli eval: {line}" for line in lines]
