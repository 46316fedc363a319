"""Resolving a run: (YAML, overrides, the config file's folder) -> the config every command works from: every path
absolute (a config's relative to its folder, --set's to the current one), model.init_from's architecture adopted."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import yaml

from bertcli.config import PATH_KEYS, Config
from bertcli.config_load import load_config, load_yaml
from bertcli.errors import UsageError

KEYWORD_CORPORA = ("sample", "synthetic")  # data.corpus values that are not paths
SYNTHETIC_VOCAB = 1024  # init with the synthetic corpus: the generated corpus has no tokenizer to size the model


def load_run(path: Path, overrides: list[str] | None = None, adopt_init_from: bool = True) -> Config:
    """The resolved config of the config file at `path` with overrides (their paths: from the current folder)."""
    return resolve(load_config(path, from_here(overrides or [])), Path(path).resolve().parent, adopt_init_from)


def from_here(overrides: list[str]) -> list[str]:
    """Overrides with relative paths made absolute from the current folder (the loader checks the rest)."""
    out = []
    for item in overrides:
        key, sep, text = item.partition("=")
        if sep and key.strip() in PATH_KEYS and text.strip():
            try:
                value = load_yaml(text)
            except (yaml.YAMLError, ValueError, RecursionError):  # TooManyAliases too
                value = None  # the loader says what is wrong with it
            keyword = key.strip() == "data.corpus" and value in KEYWORD_CORPORA
            if isinstance(value, str) and value.strip() and not keyword:
                path = Path(value).expanduser()
                item = f"{key}={json.dumps(str(path if path.is_absolute() else Path.cwd() / path))}"
        out.append(item)
    return out


def resolve(cfg: Config, base: Path, adopt_init_from: bool = True) -> Config:
    """`cfg` with paths absolute from `base` and (`adopt_init_from`) model.init_from's architecture."""

    def absolute(value: str) -> str:
        path = Path(value).expanduser()
        return str(path if path.is_absolute() else base.resolve() / path)

    d, m, e = cfg.data, cfg.model, cfg.eval
    corpus = d.corpus if d.corpus in KEYWORD_CORPORA or not d.corpus.strip() else absolute(d.corpus)
    tokenizer = dataclasses.replace(d.tokenizer, path=d.tokenizer.path and absolute(d.tokenizer.path))
    data = dataclasses.replace(d, corpus=corpus, prepared_dir=absolute(d.prepared_dir), tokenizer=tokenizer)
    model = dataclasses.replace(m, init_from=m.init_from and absolute(m.init_from))
    probe, test = e.probe and absolute(e.probe), e.probe_test and absolute(e.probe_test)
    evals = dataclasses.replace(e, probe=probe, probe_test=test)
    cfg = dataclasses.replace(cfg, output_dir=absolute(cfg.output_dir), data=data, model=model, eval=evals)
    if cfg.model.init_from and adopt_init_from:
        from bertcli import adopt

        cfg = adopt.adopt_imported(cfg, Path(cfg.model.init_from))
    return cfg


def check_outputs_apart(cfg: Config) -> None:
    """Refuse (exit 2) outputs that overlap the corpus (prepare would read them), or output_dir on bertcli's own
    folders, a model folder or /."""
    from bertcli.layout import CHECKPOINTS, RUN_OUTPUTS, TENSORBOARD, Kind, identify
    from bertcli.store import owner, relation, run_file

    output, prepared, own = Path(cfg.output_dir), Path(cfg.data.prepared_dir), "set output_dir to a folder of its own"
    resolved = output.expanduser().resolve()
    if (owned := owner(resolved)) is not None:  # replaced or pruned whole
        where = f"is {owned[1]}" if owned[0] == resolved else f"lies inside {owned[0]}, {owned[1]}"
        raise UsageError(f"output_dir {output} {where} of bertcli's: {own}")
    if (run := run_file(resolved)) is not None:
        raise UsageError(f"output_dir {output} is {run[1]} of the run folder {run[0]}: {own}")
    if resolved == Path(resolved.anchor):
        raise UsageError(f"output_dir {output} is the root of the file system: {own}")
    kind = identify(resolved).kind  # a model folder: inspect and encode of it would read the model, not the run
    if kind in (Kind.HF, Kind.SENTENCE):
        raise UsageError(f"output_dir {output} is {kind.value}: the run's checkpoints there would be mixed up; {own}")
    for inside in (output / CHECKPOINTS, output / TENSORBOARD):  # folders pretrain replaces, prunes, writes whole
        if (how := relation(prepared, inside)) in ("is", "is inside"):
            raise UsageError(f"data.prepared_dir {prepared} {how} {inside}, which pretrain writes: set it elsewhere")
    if cfg.data.corpus in KEYWORD_CORPORA:
        return
    corpus = Path(cfg.data.corpus)
    for key, target in (("output_dir", output), ("data.prepared_dir", prepared)):
        if (how := relation(target, corpus)) in ("is", "is inside"):
            raise UsageError(f"{key} {target} {how} the corpus {corpus}, which prepare reads: set {key} elsewhere")
    for key, target in [("data.prepared_dir", prepared)] + [("output_dir", output / name) for name in RUN_OUTPUTS]:
        if relation(corpus, target) in ("is", "is inside"):
            raise UsageError(f"the corpus {corpus} lies inside {target}, which bertcli writes ({key}): move it out")
