"""Shared test helpers: a micro config that trains in a second, and an in-process CLI runner."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# One thread per process for the suite's micro models (hidden size 32), in this process and in every
# bertcli it starts (the variable is inherited), set before torch is imported. Threads only cost
# there: on a busy 2-core machine the second thread of each matrix product waits for a core, and a
# test of 60 micro steps took 108 s with two threads against 21 s with one (5.2 s against 52 s for
# the exact-resume test). A value the caller sets wins. torchrun sets 1 for its processes anyway.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import yaml

from bertcli.cli import main
from bertcli.config import DEBUG, Config, ModelConfig
from bertcli.config_load import as_overrides, debug_config, preset_config
from bertcli.config_write import preset_header, to_yaml
from bertcli.data.scan import SAMPLE

REPO = Path(__file__).resolve().parents[1]

# The debug flavour (config.DEBUG: a training step takes a few milliseconds on a laptop CPU) as
# `--set` strings, for tests that pass it on a command line; micro_config builds it in Python.
MICRO = as_overrides(DEBUG)

# A model small enough to compare with transformers' in milliseconds (test_model, test_hf).
SMALL_MODEL = ModelConfig(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=40,
)


# A micro model on real text: the bundled sample cut to 60 documents, a 1,000-token vocabulary.
TEXT = [o for o in MICRO if not o.startswith(("data.corpus", "model.vocab_size", "data.synthetic"))] + [
    "model.vocab_size=null",
    "data.tokenizer.vocab_size=1000",
    "data.validation_fraction=0.1",
    "data.max_seq_length=48",
    "model.max_position_embeddings=64",
    "train.eval_every=6",
    "train.eval_examples=32",
]


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> Path:
    documents = gzip.decompress(SAMPLE.read_bytes()).decode().split("\n\n")[:60]
    path = tmp_path_factory.mktemp("corpus") / "docs.txt"
    path.write_text("\n\n".join(documents) + "\n")
    return path


def text_run(folder: Path, corpus: Path, *overrides: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.yaml"
    path.write_text(to_yaml(preset_config("tiny", TEXT + [f"data.corpus={corpus}", *overrides]), preset_header("tiny")))
    return path


@pytest.fixture(scope="session")
def trained(tmp_path_factory, small_corpus) -> Path:
    """A run folder trained for 4 steps on real text (with a tokenizer)."""
    from bertcli.resolve import load_run
    from bertcli.trainer import pretrain

    folder = tmp_path_factory.mktemp("run")
    config = text_run(folder, small_corpus, "train.max_steps=4", "train.eval_every=0")
    pretrain(load_run(config), quiet=True)
    return folder


TIMINGS = (
    "created",
    "seconds",
    "prepared_tokens",
    "tokens_per_s",
)  # the fields of a prepared folder that differ run to run


def prepared_files(folder: Path) -> dict[str, bytes]:
    """Every file of a prepared folder by relative path, its manifest without the timings."""
    import json

    files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
    manifest = json.loads(files["manifest.json"])
    files["manifest.json"] = json.dumps({k: v for k, v in manifest.items() if k not in TIMINGS}).encode()
    return files


def assert_same_batch(a, b) -> None:
    """Every field of two Batches equal (the packing index by its tensors and sizes)."""
    import dataclasses

    import torch

    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        for u, v in zip(x, y) if f.name == "packed" else [(x, y)]:
            assert torch.equal(u, v) if torch.is_tensor(u) else u == v, f.name


def micro_config(*overrides: str) -> Config:
    return debug_config(list(overrides))


_REFUSE_AND_REPORT_TORCH = """
import sys
from bertcli.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    print(exc.code, 'torch' in sys.modules)
"""


def refuse_in_fresh_interpreter(*args: str, cwd: Path, stdin: Any = None) -> tuple[list[str], str]:
    """`bertcli ARGS` run in a fresh interpreter (whether torch got imported on the way is then the
    command's alone): [exit code, "True" or "False" for torch imported], and stderr."""
    import os
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", _REFUSE_AND_REPORT_TORCH, *map(str, args)],
        stdin=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    return result.stdout.split(), result.stderr


def write_config(folder: Path, *overrides: str) -> Path:
    """A micro run config written the way `bertcli init` writes one."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.yaml"
    path.write_text(to_yaml(micro_config(*overrides), preset_header("tiny")))
    return path


def read_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def read_metrics(path: Path) -> list[dict]:
    """The records of a metrics.jsonl (its damaged lines left out)."""
    from bertcli.metrics import read_metrics_checked

    return read_metrics_checked(path)[0]


class CliResult:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


@pytest.fixture
def cli(capsys):
    """Run `bertcli ARGS...` in this process; returns exit code, stdout and stderr."""

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def run_process(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """Run `python -m bertcli ARGS...` as a real process."""
    return subprocess.run(
        [sys.executable, "-m", "bertcli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=kwargs.pop("cwd", REPO),
        timeout=kwargs.pop("timeout", 120),
        **kwargs,
    )


def without_file_hashes(ckpt: Path) -> Path:
    """Checkpoint folder `ckpt` as if written before checkpoints recorded the SHA-256 of their weights and
    training state (trainer_state.json's files_sha256): the checks below the hash (finite weights,
    shapes, the refusal of pickles) are then what meets damage. The hash is no defence against an
    attacker, who rewrites trainer_state.json too: those checks are."""
    import json

    state = json.loads((ckpt / "trainer_state.json").read_text())
    state.pop("files_sha256", None)
    state["format_version"] = 2  # the last format that may lack the record
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    return ckpt
