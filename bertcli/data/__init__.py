"""Data: corpora (synthetic or prepared from text) and BERT example construction (pairs + masking)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertcli.config import Config
from bertcli.data.corpus import Corpus, SpecialTokens, held_out, select_documents, synthetic_corpus
from bertcli.layout import TOKENIZER_FILES

# Example building (data/examples.py) needs torch; this package does not import it, so that
# `bertcli prepare` runs without loading torch.
__all__ = ["Corpus", "Dataset", "SpecialTokens", "load_data"]


@dataclass
class Dataset:
    """What training reads: the training corpus, the held-out one, and the tokenizer's files."""

    train: Corpus
    valid: Corpus | None
    vocab_size: int
    tokenizer_files: list[Path]  # copied into every checkpoint (none for the synthetic corpus)
    # What the examples come from, as checkpoints record it (PreparedData.identity); None for the synthetic
    # corpus, which its settings say.
    identity: dict[str, Any] | None = None


def load_data(
    cfg: Config,
    quiet: bool = False,
    run_tokenizer: Path | None = None,
    vocab_check: Callable[[int], None] | None = None,
) -> Dataset:
    """The corpus named by data.corpus of resolved config `cfg`: generated, or prepared from text
    (prepared first if needed; see prepare for `run_tokenizer` and `vocab_check`)."""
    if cfg.data.corpus == "synthetic":
        assert cfg.model.vocab_size is not None  # validated in config
        corpus = synthetic_corpus(cfg.data.synthetic, cfg.model.vocab_size)
        valid = held_out(corpus.num_documents, cfg.data.validation_fraction)
        return Dataset(
            select_documents(corpus, (~valid).nonzero()[0]),
            select_documents(corpus, valid.nonzero()[0]) if valid.any() else None,
            corpus.vocab_size,
            [],
        )
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
