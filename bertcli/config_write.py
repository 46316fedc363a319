"""Writing a run configuration: the commented YAML that `bertcli init` writes, and the table of
docs/configuration.md.

Both come from the schema in `bertcli.config`: every field with its docstring, its type and its
default, so the files people read cannot drift from the code (tests/unit/test_config.py and
tests/system/test_readme.py check that configs/ and docs/configuration.md equal what these functions write).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

import yaml

from bertcli.config import Config, field_docs, field_types


def yaml_scalar(value: Any) -> str:
    """A value as a YAML scalar that reads back as the same Python value; non-ASCII text as it is
    (a path "ünï/x" was written "\\xFCn\\xEF/x": trial 18 P4), only what YAML cannot print escaped."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, allow_unicode=True)
    return text.removesuffix("\n...\n").strip()


def type_name(tp: Any) -> str:
    """A field's type as the comments and the reference show it: int, float or null, linear|cosine|constant."""
    if typing.get_origin(tp) is typing.Union:
        return " or ".join("null" if a is type(None) else type_name(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is Literal:
        return "|".join(str(a) for a in typing.get_args(tp))
    return {int: "int", float: "float", str: "str", bool: "bool"}.get(tp, getattr(tp, "__name__", str(tp)))


def to_yaml(cfg: Config, header: str = "", comments: bool = True) -> str:
    """The config as YAML: every field, each with a one-line comment (meaning, type, default)."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    if lines:
        lines.append("")

    def emit(obj: Any, indent: int) -> None:
        cls = type(obj)
        docs, defaults = field_docs(cls), cls()
        for f in dataclasses.fields(cls):
            value = getattr(obj, f.name)
            pad = "  " * indent
            if dataclasses.is_dataclass(value):
                if comments:
                    lines.append(f"{pad}# {docs.get(f.name, '')}")
                lines.append(f"{pad}{f.name}:")
                emit(value, indent + 1)
                if indent == 0:
                    lines.append("")
                continue
            if comments:
                tp = type_name(field_types(cls)[f.name])
                lines.append(f"{pad}# {docs.get(f.name, '')} ({tp}, default {yaml_scalar(getattr(defaults, f.name))})")
            lines.append(f"{pad}{f.name}: {yaml_scalar(value)}")
            if indent == 0:
                lines.append("")

    emit(cfg, 0)
    return "\n".join(lines).rstrip() + "\n"


def markdown_reference() -> str:
    """The config reference table of docs/configuration.md, generated from the field docstrings."""
    rows = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]

    def walk(obj: Any, prefix: str) -> None:
        cls = type(obj)
        for f in dataclasses.fields(cls):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                walk(value, f"{prefix}{f.name}.")
            else:
                tp = type_name(field_types(cls)[f.name]).replace("|", " \\| ")
                rows.append(f"| `{prefix}{f.name}` | {tp} | `{yaml_scalar(value)}` | {field_docs(cls)[f.name]} |")

    walk(Config(), "")
    return "\n".join(rows)
