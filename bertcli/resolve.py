"""Resolving a run: (YAML, --set, the config file's folder) -> the config every command works from.

This is the one place where a run's config is finished. Afterwards nothing downstream (data,
trainer, summary, encode) needs to know where the config file was:
- every path is absolute (relative paths in a config are relative to the config file's folder,
  or to the current folder for a config that has no file);
- with `model.init_from`, the model section is the imported model's architecture and, unless
  the config names one, its tokenizer is the data's tokenizer;
- `with_vocab` fills in `model.vocab_size` from the tokenizer once it exists (after `prepare`,
  which may train it), or checks the configured size against it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from bertcli.config import Config
from bertcli.config_load import load_config
from bertcli.errors import UsageError

KEYWORD_CORPORA = ("sample", "synthetic")  # data.corpus values that are not paths


def load_run(path: Path, overrides: list[str] | None = None, adopt_init_from: bool = True) -> Config:
    """The resolved config of the config file at `path` with `--set` overrides."""
    return resolve(load_config(path, overrides), Path(path).resolve().parent, adopt_init_from)


def resolve(cfg: Config, base: Path, adopt_init_from: bool = True) -> Config:
    """`cfg` with absolute paths (relative ones taken from `base`) and the architecture of its
    init_from (`adopt_init_from=False`: the config as written, for `inspect`, which must explain a
    run whose source model has since moved)."""

    def absolute(value: str) -> str:
        path = Path(value).expanduser()
        return str(path if path.is_absolute() else base.resolve() / path)

    data = cfg.data
    if data.corpus not in KEYWORD_CORPORA and data.corpus.strip():
        data = dataclasses.replace(data, corpus=absolute(data.corpus))
    data = dataclasses.replace(data, prepared_dir=absolute(data.prepared_dir))
    if data.tokenizer.path:
        data = dataclasses.replace(data, tokenizer=dataclasses.replace(data.tokenizer, path=absolute(data.tokenizer.path)))
    model = cfg.model
    if model.init_from:
        model = dataclasses.replace(model, init_from=absolute(model.init_from))
    cfg = dataclasses.replace(cfg, output_dir=absolute(cfg.output_dir), data=data, model=model)
    if cfg.model.init_from and adopt_init_from:
        from bertcli import hf  # imports torch: only for runs that start from a model

        cfg = hf.adopt_imported(cfg, Path(cfg.model.init_from))
    return cfg


def with_vocab(cfg: Config, vocab_size: int, source: str) -> Config:
    """model.vocab_size from the tokenizer of `source` (when null), or checked against it."""
    if cfg.model.vocab_size is None:
        return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab_size))
    if cfg.model.vocab_size != vocab_size:
        raise UsageError(f"model.vocab_size={cfg.model.vocab_size} but the tokenizer of {source} has {vocab_size:,} "
                         "tokens; set model.vocab_size: null to take the size from the tokenizer")
    return cfg
