"""Loading a run configuration: defaults < YAML file < `--set section.key=value`, into a `Config`. Strict: keys
given twice, unknown keys, wrong types and impossible values are reported together, a line each (exit 2)."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import math
import os
import re
import stat
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from bertcli.config import DEBUG, PRESETS, Config, Device, ModelConfig, field_types, flat
from bertcli.config_write import yaml_scalar
from bertcli.errors import UsageError


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """defaults < YAML file < --set overrides, strictly checked."""
    extra, origin = parse_overrides(overrides or [])
    file = _from_earlier(read_yaml(Path(path)))  # before --set: its values mean what they mean today
    return _build_checked(Config, _merge(file, extra), "", {"": str(path), **origin})


def config_from_dict(raw: dict[str, Any], source: str) -> Config:
    """A Config from a nested dict (a checkpoint's config, say), strictly checked; `source` names it in errors."""
    return _build_checked(Config, raw, "", {"": source})


def preset_config(name: str, overrides: list[str] | None = None, *, values: dict[str, Any] | None = None) -> Config:
    """defaults < preset `name` < `values` (typed, {"model.hidden_size": 256}: named as --set) < --set overrides."""
    if name not in PRESETS:
        raise UsageError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    chosen: dict[str, Any] = {}
    for key, value in (values or {}).items():
        *sections, last = key.split(".")
        functools.reduce(lambda node, part: node.setdefault(part, {}), sections, chosen)[last] = value
    extra, origin = parse_overrides(overrides or [])
    labels = {"": f"preset {name}", **dict.fromkeys(values or {}, "--set"), **origin}
    return _build_checked(Config, _merge(_merge(PRESETS[name], chosen), extra), "", labels)


def debug_config(overrides: list[str] | None = None) -> Config:
    """defaults < preset tiny < config.DEBUG < --set overrides: the debug flavour of the tests."""
    extra, origin = parse_overrides(overrides or [])
    raw = _merge(_merge(PRESETS["tiny"], DEBUG), extra)
    return _build_checked(Config, raw, "", {"": "the debug config", **origin})


def as_overrides(nested: dict[str, Any], prefix: str = "") -> list[str]:
    """A nested dict as `--set` strings (["model.hidden_size=32", ...]): parse_overrides' inverse."""
    return [f"{key}={yaml_scalar(value)}" for key, value in flat(nested, prefix).items()]


def model_config_from_dict(raw: dict[str, Any], source: str) -> ModelConfig:
    """A ModelConfig alone (an imported config.json's), strictly checked; it must give vocab_size."""
    if raw.get("vocab_size") is None:
        raise UsageError(f"{source}: model.vocab_size: missing; an architecture alone must give its vocabulary size")
    return _build_checked(ModelConfig, raw, "model", {"": source})


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML mapping; every way reading it fails is one UsageError line."""
    with contextlib.suppress(OSError):  # (the open below says why)
        if stat.S_ISFIFO(mode := os.stat(path).st_mode) or stat.S_ISSOCK(mode):  # <(...): no folder for its paths
            raise UsageError(f"{path}: a pipe, not a file: save it to a file (relative paths need its folder)")
    try:
        with open(path, "rb") as fh:  # --config /dev/zero, or a 10 GB file, is refused at once
            data = fh.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise UsageError(f"{path}: over {MAX_CONFIG_BYTES // 1024} KiB, so not a run config (one is a few KiB)")
        raw = load_yaml(data.decode("utf-8"))
    except (OSError, ValueError, RecursionError, yaml.YAMLError) as exc:
        raise UsageError(f"{path}: {_unreadable(exc, path)}") from None
    if raw is None or raw == {}:  # (`--config /dev/null` trained BERT-base's defaults into /dev)
        raise UsageError(f"{path}: no settings in it (empty, or only comments); write one with `bertcli init DIR`")
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: expected a mapping of sections (model:, train: ...), got {type(raw).__name__}")
    return raw


def _unreadable(exc: BaseException, path: Path) -> str:
    """Why the config file at `path` could not be read, `exc` being what reading it raised."""
    if isinstance(exc, DuplicateKey):
        return f"line {exc.line}: key {str(exc.key)!r} is given twice (first at line {exc.first_line}); keep one"
    if isinstance(exc, yaml.YAMLError) and not isinstance(exc, TooManyAliases):
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return f"malformed YAML{at}: {getattr(exc, 'problem', None) or str(exc).splitlines()[0]}"
    said = {  # the first type `exc` is an instance of
        FileNotFoundError: "config file not found; create one with `bertcli init DIR`",
        IsADirectoryError: f"is a folder; pass the config file inside it (e.g. {path / 'config.yaml'})",
        OSError: f"cannot read: {getattr(exc, 'strerror', '')}",
        UnicodeDecodeError: f"not UTF-8 text (byte {getattr(exc, 'start', '?')}); is this a config file?",
        ValueError: f"malformed YAML: {(str(exc).splitlines() or [''])[0]}",  # an integer of thousands of digits
        RecursionError: "values nested too deeply to read; a run config is two or three levels deep",
    }
    return next((line for kind, line in said.items() if isinstance(exc, kind)), str(exc))  # TooManyAliases: its own


# A config is about 90 values: aliases may repeat sections, never make it thousands of times larger.
MAX_YAML_NODES, MAX_CONFIG_BYTES = 10_000, 256 * 1024


class TooManyAliases(yaml.YAMLError):
    """Too many values: written out (counted while composing), or made by aliases (counted after)."""


def load_yaml(text: str) -> Any:
    """A YAML document with StrictLoader; TooManyAliases, before it is built, if aliases expand it too far or loop."""
    if len(text) > MAX_CONFIG_BYTES:  # libyaml composes every node before _expanded counts them
        raise ValueError(f"over {MAX_CONFIG_BYTES // 1024} KiB, so not a run config (one is a few KiB)")
    # libyaml reads a config in 1.3 ms (Python's parser: 12 ms) but recurses on the C stack, which overflows past ~10^4
    # levels; each level starts at one of ":-[{?". What libyaml refuses, Python's parser reads again: it says why.
    # A tab goes to Python's parser too: libyaml takes one after `key:` where Python's refuses it, at any depth.
    shallow = CStrictLoader is not None and sum(map(text.count, ":-[{?")) < 1_000 and "\t" not in text
    for kind in ([CStrictLoader] if shallow else []) + [StrictLoader]:
        try:
            loader = kind(text)
            node = loader.get_single_node()
            if node is not None and _expanded(node, {}, set()) > MAX_YAML_NODES:
                raise TooManyAliases(f"its aliases (*name) expand it past {MAX_YAML_NODES:,} values; write them out")
            return None if node is None else loader.construct_document(node)
        except Exception:  # noqa: BLE001  (libyaml's: any, read again by Python's parser)
            if kind is StrictLoader:
                raise


def _expanded(node: yaml.Node, sizes: dict[int, int], open_: set[int]) -> int:
    """Values in `node`, aliases expanded, at most MAX_YAML_NODES + 1; each shared node counted once (`sizes`)."""
    if id(node) in open_:
        raise TooManyAliases(f"an alias refers to itself (line {node.start_mark.line + 1}); a config needs none")
    if id(node) not in sizes:
        open_.add(id(node))
        children = node.value if isinstance(node, yaml.SequenceNode) else []
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        sizes[id(node)] = min(1 + sum(_expanded(child, sizes, open_) for child in children), MAX_YAML_NODES + 1)
        open_.discard(id(node))
    return sizes[id(node)]


class DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, first_line: int, line: int) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key, self.first_line, self.line = key, first_line, line


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in a mapping (SafeLoader silently keeps the last)."""

    composed = 0  # nodes composed so far

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        self.composed += 1
        if self.composed > MAX_YAML_NODES:
            mark = self.peek_event().start_mark
            raise TooManyAliases(f"more than {MAX_YAML_NODES:,} values (past line {mark.line + 1}); a config holds ~90")
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}  # each key's first node (a flow mapping `{a: 1, a: 2}` is on one line)
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` may be overridden: YAML's rule
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # an unhashable key: SafeLoader's own error says so
                continue
            if first is not key_node:
                raise DuplicateKey(key, first.start_mark.line + 1, key_node.start_mark.line + 1)
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        """An integer as YAML 1.2 reads it: `010` is 10 (YAML 1.1: 8), `0x1F` and `0o17` hex and octal."""
        text = str(self.construct_scalar(node)).replace("_", "")
        sign, digits = (-1, text[1:]) if text[:1] == "-" else (1, text.lstrip("+"))
        return sign * (int(digits, 0) if digits[:2].lower() in ("0x", "0o") else int(digits, 10))


# YAML 1.2's core schema: no sexagesimal (`1:30` is text) or binary; leading zeros decimal; no dates (2024-05-01).
NOT_RESOLVED = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:timestamp")
StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in NOT_RESOLVED]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
YAML_INT = r"^(?:[-+]?[0-9][0-9_]*|0x[0-9a-fA-F_]+|0o[0-7_]+)$"
YAML_FLOAT = r"^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(YAML_INT), list("-+0123456789"))
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(YAML_FLOAT), list("-+0123456789."))
StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)


# StrictLoader on libyaml's parser (compose_node is Python's only: _expanded counts what libyaml composed).
CStrictLoader = type("CStrictLoader", (yaml.CSafeLoader, StrictLoader), {}) if yaml.__with_libyaml__ else None


def parse_overrides(overrides: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """`["model.hidden_size=256", ...]` as a nested dict, and each path's origin label."""
    nested: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not all(parts := key.split(".")):  # ("".split(".") is [""])
            raise UsageError(f"--set {item!r}: expected section.key=value, for example train.max_steps=200")
        try:
            value = load_yaml(text) if text.strip() else ""
        except (yaml.YAMLError, ValueError, RecursionError) as exc:  # ValueError: an integer of 5,000 digits
            raise UsageError(f"--set {_shown(item)}: {_unreadable(exc, Path(key))}") from None
        if len(parts) == 1 and dataclasses.is_dataclass(field_types(Config).get(key)):
            raise UsageError(f"--set {_shown(item)}: {key} is a section: set its keys one at a time ({key}.KEY=VALUE)")
        node = nested
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise UsageError(f"--set {item!r}: '{part}' is set both as a value and as a section")
            node = child
        node[parts[-1]] = value
        origin[key] = "--set"
    return nested, origin


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _origin_of(p: str, origin: dict[str, str]) -> str:
    """Where the value at `p` (or, for a section's check, a key under it) came from: the file, or --set."""
    under = [label for key, label in origin.items() if key.startswith(p + ".")] if p else []
    return origin.get(p) or (under[0] if under else origin.get("", "config"))


def _build_checked(cls: type, raw: dict[str, Any], path: str, origin: dict[str, str]) -> Any:
    """Section `cls` (at `path`: "" for a whole Config) built and checked (`problems()`): one UsageError lists all."""
    errors: list[str] = []
    failed: set[str] = set()
    raw = _from_earlier(raw) if cls is Config else raw
    built = _build(cls, raw, path, errors=errors, origin=origin, failed=failed)
    # A value check that reads a value of the wrong type (left at its default) would mislead: left out.
    problems = [(p, msg) for p, msg in built.problems() if not any(_involves(p, msg, bad) for bad in failed)]
    errors += [f"{_origin_of(p, origin)}: {p}: {msg}" for p, msg in problems]
    if errors:
        raise UsageError(*errors)
    return built


def _from_earlier(raw: dict[str, Any]) -> dict[str, Any]:
    """A config of bertcli 0.1 in today's keys: its train.batch_size was the micro-batch and train.grad_accum_steps
    their count, so a step took batch_size x grad_accum_steps x processes examples (the processes of this job)."""
    train = raw.get("train")
    if not isinstance(train, dict) or "grad_accum_steps" not in train:
        return raw
    if "micro_batch_size" in train:
        fix = "train.batch_size is a whole step's examples: remove it"
        raise UsageError(f"train.grad_accum_steps (bertcli 0.1's): replaced by train.micro_batch_size; {fix}")
    micro, accum = train.get("batch_size", 32), train["grad_accum_steps"]  # 32: bertcli 0.1's default
    if not all(type(n) is int and n > 0 for n in (micro, accum)):
        raise UsageError(
            f"train.batch_size and train.grad_accum_steps must be positive integers, got {micro!r}, {accum!r}"
        )
    steps = {"batch_size": micro * accum * int(os.environ.get("WORLD_SIZE", "1")), "micro_batch_size": micro}
    return raw | {"train": {k: v for k, v in train.items() if k != "grad_accum_steps"} | steps}


def _involves(path: str, message: str, bad: str) -> bool:
    """Whether the value check (path, message) reads `bad` (a field or a whole section)."""
    return path == bad or path.startswith(bad + ".") or re.search(rf"(?<![\w.]){re.escape(bad)}\b", message) is not None


def _build(cls: type, raw: Any, path: str, *, errors: list[str], origin: dict[str, str], failed: set[str]) -> Any:
    """Dataclass `cls` from nested dict `raw`; every problem goes to `errors`, and the path of every value
    (or section) of the wrong type to `failed`: those keep their defaults."""

    def where(p: str) -> str:
        return f"{_origin_of(p, origin)}: {p}"

    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        errors.append(f"{where(path or '(top level)')}: expected a mapping of keys, got {_shown(raw)}")
        failed.add(path)
        return cls()
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        sub = f"{path}.{key}" if path else str(key)
        if key not in names:
            section = f"section '{path}'" if path else "the top level"
            errors.append(f"{where(sub)}: unknown key in {section}{_closest(str(key), names)}")
            continue
        tp = field_types(cls)[key]
        if tp == Device:  # an open set (cuda:N): a string here, its form in TrainConfig.problems()
            tp = str
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value, sub, errors=errors, origin=origin, failed=failed)
            continue
        converted, problem = _check_value(value, tp)
        if problem:
            errors.append(f"{where(sub)}: {problem}")
            failed.add(sub)
        else:
            kwargs[key] = converted
    return cls(**kwargs)


def _check_value(value: Any, tp: Any) -> tuple[Any, str | None]:
    """Return (value converted to type tp, None) or (None, what is wrong)."""
    got = f"{_shown(value)} ({type(value).__name__})"
    if typing.get_origin(tp) is typing.Union:  # Optional[X]: null or an X
        if value is None:
            return None, None
        inner = next(a for a in typing.get_args(tp) if a is not type(None))
        converted, problem = _check_value(value, inner)
        return converted, (problem + " (or null)" if problem else None)
    if typing.get_origin(tp) is Literal:
        if value in (choices := typing.get_args(tp)):
            return value, None
        return None, f"must be one of {', '.join(map(str, choices))}; got {_shown(value)}"
    if tp in (bool, str):
        return (value, None) if isinstance(value, tp) else (None, f"expected {EXPECTED[tp]}, got {got}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            integer = value
        else:
            number = _as_float(value)  # accept 1e6 and 1.0e+6 for whole numbers (exact ones: up to 2**53)
            if number is None or not math.isfinite(number) or not number.is_integer():
                return None, f"expected an integer, got {got}"
            if abs(number) > 2**53:  # past 2**53 a float is not sure to be the integer that was written
                return None, f"expected an integer, got {got}: write it out in digits (as a float it may not be exact)"
            integer = int(number)
        if not -MAX_INT <= integer <= MAX_INT:  # numpy and torch take 64-bit integers
            return None, f"must be at most {MAX_INT:,} in size (a 64-bit integer), got {_shown(integer)}"
        return integer, None
    if tp is float:
        number = _as_float(value)  # YAML 1.1 reads `1e-4` as a string: accept it as a number
        if number is None:
            return None, f"expected a number, got {got}"
        if not math.isfinite(number):  # eps=inf trains with no updates, lr=nan with NaN weights: never meant
            return None, f"expected a finite number, got {got}"
        return number, None
    if tp == list[str]:
        strings = isinstance(value, list) and all(isinstance(v, str) for v in value)
        return (list(value), None) if strings else (None, f"expected a list of strings (['*.txt']), got {got}")
    raise TypeError(f"unsupported config type {tp!r}")


MAX_INT = 2**63 - 1  # the largest integer numpy and torch take (int64)
EXPECTED = {bool: "true or false", str: "a string"}


def _shown(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text):,} characters)"


def _as_float(value: Any) -> float | None:
    """`value` as a float (an integer of 400 digits: inf); None where it is no number."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf
    except ValueError:
        return None


def _closest(name: str, options: list[str]) -> str:
    match = difflib.get_close_matches(name, options, n=1, cutoff=0.5)
    return f"; did you mean '{match[0]}'?" if match else f"; valid keys: {', '.join(options)}"
