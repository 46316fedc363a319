"""Faults: SIGINT/SIGTERM stop cleanly with a checkpoint; a second pretrain on a folder in use refuses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from bertcli import checkpoint
from conftest import REPO, write_config


def start(config):
    return subprocess.Popen([sys.executable, "-m", "bertcli", "pretrain", "--config", str(config), "--quiet"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path, proc, seconds=120):
    deadline = time.time() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.time() < deadline
        time.sleep(0.01)


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_finishes_the_step_saves_and_says_how_to_resume(tmp_path, signum, code):
    config = write_config(tmp_path, "train.max_steps=100000", "checkpoint.save_every=50", "logging.log_every=10")
    proc = start(config)
    wait_for(tmp_path / "checkpoints" / "step-0000050", proc)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    name = signal.Signals(signum).name
    assert f"bertcli: stopped by {name} at step" in err and "run the same command again to resume" in err
    assert "Traceback" not in err
    step = checkpoint.list_checkpoints(tmp_path)[-1][0]
    assert step > 50 and f"at step {step};" in err, "the checkpoint is the step it stopped at"
    rerun = subprocess.run([sys.executable, "-m", "bertcli", "pretrain", "--config", str(config), "--stop-at", str(step + 2)],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0 and f"(step {step})" in rerun.stderr


def test_a_second_pretrain_on_the_same_folder_refuses(tmp_path):
    config = write_config(tmp_path, "train.max_steps=100000", "checkpoint.save_every=20")
    first = start(config)
    wait_for(tmp_path / "checkpoints" / "step-0000020", first)
    second = subprocess.run([sys.executable, "-m", "bertcli", "pretrain", "--config", str(config)], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert second.returncode == 1
    assert second.stderr.strip().splitlines() == [
        f"bertcli: error: {tmp_path} is in use by another bertcli pretrain (pid {first.pid}); wait for it to finish, "
        "or set output_dir to another folder"]
    # A crashed holder leaves no stuck lock: after SIGKILL the folder is free again.
    os.kill(first.pid, signal.SIGKILL)
    first.communicate()
    third = subprocess.run([sys.executable, "-m", "bertcli", "pretrain", "--config", str(config), "--quiet",
                            "--stop-at", str(checkpoint.list_checkpoints(tmp_path)[-1][0] + 1)],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
    assert third.returncode == 0, third.stderr


def test_disk_full_during_a_checkpoint_is_one_clear_line_and_keeps_earlier_checkpoints(tmp_path, cli, monkeypatch):
    import errno

    import safetensors.torch

    real_save = safetensors.torch.save_file
    calls = []

    def save_file(tensors, path, metadata=None):
        calls.append(path)
        if len(calls) == 2:  # the second checkpoint: the disk fills up half-way through it
            real_save(tensors, path, metadata=metadata)
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_save(tensors, path, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    config = write_config(tmp_path, "train.max_steps=12", "checkpoint.save_every=4", "train.eval_every=0")
    result = cli("pretrain", "--config", config, "--quiet")
    errors = [line for line in result.err_lines if line.startswith("bertcli: error:")]
    assert result.code == 1 and len(errors) == 1 and "disk full (No space left on device)" in errors[0], result.err
    assert "earlier checkpoints are intact" in errors[0] and "Traceback" not in result.err
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path)] == [4]
    assert not list((tmp_path / "checkpoints").glob(".tmp-*")), "the half-written checkpoint is gone"
    monkeypatch.setattr(safetensors.torch, "save_file", real_save)
    again = cli("pretrain", "--config", config, "--quiet")  # space is back: the same command resumes
    assert again.code == 0 and "resuming from" in again.err
