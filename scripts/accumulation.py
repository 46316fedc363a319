"""How far 1 x 32 and 2 x 16 (gradient accumulation) end apart, with the default dropout and without.

    python scripts/accumulation.py [--steps 20]

Both runs see the same examples and MLM masks; only dropout masks differ (drawn per micro-batch),
so without dropout the weights agree to float rounding (docs/reference.md, "Several processes: torchrun")."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import safetensors.torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import write_config  # noqa: E402  (the tests' micro config)

from bertcli.resolve import load_run  # noqa: E402
from bertcli.trainer import pretrain  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    steps = ap.parse_args().steps

    def run(folder: Path, *overrides: str) -> dict:
        pretrain(
            load_run(write_config(folder, f"train.max_steps={steps}", f"checkpoint.save_every={steps}", *overrides)),
            quiet=True,
        )
        return safetensors.torch.load_file(folder / "checkpoints" / f"step-{steps:07d}" / "model.safetensors")

    for label, extra in [
        ("default dropout 0.1", []),
        ("dropout 0", ["model.hidden_dropout_prob=0", "model.attention_probs_dropout_prob=0"]),
    ]:
        with tempfile.TemporaryDirectory() as tmp:
            a = run(Path(tmp) / "a", "train.batch_size=32", "train.micro_batch_size=32", *extra)
            b = run(Path(tmp) / "b", "train.batch_size=32", "train.micro_batch_size=16", *extra)
            gap = max((a[k] - b[k]).abs().max().item() for k in a)
            print(f"{label}: max |w(1 x 32) - w(2 x 16)| after {steps} steps = {gap:.2e}", flush=True)


if __name__ == "__main__":
    main()
