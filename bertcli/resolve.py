"""Resolving a run: (YAML, command-line overrides, the config file's folder) -> the config every command works from.

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
import json
from pathlib import Path

import yaml

from bertcli.config import PATH_KEYS, Config
from bertcli.config_load import load_config, load_yaml
from bertcli.errors import UsageError

KEYWORD_CORPORA = ("sample", "synthetic")  # data.corpus values that are not paths
SYNTHETIC_VOCAB = 1024  # init with the synthetic corpus: the generated corpus has no tokenizer to size the model


def load_run(path: Path, overrides: list[str] | None = None, adopt_init_from: bool = True) -> Config:
    """The resolved config of the config file at `path` with overrides (command-line paths:
    relative to the current folder, see `from_here`)."""
    return resolve(load_config(path, from_here(overrides or [])), Path(path).resolve().parent, adopt_init_from)


def from_here(overrides: list[str]) -> list[str]:
    """Overrides (section.key=value) with relative paths made absolute from the current folder, where the user
    typed them (a path in the YAML file is relative to the file's folder). Values that are not
    paths (sample, synthetic, empty, not a string) are left for the loader to check."""
    out = []
    for item in overrides:
        key, sep, text = item.partition("=")
        if sep and key.strip() in PATH_KEYS and text.strip():
            try:
                value = load_yaml(text)
            except (yaml.YAMLError, ValueError, RecursionError):  # TooManyAliases too
                value = None  # the loader says what is wrong with it
            if (
                isinstance(value, str)
                and value.strip()
                and not (key.strip() == "data.corpus" and value in KEYWORD_CORPORA)
            ):
                path = Path(value).expanduser()
                item = f"{key}={json.dumps(str(path if path.is_absolute() else Path.cwd() / path))}"
        out.append(item)
    return out


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
        data = dataclasses.replace(
            data, tokenizer=dataclasses.replace(data.tokenizer, path=absolute(data.tokenizer.path))
        )
    model = cfg.model
    if model.init_from:
        model = dataclasses.replace(model, init_from=absolute(model.init_from))
    cfg = dataclasses.replace(cfg, output_dir=absolute(cfg.output_dir), data=data, model=model)
    if cfg.model.init_from and adopt_init_from:
        from bertcli import adopt

        cfg = adopt.adopt_imported(cfg, Path(cfg.model.init_from))
    return cfg


def check_outputs_apart(cfg: Config) -> None:
    """Refuse (exit 2), before any work, a run whose outputs overlap its corpus folder: output_dir or
    data.prepared_dir at or inside it (the run's metrics.jsonl, tokenizer files and checkpoints would be
    read as text by the next prepare, and the corpus would change under its own cache), or a corpus
    inside what bertcli writes (prepared data, checkpoints/, tensorboard/). A corpus folder inside the
    run folder (next to config.yaml, say) is fine: bertcli writes only its own names there."""
    from bertcli.layout import CHECKPOINTS, RUN_OUTPUTS, TENSORBOARD, Kind, identify
    from bertcli.store import owner, relation, run_file

    output, prepared = Path(cfg.output_dir), Path(cfg.data.prepared_dir)
    # Not inside what bertcli replaces whole or prunes (a checkpoint, prepared data, an export, a run's
    # checkpoints/ or tensorboard/): the run's files there made that folder "foreign" to its owner.
    resolved = output.expanduser().resolve()
    owned, run = owner(resolved), run_file(resolved)
    if owned is not None or run is not None:
        what = (
            (f"is {owned[1]}" if owned[0] == resolved else f"lies inside {owned[0]}, {owned[1]}")
            + " of bertcli's (replaced or pruned whole, and refused once it holds a file bertcli did not write there)"
            if owned is not None
            else f"is {run[1]} of the run folder {run[0]}"
        )
        raise UsageError(f"output_dir {output} {what}: set output_dir to a folder of its own")
    # A model folder (the run's checkpoints/ there: inspect and encode of it read the model, not the
    # run), or the root of the file system.
    if resolved == Path(resolved.anchor):
        raise UsageError(f"output_dir {output} is the root of the file system: set output_dir to a folder of its own")
    kind = identify(resolved).kind
    if kind in (Kind.HF, Kind.SENTENCE):
        raise UsageError(
            f"output_dir {output} is {kind.value}: the run's checkpoints there would be mixed up with that model "
            "(inspect and encode of the folder read the model); set output_dir to a folder of its own"
        )
    for inside in (output / CHECKPOINTS, output / TENSORBOARD):  # folders pretrain replaces, prunes, writes whole
        how = relation(prepared, inside)
        if how in ("is", "is inside"):
            raise UsageError(
                f"data.prepared_dir {prepared} {how} {inside}, which pretrain writes (checkpoints are replaced and "
                "pruned whole): set data.prepared_dir elsewhere (by default it is data/ in the run folder)"
            )
    if cfg.data.corpus in KEYWORD_CORPORA:
        return
    corpus = Path(cfg.data.corpus)
    fix = "keep the corpus and the run's outputs in separate folders"
    for key, target in (("output_dir", output), ("data.prepared_dir", Path(cfg.data.prepared_dir))):
        how = relation(target, corpus)
        if how in ("is", "is inside"):
            raise UsageError(
                f"{key} {target} {how} the corpus {corpus}: the run would write its files into the corpus, "
                f"and the next prepare would read them as text; {fix} (set {key} elsewhere)"
            )
    written = [("data.prepared_dir", Path(cfg.data.prepared_dir))] + [
        ("output_dir", output / name) for name in RUN_OUTPUTS
    ]
    for key, target in written:
        if relation(corpus, target) in ("is", "is inside"):
            raise UsageError(
                f"the corpus {corpus} lies inside {target}, which bertcli writes (from {key}); {fix} "
                "(move the corpus out of it)"
            )
