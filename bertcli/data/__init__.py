"""Data: corpora (synthetic or prepared from text) and BERT example construction (pairs + masking)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertcli.config import Config
from bertcli.data.corpus import Corpus, SpecialTokens, held_out, select_documents, synthetic_corpus
from bertcli.layout import TOKENIZER_FILES

# Example building (data/examples.py) needs torch: not imported here, so that `bertcli prepare` runs without it.
__all__ = ["Corpus", "Dataset", "SpecialTokens", "load_data"]


@dataclass
class Dataset:
    """What training reads: the training corpus, the held-out one, and the tokenizer's files."""

    train: Corpus
    valid: Corpus | None
    vocab_size: int
    tokenizer_files: list[Path]  # copied into every checkpoint (none for the synthetic corpus)
    identity: dict[str, Any] | None = None  # PreparedData.identity; None for the synthetic corpus


def load_data(
    cfg: Config,
    quiet: bool = False,
    run_tokenizer: Path | None = None,
    vocab_check: Callable[[int], None] | None = None,
) -> Dataset:
    """The corpus of data.corpus: generated, or prepared from text (see prepare for the keyword arguments)."""
    if cfg.data.corpus == "synthetic":
        assert cfg.model.vocab_size is not None  # validated in config
        corpus = synthetic_corpus(cfg.data.synthetic, cfg.model.vocab_size)
        held = held_out(corpus.num_documents, cfg.data.validation_fraction)
        valid = select_documents(corpus, held.nonzero()[0]) if held.any() else None
        return Dataset(select_documents(corpus, (~held).nonzero()[0]), valid, corpus.vocab_size, tokenizer_files=[])
    from bertcli.data.prepare import prepare  # tokenizers is only needed for text
    from bertcli.data.prepared import load_prepared

    folder = prepare(cfg, quiet=quiet, run_tokenizer=run_tokenizer, vocab_check=vocab_check)
    prepared = load_prepared(folder, verified=True)  # prepare checked (or wrote) it just now
    return Dataset(
        train=prepared.corpus("train"),
        valid=prepared.corpus("valid"),
        vocab_size=prepared.vocab_size,
        tokenizer_files=[prepared.folder / name for name in TOKENIZER_FILES],
        identity=prepared.identity,
    )
