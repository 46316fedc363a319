"""README.md and docs/*.md are checked against the code, so they cannot drift: the tables the code
generates, the counts they state, every `bertcli` command line they show (parsed by the CLI itself,
without running it), every `--set` override, config key and repository path they name, and every
link between them (files and #anchors)."""

from __future__ import annotations

import dataclasses
import enum
import importlib
import re
import shlex
import typing
from pathlib import Path

import pytest
import typer
from conftest import REPO

from bertcli.cli import app, click
from bertcli.config import PRESETS, Config
from bertcli.config_load import preset_config
from bertcli.config_write import markdown_reference
from bertcli.summary import parameter_counts

README = (REPO / "README.md").read_text()
DOCS = {path: path.read_text() for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]}
EVERYWHERE = "\n".join(DOCS.values())
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SHELL = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.S | re.M)  # blocks of commands, not output


def prose(text: str) -> str:
    """The text outside fenced code blocks (a `# comment` in a bash block is no heading)."""
    return FENCE.sub("", text)


def test_the_docs_exist_and_the_readme_stays_short():
    assert {"reference.md", "configuration.md", "benchmarks.md"} <= {p.name for p in DOCS}
    assert README.count("\n") < 350, f"README.md has {README.count(chr(10))} lines: move reference material to docs/"


def test_config_reference_is_the_generated_one():
    assert markdown_reference() in EVERYWHERE, (
        "the config reference is stale: paste markdown_reference()'s output into docs/configuration.md"
    )


def test_preset_table_matches_the_code():
    for name in PRESETS:
        row = re.search(rf"^\| `{name}`[^|]*\|(.*)$", README, re.M)
        assert row, f"no README row for preset {name}"
        cells = [c.strip() for c in row.group(1).split("|") if c.strip()]
        cfg = preset_config(name)
        m = dataclasses.replace(cfg.model, vocab_size=cfg.data.tokenizer.vocab_size)  # counted at the tokenizer's size
        assert [int(c) for c in cells[:5]] == [
            m.num_hidden_layers,
            m.hidden_size,
            m.num_attention_heads,
            m.intermediate_size,
            cfg.data.max_seq_length,
        ]
        assert int(cells[5].split()[0].replace(",", "")) == parameter_counts(m)["total"]


def test_quick_start_and_ci_run_the_same_test_command():
    ci = (REPO / ".ci" / "run").read_text()
    command = "bash scripts/setup.sh --test && python3 -m pytest -q"
    assert command in ci and command in README


def test_command_examples_use_run_folders_the_readme_makes():
    """A reader can paste every example: the run folder it names is one an example `bertcli init` makes."""
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", README, re.S))
    made = set(re.findall(r"bertcli init (runs/\w+)", blocks))
    used = set(re.findall(r"(?:--model|--config|inspect|export|--logdir) (runs/\w+)", blocks))
    assert made and used <= made, f"examples name {sorted(used - made)}, the README makes {sorted(made)}"


def test_bad_input_catalogue_count_is_the_tests():
    from test_bad_inputs import CASES

    stated = re.findall(r"`tests/system/test_bad_inputs.py` is a catalogue of (\d+) bad inputs", EVERYWHERE)
    assert stated and {int(n) for n in stated} == {len(CASES)}, f"the docs say {stated}, the test has {len(CASES)}"


# --- every bertcli command line, against the CLI -------------------------------------------------

CLI = typer.main.get_command(app)
HELP = {"-h", "--help"}
SYNOPSIS = re.compile(r"\[|\.\.\.|\|")  # `bertcli init DIR [--preset tiny|small|...]`: a usage line, not a command


def command_lines() -> list[tuple[str, str, bool]]:
    """(where, the words after `bertcli`, whether it is a whole command) for every bertcli command
    in a code block (a whole command: pasted as written) or an inline code span (a mention, which
    may leave out required arguments) of the README and docs/."""
    found = []
    for path, text in DOCS.items():
        for block in SHELL.findall(text):
            for line in block.replace("\\\n", " ").splitlines():
                if not re.search(r"(^|[\s|&;(])bertcli\s", line):
                    continue  # not a command line (the tree of a run folder, a diagram, program output)
                found += [(f"{path.name}: {line.strip()}", words, True) for words in bertcli_words(line)]
        for span in spans(text):
            if SYNOPSIS.search(span):
                continue  # usage lines: test_usage_lines_name_real_options
            found += [(f"{path.name}: `{span}`", words, False) for words in bertcli_words(span)]
    return found


def spans(text: str) -> list[str]:
    """The inline code spans that hold a bertcli command, a span wrapped over two lines joined."""
    found = [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", prose(text)) if "\n\n" not in s]
    return [s for s in found if re.search(r"\bbertcli ", s)]


def bertcli_words(line: str) -> list[list[str]]:
    """The arguments of each bertcli command on a shell line: `bertcli ...`, `python -m bertcli ...`
    or `torchrun ... -m bertcli ...` (or `--no-python bertcli`), up to a pipe, `&&`, `;` or a redirection (whose file
    is skipped)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands, words, skip = [], None, False
    tokens = list(lexer)
    for i, token in enumerate(tokens):
        if skip:
            skip = False
        elif set(token) <= set("|&;<>()"):
            if words is not None:
                commands.append(words)
            words, skip = None, token in {"<", ">", ">>"}
        elif words is not None:
            words.append(token)
        elif token == "bertcli" and (
            i == 0 or tokens[i - 1] in ("-m", "--no-python") or set(tokens[i - 1]) <= set("|&;(")
        ):
            words = []
    if words is not None:
        commands.append(words)
    return commands


def options(command: click.Command) -> dict[str, click.Parameter]:
    return {opt: p for p in command.params for opt in [*p.opts, *p.secondary_opts] if opt.startswith("-")}


def check_command(words: list[str], whole: bool) -> str | None:
    """What is wrong with `bertcli WORDS` by the CLI's own parser, or None; nothing is run."""
    words = [w for w in words if w != "--debug"]  # main() takes it anywhere on the line
    while words and words[0].startswith("-"):
        if words[0] not in {*options(CLI), *HELP}:
            return f"bertcli has no option {words[0]}"
        if words.pop(0) in {"--version", *HELP}:
            return None
    if not words:
        return None
    name, args = words[0], words[1:]
    if name not in CLI.commands:
        return f"no command {name!r} (commands: {', '.join(CLI.commands)})"
    command = CLI.commands[name]
    if HELP & set(args):
        return None
    try:
        ctx = command.make_context(name, list(args))  # parses and converts, runs nothing
    except click.exceptions.MissingParameter as exc:
        return None if not whole else exc.format_message()
    except click.exceptions.ClickException as exc:
        return exc.format_message()
    for param in command.params:  # a metavar that lists choices (`--dtype fp32|bf16|fp16`) is a promise
        choices = (param.metavar or "").split("|")
        value = getattr(ctx.params.get(param.name), "value", ctx.params.get(param.name))
        if (
            len(choices) > 1
            and all(c.islower() for c in choices)
            and value is not None
            and value != param.default
            and str(value) not in choices
        ):
            return f"{param.opts[0]} {value}: not one of {'|'.join(choices)}"
    if ctx.params.get("overrides"):
        try:
            preset_config(getattr(ctx.params.get("preset"), "value", "tiny"), list(ctx.params["overrides"]))
        except Exception as exc:  # noqa: BLE001  the message is the point
            return f"--set does not load: {exc}"
    return None


def test_commands_are_found():
    """The collector sees the README's examples, pipes, redirections and torchrun included (a
    pattern that found nothing would pass every check)."""
    lines = [where for where, _, whole in command_lines() if where.startswith("README") and whole]
    assert len(lines) >= 8, lines
    for example in (
        "--no-python bertcli pretrain",
        "| bertcli encode",
        "bertcli pretrain --config runs/demo/config.yaml",
    ):
        assert any(example in where for where in lines), f"the README example with {example!r} was not seen"


@pytest.mark.parametrize("where, words, whole", command_lines(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_command_line_parses(where, words, whole):
    problem = check_command(words, whole)
    assert problem is None, f"{where}: {problem}"


def usage_lines() -> list[tuple[str, str]]:
    return [
        (f"{path.name}: `{span}`", span)
        for path, text in DOCS.items()
        for span in spans(text)
        if span.startswith("bertcli ") and SYNOPSIS.search(span)
    ]


@pytest.mark.parametrize("where, span", usage_lines())
def test_usage_lines_name_real_options(where, span):
    """`bertcli pretrain --config FILE [--resume auto|never|PATH] ...`: the command and every option
    it shows exist (with its short and --no- forms); the choices it lists are the CLI's."""
    words = span.replace("[", " ").replace("]", " ").split()
    name = words[1]
    assert name in CLI.commands, f"{where}: no command {name!r}"
    known = {**options(CLI.commands[name]), **options(CLI)}
    for i, word in enumerate(words):
        if word.startswith("-"):
            assert word in known or word in HELP, f"{where}: `bertcli {name}` has no option {word}"
            listed = words[i + 1].split("|") if i + 1 < len(words) else []
            values = cli_choices(known[word]) if word in known else None
            if len(listed) > 1 and values:
                assert set(listed) == set(values), f"{where}: {word} takes {'|'.join(values)}, not {'|'.join(listed)}"


def cli_choices(param: click.Parameter) -> list[str] | None:
    """The values an option accepts, where it is a choice (click's Choice, or Typer's Enum annotation)."""
    choices = getattr(getattr(param, "type", None), "choices", None)
    if choices:
        return [str(getattr(c, "value", c)) for c in choices]
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    for tp in (annotation, *typing.get_args(annotation)):
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return [str(e.value) for e in tp]
    return None


def test_the_usage_lines_are_found():
    assert len({span.split()[1] for _, span in usage_lines()}) == len(CLI.commands), "a command has no usage line"


# --- --set overrides and config keys ----------------------------------------------------------------

SECTIONS = tuple(f.name for f in dataclasses.fields(Config) if dataclasses.is_dataclass(getattr(Config(), f.name)))


def test_every_set_override_in_the_docs_loads():
    """`--set train.max_steps=2000`: each line's overrides, together, load on a preset (a renamed key
    or a value of the wrong type fails here)."""
    pattern = r"--set ((?:%s)\.[\w.]+=[^\s`]+)" % "|".join(SECTIONS)
    lines = [line for line in EVERYWHERE.replace("\\\n", " ").splitlines() if re.search(pattern, line)]
    assert len(lines) > 5, lines
    for line in lines:
        preset = re.search(r"--preset (\w+)", line)
        preset_config(preset.group(1) if preset else "tiny", re.findall(pattern, line))  # raises naming the key


def config_names() -> set[str]:
    names = set()

    def walk(obj, prefix: str) -> None:
        for f in dataclasses.fields(obj):
            names.add(prefix + f.name)
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                walk(value, f"{prefix}{f.name}.")

    walk(Config(), "")
    return names


def test_config_keys_in_backquotes_exist():
    """`train.unpad`, `data.tokenizer.path: ...`: a key a reader copies into a config is one the schema
    has (or a function of the bertcli module of that name: `sizes.flops_per_token`)."""
    names = config_names()
    for key in sorted(set(re.findall(r"`((?:%s)\.[a-z_][\w.]*)[`:= ]" % "|".join(SECTIONS), EVERYWHERE))):
        if re.search(r"\.(py|sh|md|yaml|json|jsonl|txt|bin|pt|safetensors)$", key):
            continue  # a file: `checkpoint.py`
        module, _, attribute = key.partition(".")
        assert key in names or hasattr(importlib.import_module(f"bertcli.{module}"), attribute.split(".")[0]), (
            f"`{key}` is neither a config key nor in bertcli.{module}"
        )


# --- repository paths and links ---------------------------------------------------------------------


def test_repository_paths_named_in_the_docs_exist():
    """`scripts/fault_inject.py`, `tests/system/test_train.py::test_exact_resume_is_bitwise_identical`, `configs/*.yaml`."""
    named = set(re.findall(r"`((?:scripts|tests|configs|bertcli|benchmarks|\.ci)/[^`\s]*)`", EVERYWHERE))
    assert len(named) > 10, named
    for name in sorted(named):
        path, _, test = name.partition("::")
        assert list(REPO.glob(path)), f"{name} is named in the docs but {path} does not exist"
        if test:
            assert re.search(rf"^\s*def {re.escape(test)}\(", (REPO / path).read_text(), re.M), f"no test {name}"


def slugs(text: str) -> set[str]:
    """The #anchors GitHub gives a file's headings: lower case, punctuation dropped, spaces to '-',
    a repeated one numbered (-1, -2, ...)."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+?)\s*$", prose(text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def links() -> list[tuple[Path, str]]:
    return [
        (path, target)
        for path, text in DOCS.items()
        for target in re.findall(r"\]\(([^)\s]+)\)", prose(text))
        if not re.match(r"[a-z]+:", target)
    ]


def test_links_between_the_docs_resolve():
    assert len(links()) > 10
    for source, target in links():
        file, _, anchor = target.partition("#")
        path = (source.parent / file).resolve() if file else source
        assert path.exists(), f"{source.name}: link to {target}: no file {path}"
        if anchor:
            assert anchor in slugs(path.read_text()), f"{source.name}: link to {target}: no such heading in {path.name}"


def test_the_readme_links_every_doc():
    linked = {(REPO / target.partition("#")[0]).resolve() for source, target in links() if source.name == "README.md"}
    assert {p for p in DOCS if p.parent.name == "docs"} <= linked


def test_headline_figures_are_the_benchmarks():
    """Each row of the README's summary table links to its section of docs/benchmarks.md, and every
    number in the row is written there: the table is a copy of measured figures, not new ones."""
    benchmarks = (REPO / "docs" / "benchmarks.md").read_text()
    table = README[README.index("## Benchmarks") :]
    rows = [r for r in re.findall(r"^\|(.*)\|$", table, re.M) if "docs/benchmarks.md#" in r]
    assert len(rows) >= 8, rows
    for row in rows:
        anchor = re.search(r"docs/benchmarks\.md#([\w-]+)", row).group(1)
        headings = re.split(r"^## ", benchmarks, flags=re.M)
        section = next((s for s in headings if slugs("## " + s.splitlines()[0]) == {anchor}), None)
        assert section, f"no section #{anchor} in docs/benchmarks.md"
        figures = re.sub(r"\]\([^)]*\)", "]", row)
        for number in re.findall(r"\d+(?:[.,]\d+)*", figures):
            assert re.search(rf"(?<![\d.,]){re.escape(number)}(?![\d]|[.,]\d)", section), (
                f"README summary row says {number}; section #{anchor} of docs/benchmarks.md does not: {row}"
            )
