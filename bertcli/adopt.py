"""model.init_from: the model's architecture adopted into the run's config; what `init --init-from` sets."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any

from bertcli import checkpoint, console, layout
from bertcli.config import Config, ModelConfig
from bertcli.config_load import preset_config
from bertcli.data.tokenizer import casing_clashes, describe, find_tokenizer_file
from bertcli.errors import UsageError
from bertcli.hf_import import check_finite_weights, check_tied, load_model_tokenizer, read_hf_config
from bertcli.hf_names import HF_FIELDS
from bertcli.layout import Kind
from bertcli.sbert import read_sentence_model, refuse_a_module

# Continued pretraining: the peak learning rate of BERT fine-tuning and of run_mlm, well below a preset's from
# scratch (a high rate first undoes what the model learned). Warm-up: 5% of the steps, at most the preset's.
CONTINUED_LR = 5e-5
CONTINUED_WARMUP_SHARE = 0.05


def imported_config(path: Path) -> ModelConfig:
    """The architecture of an init_from source: a Hugging Face folder's config.json or a checkpoint's config."""
    path = Path(path)
    refuse_a_module(path, "set model.init_from to")
    found = layout.identify(path)
    if found.kind is Kind.CHECKPOINT:
        return checkpoint.read_config(path).model
    if found.kind in (Kind.HF, Kind.SENTENCE) and found.config is not None:  # (sentence-transformers: its own BERT)
        config = read_hf_config(path)
        check_tied(path)
        return config
    if found.kind is Kind.RUN and found.checkpoints:
        raise UsageError(f"model.init_from {path}: a run folder; name a checkpoint, e.g. {found.checkpoints[-1][1]}")
    raise UsageError(f"model.init_from={str(path)!r}: not a Hugging Face BERT folder nor a bertcli checkpoint folder")


def adopt_imported(cfg: Config, path: Path) -> Config:
    """cfg with the model section of the init_from source. Where the source is gone and the run has checkpoints
    (it resumes from them), the newest stands in: its architecture, and its tokenizer where the source's was used."""
    try:
        imported = imported_config(path)
    except UsageError:
        own = newest_config(Path(cfg.output_dir))
        if own is None:
            raise  # starting fresh: the source is needed
        ckpt, model, tokenizer = own[0], own[1].model, cfg.data.tokenizer.path
        sources_own = not tokenizer or Path(tokenizer) == path or path in Path(tokenizer).parents
        stand_in = sources_own and (ckpt / layout.TOKENIZER_JSON).is_file()
        what = "architecture and the tokenizer" if stand_in else "architecture"
        console.info(f"model.init_from {path} is gone (or unreadable); the {what} come from {ckpt}, the run's own")
        return _adopt(_with_tokenizer(cfg, ckpt / layout.TOKENIZER_JSON) if stand_in else cfg, model, ckpt)
    cfg = _adopt(cfg, imported, path)
    return cfg if cfg.data.tokenizer.path else _with_tokenizer(cfg, path)  # the imported model's own tokenizer


def _with_tokenizer(cfg: Config, path: Path) -> Config:
    tokenizer = dataclasses.replace(cfg.data.tokenizer, path=str(path))
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, tokenizer=tokenizer))


def _adopt(cfg: Config, imported: ModelConfig, path: Path) -> Config:
    """cfg with model section `imported` (from `path`); a YAML value that contradicts it is an error."""
    differ = [k for k in HF_FIELDS if getattr(cfg.model, k) not in (None, getattr(imported, k))]
    clashes = [f"model.{k}={getattr(cfg.model, k)!r} but {path} has {getattr(imported, k)!r}" for k in differ]
    if clashes:
        raise UsageError(f"{'; '.join(clashes)}: the architecture comes from model.init_from; remove those keys")
    own = {"pad_vocab_multiple": cfg.model.pad_vocab_multiple, "init_from": cfg.model.init_from}  # bertcli's alone
    return dataclasses.replace(cfg, model=dataclasses.replace(imported, **own))


def newest_config(output_dir: Path) -> tuple[Path, Config] | None:
    """The run's newest checkpoint whose config reads, with that config (None: none)."""
    for _, path in reversed(layout.list_checkpoints(output_dir)):
        with contextlib.suppress(Exception):  # a damaged one: resuming sets it aside too
            return path, checkpoint.read_config(path)
    return None


def continued_pretraining(source: Path, preset: str, overrides: list[str]) -> tuple[dict[str, Any], str]:
    """What `init --init-from SOURCE` sets under the user's overrides (preset_config's `values`); the header's note."""
    refuse_a_module(source, "init --init-from")
    sentence = read_sentence_model(source) if layout.identify(source).kind is Kind.SENTENCE else None
    source = sentence.transformer if sentence else Path(source)  # a sentence-transformers folder's BERT
    imported = imported_config(source)
    if layout.identify(source).kind is not Kind.CHECKPOINT:
        check_finite_weights(source)  # refused now (a pickle only, no weights, NaN), not when pretrain starts
    values = {f"model.{k}": getattr(imported, k) for k in HF_FIELDS} | {"model.init_from": str(source)}
    tokenizer = None  # none: prepare trains one, as from scratch
    with contextlib.suppress(UsageError):
        tokenizer = find_tokenizer_file(source)
    if tokenizer is not None:
        loaded = load_model_tokenizer(tokenizer, imported)
        casing = describe(loaded)
        values["data.tokenizer.path"] = str(source)
        values |= {f"data.tokenizer.{k}": casing[k] for k in ("lowercase", "strip_accents") if k in casing}
    scratch = preset_config(preset, overrides, values=values)
    warmup = min(scratch.optimizer.warmup_steps, max(1, round(CONTINUED_WARMUP_SHARE * scratch.train.max_steps)))
    values |= {"optimizer.lr": CONTINUED_LR, "optimizer.warmup_steps": warmup}
    cfg = preset_config(preset, overrides, values=values)
    if tokenizer is not None and cfg.data.tokenizer.path == str(source):
        if clashes := casing_clashes(loaded, cfg.data.tokenizer):  # (the loaded tokenizer would ignore them)
            raise UsageError(f"{clashes}: the tokenizer of {source} keeps its own casing; drop those settings")
    o, and_tokenizer = cfg.optimizer, " and tokenizer (data.tokenizer.path)" if tokenizer else ""
    note = (
        f"\nContinued pretraining from {source}: its architecture (model), weights (model.init_from){and_tokenizer}.\n"
        f"optimizer.lr {o.lr:g} with {o.warmup_steps:,} warm-up steps, against {scratch.optimizer.lr:g} from scratch "
        f"in preset '{preset}':\na model that has learned already needs a lower rate, or the first steps undo it."
    )
    return values, note
