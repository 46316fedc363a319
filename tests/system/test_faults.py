"""Faults: SIGINT/SIGTERM stop cleanly with a checkpoint; a second pretrain on a folder in use refuses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, read_metrics, write_config

from bertcli import checkpoint, layout
from bertcli.model import BertForPreTraining


def start(config):
    return subprocess.Popen(
        [sys.executable, "-m", "bertcli", "pretrain", "--config", str(config), "--quiet"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _disk_with_free_blocks(monkeypatch, free: int):
    """os.statvfs, for the rest of the test, says every disk has `free` blocks free; returns the real one."""
    real = os.statvfs

    def statvfs(path):
        got = real(path)
        return os.statvfs_result((*got[:4], free, *got[5:]))

    monkeypatch.setattr(os, "statvfs", statvfs)
    return real


def says_stop(line: str, signame: str) -> bool:
    """Whether `line` is bertcli's one line of a stop by signal `signame` (not an error line)."""
    return line.startswith("bertcli: ") and not line.startswith("bertcli: error:") and signame in line


def wait_for(path, proc, seconds=120):
    deadline = time.time() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.time() < deadline
        time.sleep(0.01)


@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_signal_finishes_the_step_saves_and_says_how_to_resume(tmp_path, signum, code, cli):
    config = write_config(
        tmp_path,
        "train.max_steps=100000",
        "checkpoint.save_every=10",
        "logging.log_every=10",
        "train.data_workers=2",
        "train.batch_size=16",
        "train.micro_batch_size=8",
    )
    proc = start(config)
    wait_for(tmp_path / "checkpoints" / "step-0000010", proc)
    os.killpg(proc.pid, signum)  # as Ctrl-C or a scheduler does: to the example-building workers too
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    name = signal.Signals(signum).name
    assert f"bertcli: stopped by {name} at step" in err and "run the same command again to resume" in err
    assert "Traceback" not in err
    step = layout.list_checkpoints(tmp_path)[-1][0]
    assert step > 10 and f"at step {step};" in err, "the checkpoint is the step it stopped at"
    train = [r["step"] for r in read_metrics(tmp_path / layout.METRICS) if r["split"] == "train"]
    assert train[-1] == step, f"the steps since the last log step are logged at the stop: {train}"
    if signum != signal.SIGTERM:
        return  # resuming does not depend on the signal that stopped the run: checked once
    rerun = cli("pretrain", "--config", config, "--stop-at", step + 2)  # in this process: seconds saved
    assert rerun.code == 0 and f"(step {step})" in rerun.err, rerun.err


@pytest.mark.slow
def test_a_second_signal_stops_at_once_and_the_last_checkpoint_stays_valid(tmp_path):
    # Long steps (40 accumulated micro-batches), so that the second Ctrl-C lands inside one. The stop signals share
    # one handler (stopping.Stopper): Ctrl-C stands for them.
    signum = signal.SIGINT
    config = write_config(
        tmp_path,
        "train.max_steps=100000",
        "checkpoint.save_every=2",
        "logging.log_every=1",
        "train.batch_size=320",
        "train.micro_batch_size=8",
    )
    proc = start(config)
    wait_for(tmp_path / "checkpoints" / "step-0000002", proc)
    os.killpg(proc.pid, signum)
    time.sleep(0.05)
    os.killpg(proc.pid, signum)
    _, err = proc.communicate(timeout=120)
    name = signal.Signals(signum).name
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 128 + signum and says_stop(last, name), err
    assert "Traceback" not in err
    step, path = layout.list_checkpoints(tmp_path)[-1]
    assert f"at step {step}" not in last, "it did not wait for the step to finish"
    checkpoint.load_weights(BertForPreTraining(checkpoint.read_config(path).model), path)  # complete and loadable


def test_sigterm_while_pretrain_prepares_its_data_stops_at_once_and_keeps_nothing(tmp_path, cli):
    """A signal during `pretrain`'s own prepare stops it there (it must not go on to the end, train a
    step and write a checkpoint): exit 143, one line, no step, no data, no temporary folder. In this
    process (a real signal, sent by a thread once preparing has begun)."""
    import gzip
    import threading

    from conftest import text_run

    from bertcli.data.scan import SAMPLE

    corpus = tmp_path / "corpus.txt"  # the 1 MB sample: seconds of preparing, stopped in the first
    corpus.write_bytes(gzip.decompress(SAMPLE.read_bytes()))
    config = text_run(tmp_path, corpus)

    def send_when_preparing() -> None:
        deadline = time.time() + 60
        while not list(tmp_path.glob(".tmp-data.*")) and time.time() < deadline:
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # a late signal must not end pytest
    try:
        sender = threading.Thread(target=send_when_preparing)
        sender.start()
        result = cli("pretrain", "--config", config, "--quiet")
        sender.join()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.code == 143, result.err
    assert says_stop(result.err_lines[-1], "SIGTERM") and "bertcli: error:" not in result.err, result.err
    assert "Traceback" not in result.err and not layout.list_checkpoints(tmp_path)
    assert not list(tmp_path.glob(".tmp-*")) and not (tmp_path / "data").exists()


def test_a_stop_right_after_the_temporary_folder_is_made_leaves_nothing(tmp_path, cli, monkeypatch, small_corpus):
    """A signal raises wherever the main thread is: right after store.folder made .tmp-data.PID and
    before its `try`, nothing of its own removed it (the test above met that now and then, under load)."""
    from conftest import text_run

    config = text_run(tmp_path, small_corpus)
    real_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):
        real_mkdir(self, *args, **kwargs)
        if self.name.startswith(".tmp-data."):
            os.kill(os.getpid(), signal.SIGTERM)  # its handler runs as this returns

    monkeypatch.setattr(Path, "mkdir", mkdir)
    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # a late signal must not end pytest
    try:
        result = cli("prepare", "--config", config, "--quiet")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.code == 143, result.err
    assert not list(tmp_path.glob(".tmp-*")) and not (tmp_path / "data").exists()


def test_a_signal_during_export_is_one_line_and_leaves_nothing(tmp_path, cli, monkeypatch, trained):
    """SIGTERM while export writes: exit 143 with one line, no .tmp-OUT.PID folder (it was killed
    silently, leaving a half-written one); and the next export removes the folders that an export
    killed with SIGKILL left (its PID gone), never one holding another file."""
    import subprocess

    from bertcli import export

    real_save = export.store.save_safetensors

    def save(*args, **kwargs):
        real_save(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs as this returns

    monkeypatch.setattr(export.store, "save_safetensors", save)
    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # a late signal must not end pytest
    try:
        result = cli("export", trained, tmp_path / "out")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.code == 143 and len(result.err_lines) == 1, result.err
    assert says_stop(result.err_lines[0], "SIGTERM") and str(tmp_path / "out") in result.err, result.err
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()
    dead = subprocess.Popen(["true"])
    dead.wait()
    left, kept = tmp_path / f".tmp-out.{dead.pid}", tmp_path / f".tmp-out.{dead.pid + 1}"
    for folder in (left, kept):
        folder.mkdir()
        (folder / "config.json").write_text("{}")
    (kept / "notes.txt").write_text("mine")
    assert cli("export", trained, tmp_path / "out").code == 0
    assert sorted(os.listdir(tmp_path)) == [kept.name, "out"]


def test_an_export_or_init_that_another_wrote_meanwhile_is_not_replaced(tmp_path, cli, monkeypatch, trained):
    """Two exports (or inits) into one new target at once: both said they wrote it, and the second
    replaced the first without --force. The one that finishes second now refuses, and the first stays."""
    from bertcli import config_write, export

    out = tmp_path / "out"
    real_save = export.store.save_safetensors

    def save(*args, **kwargs):  # meanwhile, another export puts its folder in place
        real_save(*args, **kwargs)
        out.mkdir(exist_ok=True)
        (out / "config.json").write_text('{"bertcli_version": "other"}')

    monkeypatch.setattr(export.store, "save_safetensors", save)
    result = cli("export", trained, out)
    assert result.code == 2 and len(result.err_lines) == 1, result.err
    assert result.err_lines[0].startswith(f"bertcli: error: {out}") and "--force" in result.err, result.err
    assert os.listdir(out) == ["config.json"] and sorted(os.listdir(tmp_path)) == ["out"]
    assert (out / "config.json").read_text() == '{"bertcli_version": "other"}'
    real_to_yaml = config_write.to_yaml

    def to_yaml(*args, **kwargs):  # meanwhile, another init writes the config
        (tmp_path / "run").mkdir(exist_ok=True)
        (tmp_path / "run" / "config.yaml").write_text("# theirs\n")
        return real_to_yaml(*args, **kwargs)

    monkeypatch.setattr(config_write, "to_yaml", to_yaml)
    result = cli("init", tmp_path / "run")
    assert result.code == 2 and len(result.err_lines) == 1, result.err
    assert result.err_lines[0].startswith(f"bertcli: error: {tmp_path / 'run' / 'config.yaml'}"), result.err
    assert "--force" in result.err, result.err
    assert os.listdir(tmp_path / "run") == ["config.yaml"]
    assert (tmp_path / "run" / "config.yaml").read_text() == "# theirs\n"


@pytest.mark.slow
def test_a_second_pretrain_on_the_same_folder_refuses(tmp_path, cli):
    """The first pretrain is a real process; the second and third run in this one (the lock is
    between processes either way)."""
    config = write_config(tmp_path, "train.max_steps=100000", "checkpoint.save_every=20")
    first = start(config)
    wait_for(tmp_path / "checkpoints" / "step-0000020", first)
    second = cli("pretrain", "--config", config)
    assert second.code == 1 and len(second.err_lines) == 1, second.err
    assert second.err_lines[0].startswith(f"bertcli: error: {tmp_path} ") and "output_dir" in second.err, second.err
    # A crashed holder leaves no stuck lock: after SIGKILL the folder is free again.
    os.kill(first.pid, signal.SIGKILL)
    first.communicate()
    third = cli("pretrain", "--config", config, "--quiet", "--stop-at", layout.list_checkpoints(tmp_path)[-1][0] + 1)
    assert third.code == 0, third.err


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
    assert [s for s, _ in layout.list_checkpoints(tmp_path)] == [4]
    assert not list((tmp_path / "checkpoints").glob(".tmp-*")), "the half-written checkpoint is gone"
    monkeypatch.setattr(safetensors.torch, "save_file", real_save)
    again = cli("pretrain", "--config", config)  # space is back: the same command resumes (not --quiet: it says so)
    assert again.code == 0 and "resuming from" in again.err


@pytest.mark.parametrize("known", [True, False])
def test_a_disk_without_room_for_one_checkpoint_is_refused_before_any_step(tmp_path, cli, monkeypatch, known):
    """A disk without room for one checkpoint must not let the run train until its first save and lose
    the steps. Refused at the start: before the data where the model's size is known, else once the
    tokenizer is trained, before the corpus is tokenized (the lower bound without it passes here: the
    free space lies between the bound and the size)."""
    import dataclasses

    from bertcli import sizes
    from bertcli.resolve import load_run

    text = [] if known else ["data.corpus=sample", "model.vocab_size=null"]
    config = write_config(tmp_path / "run", "train.max_steps=4", "train.eval_every=0", *text)
    model = load_run(config).model
    block = os.statvfs(tmp_path).f_frsize
    if known:
        free = sizes.CHECKPOINT_BYTES_PER_PARAMETER * sizes.parameter_count(model) // 2 // block
    else:  # the lower bound, rounded up to whole blocks
        free = -(
            -sizes.CHECKPOINT_BYTES_PER_PARAMETER
            * sizes.parameter_count(dataclasses.replace(model, vocab_size=None))
            // block
        )
    _disk_with_free_blocks(monkeypatch, free)
    result = cli("pretrain", "--config", config, "--quiet")
    errors = [line for line in result.err_lines if not line.startswith("warning:")]  # (the NSP warning of sample)
    assert result.code == 1 and len(errors) == 1, result.err
    assert errors[0].startswith(f"bertcli: error: {tmp_path / 'run'}: its disk has ")
    assert "one checkpoint of this model takes about" in result.err and "set output_dir to another disk" in result.err
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "metrics.jsonl").exists()
    # (where the size waits on the tokenizer, the check comes once the vocabulary is trained, before
    # the corpus is tokenized, and nothing is kept)
    assert not (tmp_path / "run" / "data").exists()


def test_a_disk_without_room_for_the_prepared_data_is_refused_before_tokenizing(
    tmp_path, cli, monkeypatch, small_corpus
):
    """A disk without room for PREPARED_SHARE of the corpus is refused before the corpus is tokenized,
    not filled half-way through (hours in, at scale) with what was done lost."""
    from conftest import text_run

    from bertcli.data import prepare as prepare_module

    config = text_run(tmp_path / "run", small_corpus)
    block = os.statvfs(tmp_path).f_frsize
    free = int(prepare_module.PREPARED_SHARE * small_corpus.stat().st_size) // block - 1  # just short of it
    real = _disk_with_free_blocks(monkeypatch, free)
    result = cli("prepare", "--config", config, "--quiet")
    assert result.code == 1 and result.err_lines[-1].startswith(
        f"bertcli: error: {tmp_path / 'run' / 'data'}: its disk has "
    ), result.err
    assert "of corpus takes at least" in result.err and "set data.prepared_dir to another disk" in result.err
    assert not (tmp_path / "run" / "data").exists()
    monkeypatch.setattr(os, "statvfs", real)  # (the real disk has room)
    assert cli("prepare", "--config", config, "--quiet").code == 0


def test_a_disk_that_fills_while_best_is_written_leaves_the_step_checkpoint(tmp_path, cli, monkeypatch):
    """At a step that is both saved and the best so far, the step checkpoint (what resuming needs) is
    written first: a disk that fills up on `best` still leaves the run resumable from that step."""
    import errno

    import safetensors.torch

    real_save, calls = safetensors.torch.save_file, []

    def save_file(tensors, path, metadata=None):
        calls.append(path)
        if len(calls) == 2:  # the second write of step 4
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_save(tensors, path, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    config = write_config(tmp_path, "train.max_steps=8", "checkpoint.save_every=4", "train.eval_every=4")
    result = cli("pretrain", "--config", config, "--quiet")
    assert result.code == 1 and "disk full" in result.err, result.err
    assert [s for s, _ in layout.list_checkpoints(tmp_path)] == [4]
    # Space is back; the same command (here at its stop step: "nothing to do") writes the best it missed,
    # which encode and export would otherwise miss too (an older best, or none).
    monkeypatch.setattr(safetensors.torch, "save_file", real_save)
    best, step_4 = tmp_path / "checkpoints" / "best", tmp_path / "checkpoints" / "step-0000004"
    assert not best.exists()
    result = cli("pretrain", "--config", config, "--set", "train.max_steps=4", "--quiet")
    assert result.code == 0 and str(best) in result.err and "step-0000004" in result.err, result.err
    for name in layout.CHECKPOINT_FILES + layout.TOKENIZER_FILES:
        assert (best / name).exists() == (step_4 / name).exists()
        assert not (best / name).exists() or (best / name).read_bytes() == (step_4 / name).read_bytes()
    assert checkpoint.verify(best) == []
    # Another run's checkpoint was evaluated on that run's held-out set: never this run's best.
    other = write_config(tmp_path / "other", "train.max_steps=4", "checkpoint.save_every=4", "train.eval_every=4")
    for source in (best, step_4):
        result = cli("pretrain", "--config", other, "--resume", source, "--quiet")
        assert result.code == 0 and str(tmp_path / "other" / "checkpoints" / "best") not in result.err, result.err
        assert not (tmp_path / "other" / "checkpoints" / "best").exists()


def poison_losses(monkeypatch, bad_steps):
    """Make the training loss NaN at the given (1-based) steps; evaluation is left alone."""
    import torch

    from bertcli import trainer

    real, calls = trainer.pretraining_loss, []

    def pretraining_loss(*args, **kwargs):
        losses = real(*args, **kwargs)
        if not torch.is_grad_enabled():  # evaluation
            return losses
        calls.append(1)  # one micro-batch per step in these runs
        if len(calls) in bad_steps:
            return trainer.Losses(
                losses.total * float("nan"), type(losses.stats)(*(s * float("nan") for s in losses.stats))
            )
        return losses

    monkeypatch.setattr(trainer, "pretraining_loss", pretraining_loss)


def saved(folder):
    import safetensors.torch
    import torch

    weights = safetensors.torch.load_file(folder / "model.safetensors")
    adam = torch.load(folder / "training_state.pt", weights_only=True)["optimizer"]["state"]
    return weights, adam


def test_a_few_non_finite_steps_are_skipped_and_counted(tmp_path, cli, monkeypatch):
    import torch

    poison_losses(monkeypatch, {5, 6})
    config = write_config(tmp_path, "train.max_steps=12", "train.max_nonfinite_steps=3", "train.eval_every=0")
    result = cli("pretrain", "--config", config, "--quiet")
    assert result.code == 0, result.err
    records = {r["step"]: r for r in read_metrics(tmp_path / "metrics.jsonl")}
    assert [records[s]["skipped_steps"] for s in (4, 8, 12)] == [0, 2, 0]
    assert all(records[s]["loss"] is not None for s in (4, 8, 12)), "skipped steps stay out of the averages"
    weights, adam = saved(layout.list_checkpoints(tmp_path)[-1][1])
    assert all(torch.isfinite(w).all() for w in weights.values())
    assert {float(s["step"]) for s in adam.values()} == {10.0}, "12 steps, 2 skipped: Adam stepped 10 times"


def test_non_finite_steps_in_a_row_stop_the_run_and_are_never_saved(tmp_path, cli, monkeypatch):
    import torch

    poison_losses(monkeypatch, set(range(5, 100)))
    config = write_config(
        tmp_path,
        "train.max_steps=12",
        "train.max_nonfinite_steps=3",
        "checkpoint.save_every=2",
        "checkpoint.keep_last=5",
        "train.eval_every=0",
    )
    result = cli("pretrain", "--config", config, "--quiet")
    assert result.code == 1 and "Traceback" not in result.err
    last_good = tmp_path / "checkpoints" / "step-0000006"
    errors = [line for line in result.err_lines if line.startswith("bertcli: error")]
    assert len(errors) == 1 and errors[0].startswith("bertcli: error: step 7: "), result.err
    assert str(last_good) in errors[0] and "train.max_nonfinite_steps" in errors[0], result.err
    assert [s for s, _ in layout.list_checkpoints(tmp_path)] == [2, 4, 6]
    (w4, adam4), (w6, adam6) = saved(tmp_path / "checkpoints" / "step-0000004"), saved(last_good)
    assert all(torch.equal(w4[k], w6[k]) for k in w4), "the skipped steps 5 and 6 changed no weight"
    assert all(torch.equal(adam4[i][k], adam6[i][k]) for i in adam4 for k in adam4[i]), "nor Adam's state"


def test_a_run_ending_on_a_non_finite_loss_fails_without_a_final_checkpoint(tmp_path, cli, monkeypatch):
    # Fewer skipped steps than train.max_nonfinite_steps, but the last ones: the model it would end
    # with gives NaN, so the run is not "done" (a finite loss at the end is, as the test above shows).
    poison_losses(monkeypatch, {11, 12})
    config = write_config(
        tmp_path, "train.max_steps=12", "train.max_nonfinite_steps=3", "checkpoint.save_every=5", "train.eval_every=0"
    )
    result = cli("pretrain", "--config", config, "--quiet")
    assert result.code == 1 and "Traceback" not in result.err
    assert "step 12: the model's loss is NaN or inf, so the last 2 steps (steps 11-12) were skipped" in result.err
    assert [s for s, _ in layout.list_checkpoints(tmp_path)] == [5, 10]


def test_a_checkpoint_with_nan_weights_is_refused_and_nothing_is_written(tmp_path):
    import torch
    from conftest import micro_config

    from bertcli.errors import RunError
    from bertcli.model import BertForPreTraining
    from bertcli.optim import build_optimizer

    cfg = micro_config(f"output_dir={tmp_path}")
    model = BertForPreTraining(cfg.model)
    checkpoints = checkpoint.CheckpointManager(cfg, is_main=True, tokenizer={}, best=None, last=None)
    checkpoints.restore(
        None,
        torch.device("cpu"),
        model=model,
        optimizer=build_optimizer(model, cfg.optimizer),
        scaler=torch.amp.GradScaler("cpu", enabled=False),
    )
    checkpoints.save(1, {}, periodic=True)
    with torch.no_grad():
        model.bert.encoder.layer[0].attention.self.query.weight[0, 0] = float("inf")
    with pytest.raises(RunError, match="step 2: the weights or optimizer state hold NaN or inf"):
        checkpoints.save(2, {}, periodic=True)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-0000001"]


@pytest.mark.parametrize("fused", [False, True])
def test_the_optimizer_step_is_skipped_when_gradients_are_not_finite(fused):
    import torch

    from bertcli.config import OptimizerConfig
    from bertcli.optim import build_optimizer, step_if_finite

    model = torch.nn.Linear(4, 3)
    optimizer = build_optimizer(model, OptimizerConfig(), fused=fused)  # fused runs on CPU too
    scaler = torch.amp.GradScaler("cpu", enabled=False)

    def step(finite):
        model(torch.ones(2, 4)).sum().backward()
        before = [p.detach().clone() for p in model.parameters()]
        step_if_finite(optimizer, scaler, torch.tensor(finite))
        optimizer.zero_grad()
        return [not torch.equal(b, p) for b, p in zip(before, model.parameters())]

    assert step(True) == [True, True]
    state = {k: v.clone() for k, v in optimizer.state[model.weight].items()}
    assert step(False) == [False, False]
    assert all(torch.equal(state[k], optimizer.state[model.weight][k]) for k in state), "moments and step count kept"
    assert step(True) == [True, True]


def test_disk_full_during_export_names_the_file_and_fits_the_command(tmp_path, cli, monkeypatch, trained):
    import errno

    import safetensors.torch

    real_save = safetensors.torch.save_file

    def save_file(tensors, path, metadata=None):
        real_save(tensors, path, metadata=metadata)  # half-way through the export folder
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    result = cli("export", trained, tmp_path / "hf")
    assert result.code == 1 and len(result.err_lines) == 1, result.err
    line = result.err_lines[0]
    assert line.startswith(
        f"bertcli: error: {tmp_path / 'hf' / 'model.safetensors'}: disk full (No space left on device)"
    )
    assert "nothing half-written was kept" in line and "OUT_DIR" in line
    assert "checkpoint" not in line and "resume" not in line and "output_dir" not in line  # pretrain's words
    assert list(tmp_path.iterdir()) == [], "no export folder, no temporary leftovers"


class FullFile:
    """A file on a disk that fills up after `room` bytes: write() stores what fits, then fails as the
    kernel's write does (ENOSPC, no file name), and so does closing it after that (a buffered file
    flushes what it holds)."""

    def __init__(self, fh, room: int) -> None:
        self.fh, self.room, self.full = fh, room, False

    def write(self, data):
        size = len(data) if isinstance(data, str) else memoryview(data).nbytes
        if size > self.room:
            self.fh.write(data[: self.room] if isinstance(data, str) else memoryview(data).cast("B")[: self.room])
            self.room, self.full = 0, True
            raise OSError(28, "No space left on device")
        self.room -= size
        return self.fh.write(data)

    def close(self) -> None:
        self.fh.close()
        if self.full:
            raise OSError(28, "No space left on device")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getattr__(self, name):
        return getattr(self.fh, name)


def fill_disk(monkeypatch, module, room: int = 100, only: str = "") -> None:
    """Files that `module` opens for writing (named ending in `only`) lie on a disk with `room` bytes left."""
    import builtins

    def full_open(path, mode="r", *args, **kwargs):
        fh = builtins.open(path, mode, *args, **kwargs)
        return FullFile(fh, room) if any(m in mode for m in "wa") and str(path).endswith(only) else fh

    monkeypatch.setattr(module, "open", full_open, raising=False)


@pytest.mark.parametrize(
    "name", ["model.safetensors", "training_state.pt", "config.yaml", "trainer_state.json", "vocab.txt"]
)
def test_a_full_disk_while_saving_a_checkpoint_names_the_file_whatever_writes_it(tmp_path, monkeypatch, name):
    """Each library words a full disk its own way (safetensors in Rust's words, torch.save as
    "unexpected pos", a file's write() naming no file): every one
    becomes the same line, naming the file."""
    import pathlib

    import safetensors
    import safetensors.torch
    import torch
    from conftest import micro_config

    from bertcli import store
    from bertcli.cli import os_error_message
    from bertcli.optim import build_optimizer

    cfg = micro_config(f"output_dir={tmp_path}")
    model = BertForPreTraining(cfg.model)
    vocab = {"vocab.txt": b"[PAD]\n"}  # the tokenizer files' bytes, read when training starts
    checkpoints = checkpoint.CheckpointManager(cfg, is_main=True, tokenizer=vocab, best=None, last=None)
    checkpoints.restore(
        None,
        torch.device("cpu"),
        model=model,
        optimizer=build_optimizer(model, cfg.optimizer),
        scaler=torch.amp.GradScaler("cpu", enabled=False),
    )
    checkpoints.save(1, {}, periodic=True)
    if name == "model.safetensors":
        real_save = safetensors.torch.save_file

        def save_file(tensors, path, metadata=None):
            real_save(tensors, path, metadata=metadata)
            raise safetensors.SafetensorError(
                "Error while serializing: I/O error: No space left on device (os error 28)"
            )

        monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    elif name == "training_state.pt":
        fill_disk(monkeypatch, store, room=600)  # torch.save's own words: "unexpected pos 640 vs 534"
    else:  # store.write_inside: config.yaml, trainer_state.json, the tokenizer's files
        real_write_bytes = pathlib.Path.write_bytes

        def write_bytes(self, data):
            if self.name == name:
                real_write_bytes(self, data[:1])
                raise OSError(28, "No space left on device")  # a write() names no file
            return real_write_bytes(self, data)

        monkeypatch.setattr(pathlib.Path, "write_bytes", write_bytes)
    with pytest.raises(OSError) as info:
        checkpoints.save(2, {}, periodic=True)
    root = tmp_path / "checkpoints"
    line = os_error_message(info.value, "pretrain")
    assert info.value.errno == 28 and line.startswith(f"{root / 'step-0000002' / name}: disk full"), line
    assert "output_dir" in line, line  # the setting to write elsewhere
    assert sorted(p.name for p in root.iterdir()) == ["step-0000001"], "no temporary folder is left"


def test_a_file_size_limit_is_one_line_naming_the_file(tmp_path, small_corpus, trained):
    """`ulimit -f` (EFBIG; Python ignores SIGXFSZ) must not give a bare "bertcli: error: File too large"
    naming no file: worded as a full disk is, naming the file, in prepare (the tokenizer's own Rust
    words too) and in encode --output; nothing half-written is left."""
    import resource

    from conftest import run_process, text_run

    def limit() -> None:  # (in the child only)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, resource.RLIM_INFINITY))

    config = text_run(tmp_path / "run", small_corpus)
    prepared = run_process("prepare", "--config", config, "--quiet", preexec_fn=limit)
    lines = prepared.stderr.splitlines()
    assert prepared.returncode == 1 and len(lines) == 1 and "Traceback" not in prepared.stderr, prepared.stderr
    assert lines[0].startswith(f"bertcli: error: {tmp_path / 'run' / 'data'}") and ": file too large" in lines[0]
    assert "data.prepared_dir" in lines[0]  # the setting to write elsewhere
    assert not (tmp_path / "run" / "data").exists() and not list((tmp_path / "run").glob(".tmp-*"))

    (tmp_path / "in.txt").write_text("a line of text\n" * 400)
    out = tmp_path / "v.jsonl"
    encoded = run_process("encode", "--model", trained, tmp_path / "in.txt", "-o", out, preexec_fn=limit)
    lines = encoded.stderr.splitlines()
    assert encoded.returncode == 1 and len(lines) == 1, encoded.stderr
    assert lines[0].startswith(f"bertcli: error: {out}: file too large") and "--output" in lines[0], encoded.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "run"]  # no v.jsonl, no temporary file


def test_a_full_disk_while_best_is_caught_up_names_best_not_the_checkpoint_copied(tmp_path, monkeypatch):
    """Resuming copies a step evaluated best into `best` when the run stopped before it did; a full disk
    there must name `best`'s file, not the intact step's (shutil.copyfile's error names its source)."""
    import shutil

    import torch
    from conftest import micro_config

    from bertcli import resume
    from bertcli.cli import os_error_message
    from bertcli.optim import build_optimizer

    cfg = micro_config(f"output_dir={tmp_path}")
    model = BertForPreTraining(cfg.model)
    cm = checkpoint.CheckpointManager(cfg, is_main=True, tokenizer={"vocab.txt": b"[PAD]\n"}, best=None, last=None)
    cm.restore(
        None,
        torch.device("cpu"),
        model=model,
        optimizer=build_optimizer(model, cfg.optimizer),
        scaler=torch.amp.GradScaler("cpu", enabled=False),
    )
    cm.save(1, {"eval_metrics": {"mlm_loss": 5.0}}, periodic=True)  # the step, and best
    root = tmp_path / "checkpoints"
    shutil.rmtree(root / "best")  # as if stopped before best was written

    def full_copy(src, dst, **kwargs):
        raise OSError(28, "No space left on device", str(src))  # as copyfile words it: the source's name

    monkeypatch.setattr(resume.shutil, "copyfile", full_copy)
    with pytest.raises(OSError) as info:
        resume.choose(cfg, "auto", is_main=True, last_step=cfg.train.max_steps, tokenizer=None)
    line = os_error_message(info.value, "pretrain")
    assert line.startswith(f"{root / 'best' / 'model.safetensors'}: disk full"), line
    assert sorted(p.name for p in root.iterdir()) == ["step-0000001"], "no temporary folder is left"


class FullOnClose(FullFile):
    """A file whose writes fit in its buffer, and whose closing flushes them into a full disk."""

    def write(self, data):
        return self.fh.write(data)

    def close(self) -> None:
        self.fh.close()
        raise OSError(28, "No space left on device")


@pytest.mark.parametrize("what", ["prepared shards", "prepared index", "metrics.jsonl", "init's config"])
def test_a_full_disk_while_writing_data_names_the_file(tmp_path, monkeypatch, cli, small_corpus, what):
    import builtins

    import numpy as np
    from conftest import text_run

    from bertcli import metrics, store
    from bertcli.cli import os_error_message
    from bertcli.data import units

    if what == "prepared index":  # written by prepare's own process, closed full: it named no file
        config = text_run(tmp_path / "run", small_corpus)

        def full_open(path, mode="r", *args, **kwargs):
            fh = builtins.open(path, mode, *args, **kwargs)
            full = "w" in mode and "/index/" in str(path) and str(path).endswith("doc_offsets.bin")
            return FullOnClose(fh, 0) if full else fh

        monkeypatch.setattr(units, "open", full_open, raising=False)
        result = cli("prepare", "--config", config, "--quiet")
        index = tmp_path / "run" / "data" / "index"
        assert result.code == 1 and len(result.err_lines) == 1, result.err
        assert result.err.startswith(f"bertcli: error: {index}/") and "/train/doc_offsets.bin: disk full" in result.err
        assert not (tmp_path / "run" / "data").exists(), "nothing half-written is left"
        return

    if what == "init's config":
        fill_disk(monkeypatch, store, room=0)
        (tmp_path / "mine").mkdir()
        (tmp_path / "mine" / "notes.txt").write_text("my notes\n")
        for folder in (tmp_path / "run", tmp_path / "mine" / "new" / "run", tmp_path / "mine"):
            result = cli("init", folder)
            assert result.code == 1 and len(result.err_lines) == 1, result.err
            assert result.err_lines[0].startswith(f"bertcli: error: {folder / 'config.yaml'}: disk full"), result.err
        # Nothing half-made is left: the folders init made are gone, the one that was there is kept as it was.
        assert sorted(os.listdir(tmp_path)) == ["mine"] and os.listdir(tmp_path / "mine") == ["notes.txt"]
        return
    with pytest.raises(OSError) as info:
        if what == "prepared shards":  # ndarray.tofile said "65540 requested and 28645 written"
            fill_disk(monkeypatch, units, room=1000)
            writer = units.ShardWriter(tmp_path / ".tmp-data.123" / "train", np.dtype(np.uint16))
            writer.add_segment(list(range(units.ShardWriter.FLUSH_TOKENS)))
        else:
            fill_disk(monkeypatch, metrics, room=10)
            logger = metrics.MetricsLogger(tmp_path, 0, 10, tensorboard=False, quiet=True)
            logger.log(1, {"loss": 1.0})
    where = tmp_path / "data" / "train" / "tokens.bin" if what == "prepared shards" else tmp_path / "metrics.jsonl"
    line = os_error_message(info.value, "prepare")
    assert info.value.errno == 28 and line.startswith(f"{where}: disk full"), line


@pytest.mark.parametrize("suffix", ["npy", "jsonl"])
def test_a_full_disk_while_encoding_names_the_output_and_leaves_nothing(tmp_path, monkeypatch, cli, trained, suffix):
    from bertcli import encode_io

    lines = tmp_path / "in.txt"
    lines.write_text("a line of text\n" * 40)
    out = tmp_path / "out" / f"vecs.{suffix}"
    out.parent.mkdir()
    fill_disk(monkeypatch, encode_io, room=3000)
    result = cli("encode", "--model", trained, lines, "--output", out)
    assert result.code == 1 and len(result.err_lines) == 1, result.err
    assert result.err_lines[0].startswith(f"bertcli: error: {out}: disk full") and "--output" in result.err
    assert os.listdir(out.parent) == [], "no temporary file is left"


def test_a_full_disk_under_rows_on_stdout_says_they_are_incomplete(tmp_path, trained):
    """Rows on stdout stay where a full disk cut them (hundreds of rows and half a row are there): the
    line must not say that nothing half-written was kept, and names stdout, not --output."""
    lines = tmp_path / "in.txt"
    lines.write_text("a line of text\n" * 3000)
    with open("/dev/full", "w") as full:  # every write: ENOSPC
        command = [sys.executable, "-m", "bertcli", "encode", "--model", str(trained), str(lines)]
        result = subprocess.run(command, cwd=REPO, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    lines = result.stderr.splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith("bertcli: error: stdout: disk full") and "incomplete" in lines[0], result.stderr
    assert "--output" in lines[0], result.stderr  # the way to keep nothing half-written
    # --output the device itself: no advice to use --output; inspect's report on stdout: named
    device = subprocess.run([*command, "--output", "/dev/full"], cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = device.stderr.splitlines()
    assert device.returncode == 1 and len(lines) == 1, device.stderr
    assert lines[0].startswith("bertcli: error: /dev/full: disk full") and "incomplete" in lines[0], device.stderr
    assert "--output" not in lines[0], device.stderr
    with open("/dev/full", "w") as full:
        inspect = [sys.executable, "-m", "bertcli", "inspect", str(trained)]
        result = subprocess.run(inspect, cwd=REPO, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    lines = result.stderr.splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith("bertcli: error: stdout: disk full") and "incomplete" in lines[0], result.stderr


def test_prepare_and_pretrain_never_work_on_one_run_at_once(tmp_path, cli, small_corpus):
    """prepare takes the run's lock: under a running pretrain it would replace the data being trained on."""
    from conftest import text_run

    from bertcli import store

    config = text_run(tmp_path, small_corpus)
    before = sorted(p.name for p in tmp_path.iterdir())
    with store.run_lock(tmp_path):  # flock: another open of the file conflicts, in this process too
        result = cli("prepare", "--config", config, "--quiet")
    assert result.code == 1 and len(result.err_lines) == 1, result.err
    assert result.err_lines[0].startswith(f"bertcli: error: {tmp_path} "), result.err
    assert not (tmp_path / "data").exists()
    with store.run_lock(tmp_path):
        result = cli("pretrain", "--config", config, "--quiet")
    assert result.code == 1 and result.err_lines[-1].startswith(f"bertcli: error: {tmp_path} "), result.err
    assert [line for line in result.err_lines if line.startswith("bertcli: error:")] == result.err_lines[-1:]
    # Nothing was written but the lock file, which stays (filelock: it is free again once released).
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != layout.LOCK) == before


def _sharing_runs(tmp_path, small_corpus):
    """Two runs (other output_dirs, other corpora) whose configs name one prepared folder."""
    from conftest import text_run

    other = tmp_path / "other.txt"
    other.write_text(small_corpus.read_text().replace("Python", "Snake"))
    shared = tmp_path / "shared-data"
    return (
        text_run(tmp_path / "a", small_corpus, f"data.prepared_dir={shared}", "train.max_steps=1"),
        text_run(tmp_path / "b", other, f"data.prepared_dir={shared}", "train.max_steps=1"),
        shared,
    )


def test_runs_sharing_prepared_data_never_replace_it_under_each_other(tmp_path, cli, small_corpus, monkeypatch):
    """The prepared folder has a lock of its own, beside it (the folder is replaced whole, by a rename): a
    prepare of another run (another output_dir) is refused while a prepare or a pretrain's start holds it."""
    from bertcli import store, trainer
    from bertcli.errors import RunError

    a, b, shared = _sharing_runs(tmp_path, small_corpus)
    with store.prepared_lock(shared):
        result = cli("prepare", "--config", b, "--quiet")
        assert result.code == 1 and len(result.err_lines) == 1, result.err
        assert result.err_lines[0].startswith("bertcli: error: ") and str(shared) in result.err, result.err
        assert "data.prepared_dir" in result.err, result.err  # the setting to use another folder
        assert not shared.exists()
        assert cli("pretrain", "--config", a, "--quiet").code == 1
    refused = []
    real = trainer.load_data

    def load_data(*args, **kwargs):  # pretrain's start: another run's prepare tries to take the folder now
        data = real(*args, **kwargs)
        try:
            with store.prepared_lock(shared):
                refused.append(False)
        except RunError:
            refused.append(True)
        return data

    monkeypatch.setattr(trainer, "load_data", load_data)
    assert cli("pretrain", "--config", a, "--quiet").code == 0
    assert refused == [True]
    with store.prepared_lock(shared):  # released once pretrain started: the lock file left there holds nothing
        pass


def test_preparing_again_says_what_differs_from_the_data_there(tmp_path, cli, small_corpus):
    """Prepared data made from other inputs (another config sharing the folder, an edit) is prepared again
    with a line saying what differs, not silently."""
    a, b, shared = _sharing_runs(tmp_path, small_corpus)
    assert cli("prepare", "--config", a, "--quiet").code == 0
    result = cli("prepare", "--config", b, "--quiet")
    assert result.code == 0, result.err
    # One line names the folder and what differs: the corpus it was made from, and this config's.
    said = [line for line in result.err_lines if str(shared) in line and str(small_corpus) in line]
    assert [line for line in said if str(tmp_path / "other.txt") in line], result.err
    result = cli("prepare", "--config", b, "--quiet", "--set", "data.tokenizer.vocab_size=900")
    said = [line for line in result.err_lines if str(shared) in line and "data.tokenizer.vocab_size" in line]
    assert result.code == 0 and [line for line in said if "1000" in line and "900" in line], result.err


def test_a_checkpoint_holds_the_tokenizer_its_model_was_trained_with(tmp_path, cli, trained, monkeypatch):
    """The tokenizer files are read once, when training starts: a prepared folder replaced meanwhile (by a
    prepare of another run sharing it, say) changes neither the ids trained on nor the checkpoints' tokenizer."""
    import shutil

    from bertcli import trainer

    run = tmp_path / "run"
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns("checkpoints", "metrics.jsonl", "tensorboard"))
    files = {name: (run / "data" / name).read_bytes() for name in ("tokenizer.json", "vocab.txt")}
    real = trainer.train_step

    def train_step(state, step, *args, **kwargs):
        if step == 0:
            (run / "data" / "tokenizer.json").write_text('{"another": "tokenizer"}\n')
            (run / "data" / "vocab.txt").write_text("[PAD]\n[UNK]\n")
        return real(state, step, *args, **kwargs)

    monkeypatch.setattr(trainer, "train_step", train_step)
    result = cli("pretrain", "--config", run / "config.yaml", "--quiet", "--set", "train.max_steps=2")
    assert result.code == 0, result.err
    for name, contents in files.items():
        assert (run / "checkpoints" / "step-0000002" / name).read_bytes() == contents, name


# ------------------------------------------------------------------ prepare on several processes, in place (issue 20)


def _prepare_process(config, *args: str) -> subprocess.Popen:
    """`bertcli prepare` in a process of its own session, with units of 8 KiB (so that a small corpus
    is dozens of units, and two workers run)."""
    code = (
        "import sys; from bertcli.data import prepare; from bertcli.data import scan; scan.UNIT_BYTES = 8 << 10; "
        "from bertcli.cli import main; main(sys.argv[1:])"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, "prepare", "--config", str(config), *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # As from a terminal: a shell's background job (`pytest &`) starts with SIGINT ignored, and
        # prepare keeps an ignored signal ignored (nohup's contract), so Ctrl-C would not be tested.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return [int(p) for p in fh.read().split()]


def _gone(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie that this container's init has not reaped yet counts)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_a_signal_stops_prepare_and_its_workers_at_once(tmp_path, small_corpus, signum, code):
    """To the whole process group, as Ctrl-C or a scheduler sends it: the workers end, their temporary
    units go with the temporary folder, and the one line says nothing was kept."""
    from conftest import text_run

    config = text_run(tmp_path, small_corpus, "data.validation_fraction=0.25")  # units of about 4 documents
    proc = _prepare_process(config, "--workers", "2")
    deadline = time.time() + 120
    while not list(tmp_path.glob(".tmp-data.*/units/*")):  # the workers are preparing units
        assert proc.poll() is None, proc.communicate()[1]
        assert time.time() < deadline
        time.sleep(0.01)
    workers = _children(proc.pid)
    assert len(workers) >= 2, workers  # (a resource tracker may be a child too)
    stopped = time.time()
    os.killpg(proc.pid, signum)
    _, err = proc.communicate(timeout=60)
    assert time.time() - stopped < 10, "it did not stop at once"
    assert proc.returncode == code, err
    assert says_stop(err.strip().splitlines()[-1], signal.Signals(signum).name), err
    assert "Traceback" not in err and "bertcli: error:" not in err, err
    # The workers end with the command; multiprocessing's resource tracker once its pipe closes, at once after.
    while not all(_gone(pid) for pid in workers) and time.time() - stopped < 10:
        time.sleep(0.05)
    assert all(_gone(pid) for pid in workers)
    assert not list(tmp_path.glob(".tmp-*")) and not (tmp_path / "data").exists()


def test_a_kill_while_updating_leaves_the_previous_data_valid_and_the_next_prepare_goes_on(
    tmp_path, small_corpus, monkeypatch, capsys
):
    import json

    from conftest import text_run

    from bertcli.data import scan as scan_module
    from bertcli.data.prepare import prepare
    from bertcli.data.prepared import load_prepared
    from bertcli.resolve import load_run

    monkeypatch.setattr(scan_module, "UNIT_BYTES", 8 << 10)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    docs = small_corpus.read_text().split("\n\n")
    (corpus / "a.txt").write_text("\n\n".join(docs[:40] + docs[50:]) + "\n")
    config = text_run(tmp_path, corpus, "data.validation_fraction=0.25")  # units of about 4 documents
    data = prepare(load_run(config), quiet=True)
    manifest = (data / "manifest.json").read_bytes()
    (corpus / "b.txt").write_text("\n\n".join(docs[40:50]) + "\n")  # 30% of the corpus: the tokenizer is kept
    proc = _prepare_process(config, "--workers", "2")
    known = {u["key"] for u in json.loads(manifest)["units"]}
    deadline = time.time() + 120
    while not [p for p in (data / "units").iterdir() if p.name not in known and not p.name.startswith(".")]:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.time() < deadline
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    _, err = proc.communicate()
    assert (data / "manifest.json").read_bytes() == manifest, err
    load_prepared(data)  # the previous data: whole, every file checked
    capsys.readouterr()
    prepare(load_run(config), quiet=True)
    err = capsys.readouterr().err
    new = json.loads((data / "manifest.json").read_text())["units"]
    assert "preparing" in err and f"of {len(new)} units" in err
    prepared_now = int(err.split("preparing ")[1].split(" of")[0])
    assert prepared_now < len(new) - len(known), "the units the killed prepare finished are kept"
    assert not list(data.rglob(".tmp-*")) and not list(tmp_path.glob(".tmp-*"))
    load_prepared(data)


def test_an_incomplete_newest_checkpoint_is_said_and_set_aside(tmp_path, cli):
    """A step folder lacking files (a copy cut short) newer than the good checkpoints was skipped
    silently: now it is damage like any other, and `inspect` calls it a checkpoint, not a run."""
    import shutil

    config = write_config(tmp_path, "train.max_steps=4", "checkpoint.save_every=4", "train.eval_every=0")
    assert cli("pretrain", "--config", config, "--quiet").code == 0
    cut = tmp_path / "checkpoints" / "step-0000009"
    cut.mkdir()
    shutil.copyfile(tmp_path / "checkpoints" / "step-0000004" / "config.yaml", cut / "config.yaml")
    missing = ["model.safetensors", "training_state.pt", "trainer_state.json"]
    for result in (cli("inspect", cut), cli("export", cut, tmp_path / "hf")):
        assert result.code == 2 and len(result.err_lines) == 1, result.err
        assert result.err_lines[0].startswith(f"bertcli: error: {cut}: "), result.err
        assert all(name in result.err for name in missing), result.err  # what it lacks
    assert not (tmp_path / "hf").exists()
    result = cli("pretrain", "--config", config, "--set", "train.max_steps=6")
    assert result.code == 0, result.err
    said = [line for line in result.err_lines if line.startswith(f"{cut} ")]
    assert len(said) == 1 and all(name in said[0] for name in missing), result.err
    assert "damaged-step-0000009" in said[0] and str(tmp_path / "checkpoints" / "step-0000004") in said[0]
    assert [s for s, _ in layout.list_checkpoints(tmp_path)][-1] == 6
    assert (tmp_path / "checkpoints" / "damaged-step-0000009" / "config.yaml").is_file()


def test_a_diverged_run_never_makes_a_best_checkpoint_of_a_nan_loss(tmp_path, cli):
    """A huge optimizer.lr makes every held-out loss NaN: the first evaluation must not be saved as
    `best` (nothing to compare with), which export would then publish."""
    import json

    config = write_config(
        tmp_path,
        "train.max_steps=4",
        "train.eval_every=2",
        "optimizer.lr=1e8",
        "optimizer.warmup_steps=0",
        "optimizer.weight_decay=0",
    )
    result = cli("pretrain", "--config", config, "--quiet")
    assert "Traceback" not in result.err
    best = tmp_path / "checkpoints" / "best"
    if best.exists():  # (a loss that stayed finite at step 2 may be best: never a NaN one)
        loss = json.loads((best / "trainer_state.json").read_text())["eval_metrics"]["mlm_loss"]
        assert loss == loss, "best holds a NaN held-out loss"
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("split") == "eval" and r.get("mlm_loss", 0) is None for r in records), (  # NaN is null there
        "the run did not diverge: the test proves nothing"
    )


@pytest.mark.parametrize("damage", ["empty config.yaml", "extra tensor", "another step's folder"])
def test_more_damage_to_the_newest_checkpoint_falls_back_to_the_one_before(tmp_path, cli, damage):
    """An empty config.yaml (not to be read as the defaults, which would blame the user's settings), an
    extra tensor in the weights (of a checkpoint without the SHA-256 record) or another step's folder
    under the newest name is damage like any other: the resume falls back to the checkpoint before."""
    import safetensors.torch
    import torch
    from conftest import without_file_hashes

    config = write_config(tmp_path, "train.max_steps=4", "checkpoint.save_every=2", "train.eval_every=0")
    assert cli("pretrain", "--config", config, "--quiet").code == 0
    newest = tmp_path / "checkpoints" / "step-0000004"
    if damage == "empty config.yaml":
        (newest / "config.yaml").write_text("")
        facts = ["config.yaml"]
    elif damage == "another step's folder":  # a copy under a later step's name must not be resumed by its name
        import shutil

        shutil.rmtree(newest)
        shutil.copytree(tmp_path / "checkpoints" / "step-0000002", newest)
        facts = ["trainer_state.json", "step 2"]
    else:
        weights = safetensors.torch.load_file(newest / "model.safetensors")
        safetensors.torch.save_file(weights | {"secret.payload": torch.zeros(3)}, newest / "model.safetensors")
        without_file_hashes(newest)
        facts = ["model.safetensors", "secret.payload"]
    damaged = {p.name: p.read_bytes() for p in newest.iterdir()}
    result = cli("pretrain", "--config", config, "--set", "train.max_steps=6")
    assert result.code == 0, result.err
    said = [line for line in result.err_lines if line.startswith(f"{newest} ")]
    assert len(said) == 1 and all(fact in said[0] for fact in facts), result.err
    step_2 = tmp_path / "checkpoints" / "step-0000002"
    assert f"{step_2} (step 2)" in result.err, result.err  # resumed from the checkpoint before
    # Set aside, as it was (bertcli never deletes it); the run went on from step 2 to step 6.
    aside = tmp_path / "checkpoints" / f"{layout.DAMAGED_PREFIX}step-0000004"
    assert {p.name: p.read_bytes() for p in aside.iterdir()} == damaged
    assert [s for s, _ in layout.list_checkpoints(tmp_path)][-1] == 6


def test_a_signal_during_an_evaluation_stops_there_with_a_checkpoint(tmp_path, cli, monkeypatch):
    """A SIGTERM during an evaluation must not wait for the whole evaluation and one more step (minutes
    at scale): the evaluation ends at its next batch and the run saves and stops."""
    import json

    import torch

    from bertcli import trainer

    real, sent = trainer.pretraining_loss, []

    def pretraining_loss(*args, **kwargs):
        if not torch.is_grad_enabled() and not sent:  # the first held-out batch: a scheduler's SIGTERM
            sent.append(1)
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "pretraining_loss", pretraining_loss)
    config = write_config(
        tmp_path, "train.max_steps=8", "train.eval_every=4", "checkpoint.save_every=100", "logging.log_every=3"
    )
    result = cli("pretrain", "--config", config, "--quiet")
    assert result.code == 143 and "stopped by SIGTERM at step 4" in result.err, result.err
    assert [s for s, _ in layout.list_checkpoints(tmp_path)] == [4]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert not [r for r in records if r.get("split") == "eval"], "the interrupted evaluation is not logged"
    assert [r["step"] for r in records] == [3, 4], "the steps since the last log step are, at the stop"
    saved = json.loads((tmp_path / "checkpoints" / "step-0000004" / "trainer_state.json").read_text())
    assert saved["metrics"] == {k: v for k, v in records[-1].items() if k not in ("step", "split")}


@pytest.mark.parametrize("command", ["pretrain", "encode"])
def test_a_signal_while_torch_loads_stops_with_one_line(tmp_path, cli, trained, monkeypatch, command):
    """SIGTERM in a command's first seconds (torch's import, the model's load) must not kill it by the
    signal's default action (exit 143, no line): one line says the stop. The signal is sent where those run."""
    import signal

    import bertcli.encode
    import bertcli.preflight

    def signalled(real):
        def run(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)
            return real(*args, **kwargs)

        return run

    before = sorted(p.relative_to(trained) for p in trained.rglob("*"))
    if command == "pretrain":
        monkeypatch.setattr(bertcli.preflight, "pretrain", signalled(bertcli.preflight.pretrain))
        result = cli("pretrain", "--config", trained / "config.yaml", "--set", "train.max_steps=6")
    else:
        monkeypatch.setattr(bertcli.encode, "load_encoder", signalled(bertcli.encode.load_encoder))
        (tmp_path / "in.txt").write_text("hello\n")
        result = cli("encode", "--model", trained, tmp_path / "in.txt", "-o", tmp_path / "v.npy")
        assert os.listdir(tmp_path) == ["in.txt"]  # no v.npy, no temporary file
    assert result.code == 143 and len(result.err_lines) == 1, result.err
    assert says_stop(result.err_lines[0], "SIGTERM"), result.err
    assert sorted(p.relative_to(trained) for p in trained.rglob("*")) == before  # no step trained, nothing written


def test_a_run_that_fails_before_it_logs_leaves_no_event_file(tmp_path, cli, monkeypatch):
    """A failed attempt must not leave an event file holding only a header in tensorboard/ (one more per
    attempt), nor on a fresh run the folder itself: they are removed; what a run logged stays."""
    from bertcli import trainer
    from bertcli.errors import RunError

    config = write_config(tmp_path, "train.max_steps=2", "logging.log_every=1", "checkpoint.save_every=2")
    board = tmp_path / layout.TENSORBOARD
    real = trainer.train_step
    fail_at = {"step": 0}

    def train_step(run, step, *args, **kwargs):
        if step == fail_at["step"]:
            raise RunError(f"step {step}: out of memory (made up)")
        return real(run, step, *args, **kwargs)

    monkeypatch.setattr(trainer, "train_step", train_step)
    failed = cli("pretrain", "--config", config, "--quiet")
    assert failed.code == 1 and "out of memory (made up)" in failed.err, failed.err
    assert not board.exists(), list(board.iterdir())
    fail_at["step"] = 2  # the first step of the resume below
    assert cli("pretrain", "--config", config, "--quiet").code == 0
    logged = sorted(board.iterdir())
    assert len(logged) == 1 and logged[0].stat().st_size > 200, logged  # the scalars of steps 1-2
    failed = cli("pretrain", "--config", config, "--quiet", "--set", "train.max_steps=4")
    assert failed.code == 1 and "out of memory (made up)" in failed.err, failed.err
    assert sorted(board.iterdir()) == logged
