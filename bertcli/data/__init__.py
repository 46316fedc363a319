"""Data: the corpus abstraction and BERT example construction (pairs + masking)."""

from __future__ import annotations

from bertcli.config import Config
from bertcli.data.corpus import Corpus, SpecialTokens, synthetic_corpus
from bertcli.data.examples import Batch, ExampleBuilder

__all__ = ["Batch", "Corpus", "ExampleBuilder", "SpecialTokens", "build_corpus", "synthetic_corpus"]


def build_corpus(cfg: Config) -> Corpus:
    """The corpus named by cfg.data.source."""
    return synthetic_corpus(cfg.data.synthetic, cfg.model.vocab_size)
