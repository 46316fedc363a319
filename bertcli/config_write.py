"""Writing a run configuration: init's commented YAML and docs/configuration.md's table, both from the schema."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import yaml

from bertcli import layout, store
from bertcli.config import Config, field_docs, field_types
from bertcli.errors import UsageError

# SafeDumper quoting a string that may start a number: StrictLoader reads '09' and '0o17' as numbers (YAML 1.2).
Dumper = type("Dumper", (yaml.SafeDumper,), {})
Dumper.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?\.?[0-9]"), list("-+.0123456789"))


def yaml_scalar(value: Any) -> str:
    """A value as a YAML scalar that reads back as the same value (non-ASCII text as it is, not escaped)."""
    text = yaml.dump(value, Dumper=Dumper, default_flow_style=True, width=10_000, allow_unicode=True)
    return text.removesuffix("\n...\n").strip()


def type_name(tp: Any) -> str:
    """A field's type as the comments and the reference show it: int, float or null, linear|cosine|constant."""
    if typing.get_origin(tp) is typing.Union:
        return " or ".join("null" if a is type(None) else type_name(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is Literal:
        return "|".join(str(a) for a in typing.get_args(tp))
    if tp == list[str]:
        return "list of str"
    return {int: "int", float: "float", str: "str", bool: "bool"}.get(tp, getattr(tp, "__name__", str(tp)))


def _fields(obj: Any, prefix: str = "") -> Iterator[tuple[str, type, str, Any]]:
    """(key with its sections, class, field name, value) of every field of `obj`, a section before its fields."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        yield f"{prefix}{f.name}", type(obj), f.name, value
        if dataclasses.is_dataclass(value):
            yield from _fields(value, f"{prefix}{f.name}.")


def to_yaml(cfg: Config, header: str = "", comments: bool = True) -> str:
    """The config as YAML: every field, each with a one-line comment (meaning, type, default)."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()] + ([""] if header else [])
    for key, cls, name, value in _fields(cfg):
        pad, section = "  " * key.count("."), dataclasses.is_dataclass(value)
        if lines and lines[-1] and "." not in key:
            lines.append("")  # a blank line before each section
        doc = f"{pad}# {field_docs(cls).get(name, '')}"
        if comments and section:
            lines.append(doc)
        elif comments:  # a value's comment gives its type and default too
            lines.append(f"{doc} ({type_name(field_types(cls)[name])}, default {yaml_scalar(getattr(cls(), name))})")
        lines.append(f"{pad}{name}:" + ("" if section else f" {yaml_scalar(value)}"))
    return "\n".join(lines).rstrip() + "\n"


def markdown_reference() -> str:
    """The config reference table of docs/configuration.md, generated from the field docstrings."""
    rows = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for key, cls, name, value in _fields(Config()):
        if not dataclasses.is_dataclass(value):
            tp = type_name(field_types(cls)[name]).replace("|", " \\| ")
            rows.append(f"| `{key}` | {tp} | `{yaml_scalar(value)}` | {field_docs(cls)[name]} |")
    return "\n".join(rows)


def preset_header(name: str) -> str:
    """The comment at the top of the config file `init` writes."""
    return (
        f"bertcli run configuration, preset '{name}'. Written by `bertcli init`; edit freely.\n"
        "Precedence: defaults < this file < `--set section.key=value` on the command line.\n"
        "Each comment gives the meaning, the type and the default (the value used when a key is left out)."
    )


def check_replaceable(path: Path) -> None:
    """Refuse (exit 2) to overwrite `path` unless it is empty or a YAML mapping of config sections."""
    fix = "move it away first, or choose another folder"
    if path.is_dir():
        raise UsageError(f"{path} is a folder; bertcli init writes config.yaml as a file: {fix}")
    try:
        raw = yaml.safe_load(text := path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        raw, text = False, "?"  # unreadable, not text, not YAML: not a config bertcli wrote
    if raw is None and not text.strip():
        return  # an empty file: nothing to lose (one of comments alone is notes)
    sections = {f.name for f in dataclasses.fields(Config)}
    foreign = sorted(str(k) for k in raw if k not in sections) if isinstance(raw, dict) else None
    if foreign is None or foreign:
        why = f"its key {foreign[0]!r} is not a config section" if foreign else "it is not a mapping of config sections"
        raise UsageError(f"{path} is not a bertcli config ({why}), so bertcli init leaves it untouched: {fix}")


def write_run_config(directory: Path, cfg: Config, header: str, *, force: bool) -> Path:
    """Write DIR/config.yaml: never through a link or over a file not a bertcli config, over one only with `force`
    and while no command holds the run; a failed write removes the folders it made."""
    path = directory / layout.RUN_CONFIG
    if path.is_symlink():  # written through, the link's target (a shared template, any file) would be replaced
        raise store.linked(path, "remove the link (its target is left alone), then run init again")
    if path.exists():
        check_replaceable(path)
        if not force:
            raise UsageError(f"{path} already exists; pass --force to overwrite it, or choose another folder")
        store.check_free(directory)  # the config of a run that trains now
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"{directory} exists and is not a folder")
    created = [p for p in (directory, *directory.parents) if not p.exists() and not p.is_symlink()]  # deepest first
    directory.mkdir(parents=True, exist_ok=True)
    try:  # without --force, never over one another init wrote meanwhile
        store.write_text(path, to_yaml(cfg, header), exclusive=not force)
    except FileExistsError:
        raise UsageError(f"{path} already exists (written while this init ran); pass --force to overwrite it") from None
    except BaseException:
        for folder in created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if still empty
        raise
    return path
