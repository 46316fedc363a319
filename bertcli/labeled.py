"""The probe's labeled texts (JSONL or TSV), read before torch loads, and the seeded split of a set into two."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertcli import sniff
from bertcli.errors import UsageError

FORMATS = 'JSONL ({"text": ..., "label": ...} a line) or TSV (text<TAB>label a line)'
MIN_ROWS = 10  # the fold that picks the L2 strength, and a split of TRAIN, hold a fifth: two rows or more


@dataclass(frozen=True)
class Labeled:
    texts: list[str]
    labels: list[str]  # a JSON integer label as its digits: 1 and "1" are one class
    path: Path | None = None

    def take(self, rows: np.ndarray) -> Labeled:
        return Labeled([self.texts[i] for i in rows], [self.labels[i] for i in rows], self.path)


def read_labeled(path: Path, *, flag: str) -> Labeled:
    """The rows of `path`, blank lines skipped; refused (`flag`, the path and line) where the probe cannot read it."""
    path = Path(path).expanduser()
    kind, jsonl = sniff.sniff(path), sniff.is_jsonl(path)
    if kind not in (sniff.KINDS["text"], sniff.KINDS["tsv"]):
        raise UsageError(f"{flag} {path}: {kind.what}; give {FORMATS}")
    texts, labels = [], []
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8").removeprefix("\ufeff").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                raise UsageError(f"{path}: line {number}: not UTF-8 (byte {exc.start}); convert it to UTF-8") from None
            if not line.strip():
                continue
            text, label = _jsonl_row(line) if jsonl else _tsv_row(line)
            if not label:
                raise UsageError(f"{path}: line {number}: {text}; give {FORMATS}")
            texts.append(text)
            labels.append(label)
    where, rows, train = f"{flag} {path}", len(labels), not flag.endswith("test")  # TRAIN: --probe, eval.probe
    if not rows:
        raise UsageError(f"{where}: no labeled rows; give {FORMATS}")
    if train and len(set(labels)) < 2:  # a probe learns from two classes or more, MIN_ROWS rows or more
        raise UsageError(f"{where}: one class, {labels[0]!r}, in every row; a probe needs two or more")
    if train and rows < MIN_ROWS:
        raise UsageError(f"{where}: {rows} rows; a probe needs {MIN_ROWS} or more")
    return Labeled(texts, labels, path)


def _jsonl_row(line: str) -> tuple[str, str]:
    """(text, label) of a JSON Lines record, or (what is wrong, '')."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return "not valid JSON", ""
    text, label = (record.get("text"), record.get("label")) if isinstance(record, dict) else (None, None)
    if not isinstance(text, str):
        return 'no "text" string', ""
    if isinstance(label, bool) or not isinstance(label, (str, int)) or label == "":
        return 'no "label" (a string or an integer)', ""
    return text, str(label)


def _tsv_row(line: str) -> tuple[str, str]:
    """(text, label) of text<TAB>label (the label after the last TAB), or (what is wrong, '')."""
    text, tab, label = line.rpartition("\t")
    return (text, label.strip()) if tab and label.strip() else ("no label after a TAB", "")


def split(data: Labeled, seed: int, fraction: float = 0.2) -> tuple[Labeled, Labeled]:
    """(the rest, a seeded `fraction` of the rows): the same rows for the same data and seed."""
    order = np.random.default_rng([seed, len(data.labels)]).permutation(len(data.labels))
    held = max(1, round(len(order) * fraction))
    return data.take(order[held:]), data.take(order[:held])
