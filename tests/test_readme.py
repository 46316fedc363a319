"""The README and docs/*.md are checked against the code, so they cannot drift."""

from __future__ import annotations

import dataclasses
import re

from bertcli.config import PRESETS
from bertcli.config_load import preset_config
from bertcli.config_write import markdown_reference
from bertcli.summary import parameter_counts
from conftest import REPO

README = (REPO / "README.md").read_text()
DOCS = {path: path.read_text() for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]}
EVERYWHERE = "\n".join(DOCS.values())


def test_config_reference_is_the_generated_one():
    assert markdown_reference() in EVERYWHERE, \
        "the config reference is stale: paste markdown_reference()'s output into docs/configuration.md"


def test_preset_table_matches_the_code():
    for name in PRESETS:
        row = re.search(rf"^\| `{name}`[^|]*\|(.*)$", README, re.M)
        assert row, f"no README row for preset {name}"
        cells = [c.strip() for c in row.group(1).split("|") if c.strip()]
        cfg = preset_config(name)
        m = dataclasses.replace(cfg.model, vocab_size=cfg.data.tokenizer.vocab_size)  # counted at the tokenizer's size
        assert [int(c) for c in cells[:5]] == [m.num_hidden_layers, m.hidden_size, m.num_attention_heads,
                                                m.intermediate_size, cfg.data.max_seq_length]
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

    stated = re.findall(r"`tests/test_bad_inputs.py` is a catalogue of (\d+) bad inputs", EVERYWHERE)
    assert stated and {int(n) for n in stated} == {len(CASES)}, f"the docs say {stated}, the test has {len(CASES)}"
