"""Data-parallel training with torchrun: 2 CPU processes (gloo) against one process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import safetensors.torch
import torch
from conftest import REPO, write_config

from bertcli import checkpoint, layout
from bertcli.config_load import load_config
from bertcli.model import BertForPreTraining

pytestmark = [
    pytest.mark.skipif(not torch.distributed.is_gloo_available(), reason="needs the gloo backend"),
    pytest.mark.slow,
]

NO_DROPOUT = ["model.hidden_dropout_prob=0", "model.attention_probs_dropout_prob=0"]


@pytest.fixture(scope="module")
def beside_a_clone(tmp_path_factory):
    """A folder holding a clone, named bertcli (here a link to it): `python -m bertcli` there imports that folder
    as a namespace package ahead of the installed bertcli, unless bertcli/__main__.py sees to it."""
    folder = tmp_path_factory.mktemp("home")
    (folder / "bertcli").symlink_to(REPO, target_is_directory=True)
    return folder


def torchrun(config, *args, cwd, nproc=2, quiet=True):
    """The README's command, run from `cwd`: torchrun starts the console script (--no-python bertcli)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    command += ["--no-python", "bertcli", "pretrain", "--config", str(config), *(["--quiet"] if quiet else []), *args]
    env = {**os.environ, "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=180, env=env)


def weights(folder, step):
    return safetensors.torch.load_file(folder / "checkpoints" / f"step-{step:07d}" / "model.safetensors")


# The global batch of the runs below: 16 examples, in micro-batches of 8 in one process, 8 steps, no dropout.
GLOBAL = ["train.batch_size=16", "train.micro_batch_size=8", "train.max_steps=8", *NO_DROPOUT]


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    """The one-process run both data-parallel flavours must equal, trained once in this process
    (what is compared is the weights; a process start of its own would only add seconds)."""
    from bertcli.resolve import load_run
    from bertcli.trainer import pretrain

    folder = tmp_path_factory.mktemp("one")
    pretrain(load_run(write_config(folder, *GLOBAL)), quiet=True)
    return folder


def test_two_processes_killed_and_run_again_equal_one_process_with_the_global_batch(tmp_path, one, beside_a_clone):
    """Two processes with half the micro-batch each, every process killed (SIGKILL, as a lost machine) after a
    checkpoint, then the same command again: the run ends with the one process's weights, losses and tokens."""
    two = write_config(tmp_path / "two", *GLOBAL, "train.micro_batch_size=4", "checkpoint.save_every=2")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command += ["-m", "bertcli", "pretrain", "--config", str(two), "--quiet"]
    proc = subprocess.Popen(  # -m bertcli beside a clone: the package's own __main__ runs the installed bertcli
        command, cwd=beside_a_clone, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.time() + 120
    while not (tmp_path / "two" / "checkpoints" / "step-0000002").exists():
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.01)
    # The launcher's group and the workers (torchrun starts them in sessions of their own).
    os.killpg(proc.pid, signal.SIGKILL)
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and str(two).encode() in open(f"/proc/{pid}/cmdline", "rb").read():
                os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
    proc.wait()
    assert layout.list_checkpoints(tmp_path / "two")[-1][0] < 8
    result = torchrun(two, cwd=beside_a_clone, quiet=False)  # the console script, as the README runs it
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr.count("resuming from") == 1 and result.stderr.count("done: step 8") == 1, "only rank 0"
    assert "Warning" not in result.stderr
    a, b = weights(one, 8), weights(tmp_path / "two", 8)
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-5)
    cfg = load_config(one / "config.yaml")
    torch.manual_seed(cfg.train.seed)  # the weights both runs started from (the trainer's seeding)
    start = BertForPreTraining(cfg.model).state_dict()
    for key in ("bert.encoder.layer.0.attention.self.query.weight", "cls.seq_relationship.weight"):
        assert not torch.equal(start[key], a[key]), f"training did not move {key}"
    state = lambda f: checkpoint.read_trainer_state(f / "checkpoints" / "step-0000008")  # noqa: E731
    assert state(one)["tokens_seen"] == state(tmp_path / "two")["tokens_seen"]
    # the logged losses are those the steps optimised (over the step's tokens, all processes): the single process's
    one_m = state(one)["metrics"]
    two_m = state(tmp_path / "two")["metrics"]
    for key in ("loss", "mlm_loss", "nsp_loss"):
        assert abs(one_m[key] - two_m[key]) < 1e-5, (key, one_m[key], two_m[key])
    assert abs(one_m["mlm_acc"] - two_m["mlm_acc"]) < 1e-6


def test_fsdp_equals_one_process_and_its_checkpoint_resumes_in_one_process(tmp_path, one, cli, beside_a_clone):
    """FSDP2 (2 processes, accumulation without gradient sync on the first micro-batch) trains
    like one process with the global batch; its checkpoints hold the gathered weights and
    optimizer state, so one process (here, this one) resumes them."""
    mixed = write_config(tmp_path / "mixed", *GLOBAL, "train.micro_batch_size=4", "train.parallel=fsdp")
    first = torchrun(mixed, "--stop-at", "4", cwd=beside_a_clone, quiet=False)  # 2 processes x 4 examples
    assert first.returncode == 0, first.stderr[-2000:]
    assert "2 processes (fsdp)" in first.stderr and first.stderr.count("done: step 4") == 1
    assert "Warning" not in first.stderr
    a, b = weights(one, 4), weights(tmp_path / "mixed", 4)
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-5)
    write_config(tmp_path / "mixed", *GLOBAL)  # the same run, now in one process with the whole batch
    second = cli("pretrain", "--config", mixed)
    assert second.code == 0 and "(step 4)" in second.err, second.err[-2000:]
    assert "other settings" not in second.err  # 2 processes x 4 resumed as 1 x 8: the same global batch
    a, b = weights(one, 8), weights(tmp_path / "mixed", 8)
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-5)


def test_the_variables_of_a_job_set_by_mistake_are_refused_or_said_and_a_signal_ends_the_wait(tmp_path, monkeypatch):
    """RANK/WORLD_SIZE left in a shell are refused before torch loads, naming the variable; with
    MASTER_ADDR too, the wait for the other process is said, and SIGTERM and SIGINT end it (Python's
    handlers would wait for torch's rendezvous to return)."""
    import socket

    from conftest import refuse_in_fresh_interpreter

    config = write_config(tmp_path, "train.max_steps=2", "train.eval_every=0")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    for env, said in (  # the variable that is wrong, as the key fact
        ({"RANK": "1", "WORLD_SIZE": "2"}, "MASTER_ADDR and MASTER_PORT"),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two'"),
        ({"RANK": "\u00b2"}, "RANK='\u00b2'"),  # (str.isdigit says yes)
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0"),
        ({"RANK": "1"}, "RANK=1"),  # a rank other than 0 trained and wrote nothing
        ({"LOCAL_WORLD_SIZE": "abc"}, "LOCAL_WORLD_SIZE='abc'"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": " ", "MASTER_PORT": "29556"}, "MASTER_ADDR not set"),
        ({"LOCAL_WORLD_SIZE": "100000"}, "LOCAL_WORLD_SIZE=100000"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "99999"}, "MASTER_PORT='99999'"),
    ):
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        (code, imported), err = refuse_in_fresh_interpreter("pretrain", "--config", config, cwd=tmp_path)
        assert (code, imported) == ("2", "False") and len(err.splitlines()) == 1 and said in err, err
        for name in env:
            monkeypatch.delenv(name)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for signum in (signal.SIGTERM, signal.SIGINT):
        proc = subprocess.Popen(
            [sys.executable, "-m", "bertcli", "pretrain", "--config", str(config), "--device", "cpu"],
            cwd=REPO,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # (a background job's is ignored)
        )
        waiting = proc.stderr.readline()
        assert "are set, not by torchrun: waiting for the job's other processes at 127.0.0.1" in waiting, waiting
        time.sleep(1)  # inside the rendezvous
        proc.send_signal(signum)
        try:
            rest = proc.communicate(timeout=30)[1]
        finally:
            proc.kill()
        assert proc.returncode == 128 + signum, rest
        assert f"stopped by {signal.Signals(signum).name} while waiting for the job's other processes" in rest
        assert not (tmp_path / "checkpoints").exists()
