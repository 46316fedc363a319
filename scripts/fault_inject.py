"""Kill a real `bertcli pretrain` with SIGKILL at random moments, rerun the same command, repeat;
then compare the final weights with an uninterrupted run's.

    python scripts/fault_inject.py --rounds 50 [--seed 0] [--keep]

Each round starts the command and kills it at a random moment: one round in five during start-up
(a random time into it), the others just after a random checkpoint beyond the last one (up to 50 ms
after it appears), so kills land in training steps, evaluation and checkpoint writes (checkpoints
are written every 2 steps). A blind random time would mostly land in start-up, which takes seconds.
After every kill, the checkpoint that `--resume auto` would pick must be complete and loadable
(weights and training state). When the rounds are done, the command runs to the end; its final
weights must equal, bit for bit, those of the same command run once without interruption.
Exit 0 when every check held.
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import safetensors.torch
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bertcli import checkpoint, console, layout, resume  # noqa: E402
from bertcli.config_load import debug_config  # noqa: E402
from bertcli.config_write import preset_header, to_yaml  # noqa: E402
from bertcli.model import BertForPreTraining  # noqa: E402
from bertcli.optim import build_optimizer  # noqa: E402

# The debug flavour (config.DEBUG), checkpointing every 2 steps so that kills land between and during saves.
OVERRIDES = ["optimizer.warmup_steps=5", "logging.log_every=5", "checkpoint.save_every=2", "train.eval_every=10"]


def write_config(folder: Path, max_steps: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.yaml"
    path.write_text(to_yaml(debug_config(OVERRIDES + [f"train.max_steps={max_steps}"]), preset_header("tiny")))
    return path


def command(config: Path) -> list[str]:
    return [sys.executable, "-m", "bertcli", "pretrain", "--config", str(config), "--quiet"]


def check_resumable(folder: Path, config: Path) -> int:
    """The checkpoint --resume auto would pick loads completely; return its step (0 if none)."""
    found = layout.list_checkpoints(folder)
    if not found:
        return 0
    step, path = found[-1]
    cfg = checkpoint.read_config(path)
    console.speak(False)  # (its "resuming from" lines)
    # As --resume PATH: raises on a missing, truncated, damaged or mismatched file.
    chosen = resume.choose(cfg, str(path), is_main=False, last_step=cfg.train.max_steps, tokenizer=None)
    checkpoints = checkpoint.CheckpointManager(cfg, is_main=False, tokenizer={}, best=chosen.best, last=chosen.path)
    model = BertForPreTraining(cfg.model)
    progress = checkpoints.restore(
        chosen.path,
        torch.device("cpu"),
        model=model,
        optimizer=build_optimizer(model, cfg.optimizer),
        scaler=torch.amp.GradScaler("cpu", enabled=False),
    )
    console.speak(True)
    assert progress.step == step
    return step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--max-steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="fault_inject."))
    killed_cfg, clean_cfg = write_config(work / "killed", args.max_steps), write_config(work / "clean", args.max_steps)

    # The uninterrupted run, beside the rounds (a process of its own: it uses the other core).
    clean = subprocess.Popen(command(clean_cfg), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        return rounds(args, rng=rng, work=work, killed_cfg=killed_cfg, clean=clean)
    finally:
        if clean.poll() is None:  # a round failed: the uninterrupted run is not needed
            clean.kill()
            clean.communicate()


def rounds(
    args: argparse.Namespace, *, rng: random.Random, work: Path, killed_cfg: Path, clean: subprocess.Popen
) -> int:
    """The kill rounds, the final run and the comparison with `clean`, the uninterrupted run."""
    steps_seen, finished_early, step = [], 0, 0
    for round_ in range(1, args.rounds + 1):
        proc = subprocess.Popen(command(killed_cfg), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if rng.random() < 0.2 or step + 2 >= args.max_steps:
            time.sleep(rng.uniform(0.5, 4.0))  # in start-up
        else:
            target = work / "killed" / "checkpoints" / f"step-{rng.randrange(step + 2, args.max_steps, 2):07d}"
            while not target.exists() and proc.poll() is None:
                time.sleep(0.002)
            time.sleep(rng.uniform(0, 0.05))  # in the next steps, evaluation or checkpoint write
        if proc.poll() is not None:
            finished_early += 1
            err = proc.stderr.read().decode()
            if proc.returncode != 0:
                print(f"round {round_}: the run failed on its own (exit {proc.returncode}): {err[-500:]}")
                return 1
        else:
            proc.kill()
            proc.wait()
        proc.stderr.close()
        step = check_resumable(work / "killed", killed_cfg)
        steps_seen.append(step)
        print(f"round {round_:>3}: killed; resumable checkpoint at step {step}", flush=True)
    final = subprocess.run(command(killed_cfg), cwd=REPO, capture_output=True, text=True)
    if final.returncode != 0:
        print(f"final run failed: {final.stderr[-500:]}")
        return 1
    _, clean_err = clean.communicate()
    if clean.returncode != 0:
        print(f"uninterrupted run failed: {clean_err[-500:]}")
        return 1
    name = f"step-{args.max_steps:07d}"
    a = safetensors.torch.load_file(work / "killed" / "checkpoints" / name / "model.safetensors")
    b = safetensors.torch.load_file(work / "clean" / "checkpoints" / name / "model.safetensors")
    different = [k for k in a if not torch.equal(a[k], b[k])]
    print(
        f"{args.rounds} kill rounds ({finished_early} ended before the kill), resumable steps "
        f"{steps_seen[:3]}...{steps_seen[-3:]}; corrupt checkpoints: 0; final weights "
        f"{'IDENTICAL' if not different else f'DIFFER in {len(different)} tensors'} to the uninterrupted run"
    )
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if not different else 1


if __name__ == "__main__":
    sys.exit(main())
