"""Training: outputs, exact resume, resume modes, crash-safety, precisions, learning."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
import safetensors.torch
import torch
from conftest import micro_config, read_metrics, read_yaml, text_run, without_file_hashes, write_config

from bertcli import checkpoint, layout, resume, runtime
from bertcli.config_load import load_config
from bertcli.data.corpus import synthetic_corpus
from bertcli.errors import UsageError
from bertcli.hf_names import TIED_ALIASES
from bertcli.model import BertForPreTraining
from bertcli.optim import lr_at
from bertcli.resolve import load_run
from bertcli.trainer import pretrain

NO_DROPOUT = ["model.hidden_dropout_prob=0", "model.attention_probs_dropout_prob=0"]


def train(folder: Path, *overrides: str, resume: str = "auto", stop_at: int | None = None) -> dict:
    path = write_config(folder, *overrides)
    return pretrain(load_run(path), resume=resume, quiet=True, stop_at=stop_at)


def weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(ckpt / "model.safetensors")


def assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


def test_run_writes_metrics_tensorboard_and_checkpoints(tmp_path):
    result = train(tmp_path)  # 12 steps, log every 4, save every 4, keep 2
    assert result["step"] == 12
    records = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "train"]
    assert [r["step"] for r in records] == [4, 8, 12]
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "eval"] == [12]
    for key in ("loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc", "lr", "grad_norm", "tokens_per_s"):
        assert all(isinstance(r[key], float) and math.isfinite(r[key]) for r in records), key
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert [s for s, _ in layout.list_checkpoints(tmp_path)] == [8, 12]  # keep_last 2
    ckpt = tmp_path / "checkpoints" / "step-0000012"
    stored = weights(ckpt)
    with safetensors.safe_open(ckpt / "model.safetensors", "pt") as f:  # one key: the bytes of the same weights
        assert f.metadata() == {"format": "pt"}  # are the same (safetensors orders a map at random)
    model = BertForPreTraining(micro_config().model)
    assert set(stored) == set(model.state_dict()) - set(TIED_ALIASES)  # Hugging Face names, no tied copies
    state = torch.load(ckpt / "training_state.pt", weights_only=True)  # nothing but tensors and containers
    assert state["step"] == 12 and state["optimizer"]["state"]
    trainer_state = json.loads((ckpt / "trainer_state.json").read_text())
    assert trainer_state["step"] == 12 and trainer_state["tokens_seen"] > 12 * 8 * 5
    assert load_config(ckpt / "config.yaml") == load_run(tmp_path / "config.yaml")  # the resolved config


def test_exact_resume_is_bitwise_identical(tmp_path):
    """2N steps in one go == N steps, stop, resume for N more (CPU, fp32, dropout on). The second
    half builds its examples in 2 worker processes: they must not change a bit either."""
    train(tmp_path / "one_go")
    train(tmp_path / "two_halves", stop_at=6)
    assert [s for s, _ in layout.list_checkpoints(tmp_path / "two_halves")][-1] == 6
    result = train(tmp_path / "two_halves", "train.data_workers=2")
    assert result["step"] == 12
    a, b = (
        tmp_path / "one_go" / "checkpoints" / "step-0000012",
        tmp_path / "two_halves" / "checkpoints" / "step-0000012",
    )
    assert_bitwise_equal(weights(a), weights(b))
    opt_a = torch.load(a / "training_state.pt", weights_only=True)["optimizer"]["state"]
    opt_b = torch.load(b / "training_state.pt", weights_only=True)["optimizer"]["state"]
    for i in opt_a:
        assert torch.equal(opt_a[i]["exp_avg"], opt_b[i]["exp_avg"])
        assert torch.equal(opt_a[i]["exp_avg_sq"], opt_b[i]["exp_avg_sq"])
    assert (
        json.loads((a / "trainer_state.json").read_text())["tokens_seen"]
        == json.loads((b / "trainer_state.json").read_text())["tokens_seen"]
    )
    # metrics.jsonl of the resumed run has each step once, in order
    for split in ("train", "eval"):
        steps = [r["step"] for r in read_metrics(tmp_path / "two_halves" / "metrics.jsonl") if r["split"] == split]
        assert steps == sorted(set(steps)) and steps[-1] == 12


def test_resume_modes(tmp_path):
    train(tmp_path, stop_at=8)
    with pytest.raises(UsageError, match="--resume never"):
        train(tmp_path, resume="never")
    older = tmp_path / "checkpoints" / "step-0000004"
    result = train(tmp_path, resume=str(older), stop_at=6)
    assert result["step"] == 6
    with pytest.raises(UsageError, match="no such checkpoint"):
        train(tmp_path, resume=str(tmp_path / "nowhere"))
    with pytest.raises(UsageError) as info:
        train(tmp_path, "model.hidden_size=64")
    assert "model.hidden_size=32 in the checkpoint vs 64 in the config" in str(info.value)
    assert "new folder" in str(info.value)


def test_resuming_past_the_requested_end_has_nothing_to_do(tmp_path, cli, monkeypatch):
    from bertcli import trainer

    train(tmp_path, stop_at=8)
    before = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())

    def no_model(*args, **kwargs):  # said before the model is built (half of the 6.5 s it took)
        raise AssertionError("a model was built for a run with nothing to do")

    monkeypatch.setattr(trainer, "BertForPreTraining", no_model)
    result = train(tmp_path, "train.max_steps=4")  # below the checkpoint's step
    assert result["step"] == 8 and result["checkpoint"].endswith("step-0000008")
    for args in (["--stop-at", "6"], ["--set", "train.max_steps=5"], ["--stop-at", "8"]):
        out = cli("pretrain", "--config", tmp_path / "config.yaml", "--quiet", *args)
        assert out.code == 0, out.err
        assert "nothing to do" in out.err and "already at step 8" in out.err and "done: step 8" in out.err
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == before


def test_sizes_that_cannot_fit_are_refused_with_the_figure(monkeypatch):
    from bertcli import runtime, sizes

    cfg = micro_config()
    rt = runtime.Runtime(device=torch.device("cpu"), precision="fp32")
    n = sum(p.numel() for p in BertForPreTraining(cfg.model).parameters())
    monkeypatch.setattr(sizes, "machine_memory", lambda: 16 * n)
    sizes.check_memory(cfg.model, rt.placement(), "ddp")  # exactly fits
    monkeypatch.setattr(sizes, "machine_memory", lambda: 16 * n - 1)
    with pytest.raises(UsageError, match=f"{n:,} parameters need .* GiB .* this machine's memory is"):
        sizes.check_memory(cfg.model, rt.placement(), "ddp")
    monkeypatch.setattr(sizes, "machine_memory", lambda: 4 * n)
    monkeypatch.setenv("WORLD_SIZE", "4")
    sizes.check_memory(
        cfg.model, runtime.Runtime(torch.device("cpu"), "fp32", world_size=4).placement(), "fsdp"
    )  # 1/4 each
    with pytest.raises(UsageError, match="too large"):
        sizes.check_memory(cfg.model, runtime.Runtime(torch.device("cpu"), "fp32", world_size=4).placement(), "ddp")


def test_sizes_that_cannot_fit_on_this_cpu_are_refused_before_torch_loads(tmp_path):
    """A batch or a model too large for this machine's memory is refused before torch's import
    (3.6 s, 250 MB): on the CPU the figures need none."""
    from conftest import refuse_in_fresh_interpreter

    config = write_config(tmp_path)
    huge = ["--set", "train.batch_size=100000000", "--set", "train.micro_batch_size=100000000"]
    for settings, said in (
        (huge, "of activations, but this machine's memory is"),
        (["--set", "train.batch_size=10000000000"], "train.batch_size=10,000,000,000: a process's"),
        (["--set", "model.hidden_size=1000000"], "the model is too large to train here"),
    ):
        (code, imported), err = refuse_in_fresh_interpreter(
            "pretrain", "--config", config, "--device", "cpu", *settings, cwd=tmp_path
        )
        assert (code, imported) == ("2", "False") and said in err, err
    assert not (tmp_path / "checkpoints").exists()


def test_a_users_folder_among_the_checkpoints_is_refused_before_torch_loads(tmp_path, eight_steps):
    """A user's step-N folder, or a note inside best, is refused from the files alone, so before
    torch's import (3.4-4.4 s, 252 MB)."""
    import shutil

    from conftest import refuse_in_fresh_interpreter

    shutil.copytree(eight_steps, tmp_path / "run")
    root = tmp_path / "run" / "checkpoints"
    (root / "step-0000003").mkdir()
    (root / "step-0000003" / "model.safetensors").write_text("mine")
    config = write_config(tmp_path / "run", "checkpoint.keep_last=3", "train.eval_every=0")
    (code, imported), err = refuse_in_fresh_interpreter("pretrain", "--config", config, cwd=tmp_path)
    assert (code, imported) == (
        "2",
        "False",
    ) and f"{root / 'step-0000003'} is not a checkpoint written by bertcli" in err, err
    shutil.rmtree(root / "step-0000003")
    shutil.copytree(root / "step-0000008", root / "best")
    (root / "best" / "NOTES.txt").write_text("mine")
    (code, imported), err = refuse_in_fresh_interpreter("pretrain", "--config", config, cwd=tmp_path)
    assert (code, imported) == ("2", "False") and "holds NOTES.txt, which is not a file bertcli writes" in err, err
    assert (root / "best" / "NOTES.txt").read_text() == "mine"


def test_weights_get_the_mode_of_every_other_file(tmp_path, trained):
    """safetensors writes its file 0600; bertcli gives it 0666 less the umask, like the rest."""
    from bertcli import export

    old = os.umask(0o027)
    try:
        train(tmp_path / "run", stop_at=4)
        export.export(trained, tmp_path / "hf")
    finally:
        os.umask(old)
    for folder in (tmp_path / "run" / "checkpoints" / "step-0000004", tmp_path / "hf"):
        modes = {p.name: oct(p.stat().st_mode & 0o777) for p in folder.rglob("*") if p.is_file()}  # 1_Pooling/ too
        assert "model.safetensors" in modes and set(modes.values()) == {"0o640"}, modes


def test_positions_that_are_not_a_multiple_of_8_are_never_padded_past(tmp_path):
    """max_position_embeddings 30: batches of full rows (30 tokens) were rounded up to 32 and crashed."""
    from bertcli.data.examples import ExampleBuilder

    cfg = micro_config("model.max_position_embeddings=30", "data.max_seq_length=30")
    builder = ExampleBuilder(synthetic_corpus(cfg.data.synthetic, cfg.model.vocab_size), cfg.data, 8)
    widths = {builder.batch(0, step, range(8)).input_ids.shape[1] for step in range(20)}
    assert max(widths) == 30 and widths <= {8, 16, 24, 30}, widths
    result = train(tmp_path, "model.max_position_embeddings=30", "data.max_seq_length=30", stop_at=2)
    assert result["step"] == 2


@pytest.fixture(scope="module")
def eight_steps(tmp_path_factory) -> Path:
    """A run with checkpoints at steps 4 and 8, to copy and spoil."""
    folder = tmp_path_factory.mktemp("eight")
    train(folder, "checkpoint.keep_last=3", "train.eval_every=0", stop_at=8)
    return folder


@pytest.mark.parametrize(
    "damage",
    [
        "empty training state",
        "flipped training state",
        "cut weights",
        "empty trainer state",
        "linked weights",
        "nan weights",
        "flipped zip directory",
        "training state of step 4",
    ],
)
def test_resume_auto_falls_back_past_a_damaged_newest_checkpoint(tmp_path, cli, damage, eight_steps):
    import shutil
    import zipfile

    shutil.copytree(eight_steps, tmp_path / "run")
    tmp_path = tmp_path / "run"
    config = write_config(tmp_path, "checkpoint.keep_last=1", "train.eval_every=0")
    newest = tmp_path / "checkpoints" / "step-0000008"
    name = {"empty trainer state": "trainer_state.json"}.get(damage, "training_state.pt")
    name = "model.safetensors" if "weights" in damage else name
    data = bytearray((newest / name).read_bytes())
    if damage == "flipped training state":  # one bit of the largest tensor's bytes (not the zip's alignment padding)
        member = max(zipfile.ZipFile(newest / name).infolist(), key=lambda i: i.file_size)
        start = (
            member.header_offset
            + 30
            + len(member.filename.encode())
            + int.from_bytes(data[member.header_offset + 28 : member.header_offset + 30], "little")
        )
        data[start + member.file_size // 2] ^= 0x01
    if (
        damage == "flipped zip directory"
    ):  # data.pkl's external attributes: Python's zipfile ignores them, torch's reader not
        data[zipfile.ZipFile(newest / name).start_dir + 38] ^= 0xFF
    if damage == "training state of step 4":  # a whole archive, CRCs right, but of another step
        data = (newest.parent / "step-0000004" / name).read_bytes()
    if damage == "nan weights":
        tensors = safetensors.torch.load_file(newest / name)
        tensors["bert.pooler.dense.weight"][0, 0] = float("nan")
        data = safetensors.torch.save(tensors)
    spoilt = {
        "empty training state": b"",
        "empty trainer state": b"",
        "cut weights": bytes(data[: len(data) // 2]),
    }.get(damage, bytes(data))
    (newest / name).write_bytes(spoilt)
    if damage == "linked weights":  # a good file, but outside the checkpoint: never followed
        (newest / name).rename(tmp_path.parent / name)
        (newest / name).symlink_to(tmp_path.parent / name)
    result = cli("pretrain", "--config", config, "--stop-at", "6")  # not --quiet: "resuming from" is said
    assert result.code == 0, result.err
    assert (
        f"{newest} is damaged ({name}: " in result.err
        and "resuming from the newest checkpoint that loads" in result.err
    )
    assert "resuming from" in result.err and "step-0000004 (step 4)" in result.err
    # keep_last=1 keeps step 6, the one just written (the damaged 8 would have been kept instead of it)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["damaged-step-0000008", "step-0000006"]
    assert (tmp_path / "checkpoints" / "damaged-step-0000008" / name).read_bytes() == spoilt, "kept as it was"


def test_an_intact_best_of_the_damaged_newest_step_is_resumed_from(tmp_path, cli, eight_steps):
    """`best` is a whole checkpoint: when it copies the newest step and that step folder is damaged,
    the run resumes from it: it is not removed as "past the step resumed from", and the steps since
    the older step folder are not trained again."""
    import shutil

    shutil.copytree(eight_steps, tmp_path, dirs_exist_ok=True)
    checkpoints = tmp_path / "checkpoints"
    best = Path(shutil.copytree(checkpoints / "step-0000008", checkpoints / "best"))
    (checkpoints / "step-0000008" / "training_state.pt").write_bytes(b"")
    result = cli("pretrain", "--config", tmp_path / "config.yaml", "--stop-at", "9")
    assert result.code == 0, result.err
    assert f"resuming from the newest checkpoint that loads, {best}" in result.err and "removed" not in result.err
    assert json.loads((checkpoints / "step-0000009" / "trainer_state.json").read_text())["step"] == 9
    assert json.loads((best / "trainer_state.json").read_text())["step"] == 8
    records = [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "train"]
    assert records == sorted(set(records)) and records[-1] == 9  # steps 5-8 not trained again


def test_held_out_perplexity_is_e_to_the_loss_of_a_diverged_model_too(tmp_path, monkeypatch):
    """Held-out perplexity is e^loss past e^50 too: a cap there would read 5.185e+21 at every evaluation
    of a diverged run."""
    from bertcli import trainer

    real = trainer.pretraining_loss

    def diverged(out, batch, **kwargs):  # held-out logits 1000 times too large: a loss in the hundreds
        if not torch.is_grad_enabled():
            out = out._replace(mlm_logits=out.mlm_logits * 1000)
        return real(out, batch, **kwargs)

    monkeypatch.setattr(trainer, "pretraining_loss", diverged)
    train(tmp_path, "train.max_steps=2", "train.eval_every=2", "checkpoint.save_every=2")
    [held_out] = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "eval"]
    assert 50 < held_out["mlm_loss"] < trainer.PERPLEXITY_CAP
    assert held_out["perplexity"] == pytest.approx(math.exp(held_out["mlm_loss"]), rel=1e-9)


def test_resume_from_a_damaged_checkpoint_path_is_one_line(tmp_path, cli, eight_steps):
    """A member marked as a folder in the zip directory: torch's reader would leave its buffer unwritten and
    unpickle whatever memory held (it loaded, or failed with another error, from run to run)."""
    import shutil
    import zipfile

    shutil.copytree(eight_steps, tmp_path, dirs_exist_ok=True)
    file = tmp_path / "checkpoints" / "step-0000008" / "training_state.pt"
    data = bytearray(file.read_bytes())
    data[zipfile.ZipFile(file).start_dir + 38] |= 0x10  # data.pkl's MS-DOS attributes: a folder
    file.write_bytes(data)
    without_file_hashes(file.parent)  # the check below the record of the files' SHA-256
    result = cli("pretrain", "--config", tmp_path / "config.yaml", "--quiet", "--resume", file.parent, "--stop-at", "9")
    assert result.code == 1 and len(result.err_lines) == 1, result.err
    assert f"{file.parent} is damaged (training_state.pt: " in result.err and "data.pkl" in result.err, result.err


def test_resume_auto_with_no_checkpoint_that_loads_is_one_line(tmp_path, cli, eight_steps):
    import shutil

    shutil.copytree(eight_steps, tmp_path, dirs_exist_ok=True)
    for step in (4, 8):
        (tmp_path / "checkpoints" / f"step-{step:07d}" / "training_state.pt").write_bytes(b"")
    result = cli("pretrain", "--config", tmp_path / "config.yaml", "--quiet")
    assert result.code == 1 and len(result.err_lines) == 1 and "no checkpoint loads" in result.err, result.err


def _dead_pid() -> int:
    """The PID of a process that has ended (a leftover's writer)."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    return dead.pid


def test_incomplete_and_temporary_checkpoint_folders_are_never_picked(tmp_path):
    train(tmp_path, stop_at=4)
    root = tmp_path / "checkpoints"
    (root / "step-0000099").mkdir()
    (root / "step-0000099" / "config.yaml").write_text("half written")
    left = root / f".tmp-step-0000100.{_dead_pid()}"
    left.mkdir()
    (left / "config.yaml").write_text("half written")
    assert [s for s, _ in layout.list_checkpoints(tmp_path)] == [4]
    result = train(tmp_path, stop_at=8)  # resumes from 4, not from the broken 99
    assert result["step"] == 8
    assert not left.exists(), "leftovers of a killed writer are cleaned"


def test_temporary_names_in_checkpoints_that_bertcli_did_not_write_are_left_alone(tmp_path, cli, eight_steps):
    """A .tmp-* in checkpoints/ may be a user's (holding a thesis.txt): pretrain neither deletes it nor
    renames a .tmp-old-X.N to X. Only a gone writer's folders of checkpoint files go."""
    import os
    import shutil

    shutil.copytree(eight_steps, tmp_path, dirs_exist_ok=True)
    root, dead = tmp_path / "checkpoints", _dead_pid()
    theirs = [
        f".tmp-step-0000042.{dead}",
        f".tmp-best.{dead}",
        f".tmp-old-my-notes.{dead}",
        f".tmp-del-step-0000020.{dead}",
    ]
    for name in theirs:
        (root / name).mkdir()
        (root / name / "thesis.txt").write_text("mine")
    (root / ".tmp-x").write_text("mine")
    live = root / f".tmp-step-0000009.{os.getppid()}"  # a live writer's (pytest's parent stands in)
    live.mkdir()
    ours = root / f".tmp-step-0000011.{dead}"
    ours.mkdir()
    (ours / "config.yaml").write_text("half written")
    result = cli(
        "pretrain",
        "--config",
        write_config(tmp_path, "checkpoint.keep_last=3", "train.eval_every=0"),
        "--quiet",
        "--stop-at",
        "9",
    )
    assert result.code == 0, result.err
    for name in theirs:
        assert (root / name / "thesis.txt").read_text() == "mine", name
    assert (root / ".tmp-x").read_text() == "mine" and live.is_dir() and not ours.exists()
    assert not (root / "my-notes").exists()


@pytest.mark.parametrize("mode", ["bf16", "fp16"])
def test_mixed_precision_on_cpu(tmp_path, mode):
    result = train(tmp_path / mode, f"precision.mode={mode}", "train.max_steps=4")
    assert all(math.isfinite(v) for v in result["metrics"].values())
    stored = weights(tmp_path / mode / "checkpoints" / "step-0000004")
    assert all(t.dtype == torch.float32 for t in stored.values()), "master weights stay fp32"
    # The mode took effect: the same run in fp32 ends close by, but not bit for bit (half-precision rounding).
    train(tmp_path / "fp32", "precision.mode=fp32", "train.max_steps=4")
    plain = weights(tmp_path / "fp32" / "checkpoints" / "step-0000004")
    assert any(not torch.equal(stored[k], plain[k]) for k in plain), f"{mode} trained exactly like fp32"
    for key in plain:
        torch.testing.assert_close(stored[key], plain[key], rtol=0.05, atol=0.02, msg=key)


@pytest.mark.parametrize("native", [False, True])
def test_half_precision_on_a_cpu_without_its_instructions_is_warned(tmp_path, monkeypatch, capsys, native):
    """bf16 or fp16 autocast on a CPU without the instructions for it runs about 10x slower
    than fp32 (torch emulates it): pretrain says so once, with what to use instead; not where it is native."""
    for probe in runtime.NATIVE_ON_CPU["bf16"]:  # this machine's CPU, whatever it is, seen as with or without
        monkeypatch.setattr(torch.cpu, probe, lambda: native)
    train(tmp_path / "run", "precision.mode=bf16", "train.max_steps=1")
    warned = [line for line in capsys.readouterr().err.splitlines() if "instructions" in line]
    assert warned == [] if native else len(warned) == 1, warned
    if not native:
        assert warned[0].startswith("warning: precision.mode=bf16 on a CPU without bf16 instructions (")
        assert warned[0].endswith(
            "torch emulates it, several times slower than fp32 here; use fp32 (or auto) on this CPU"
        )
    assert runtime.slow_autocast(runtime.Runtime(torch.device("cpu"), "fp32")) is None
    assert runtime.slow_autocast(runtime.Runtime(torch.device("meta"), "bf16")) is None  # not a CPU


def test_grad_accumulation_is_exactly_a_larger_batch(tmp_path):
    """1 x 2B and 2 x B: the same examples, and the same update, because both loss terms are means
    over the whole step (MLM predictions differ in number from micro-batch to micro-batch)."""
    varied = ["data.short_seq_prob=0.5", "train.max_steps=4", *NO_DROPOUT]  # predictions per row: 1 to 4
    a = train(tmp_path / "a", "train.batch_size=8", *varied)
    b = train(tmp_path / "b", "train.batch_size=8", "train.micro_batch_size=4", *varied)
    assert a["tokens_seen"] == b["tokens_seen"]
    wa, wb = weights(tmp_path / "a/checkpoints/step-0000004"), weights(tmp_path / "b/checkpoints/step-0000004")
    start = BertForPreTraining(micro_config().model).state_dict()
    assert all((wa[k] - start[k]).abs().max() > 1e-3 for k in wa if k.endswith("query.weight")), "it trained"
    for key in wa:
        torch.testing.assert_close(wb[key], wa[key], rtol=0, atol=1e-6)


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_schedule_learns_from_the_first_to_the_last_step_and_decays_as_hugging_face(schedule):
    hf = pytest.importorskip("transformers.optimization")
    steps, warmup, lr = 50, 10, 1e-3
    cfg = micro_config(
        f"optimizer.schedule={schedule}", f"optimizer.warmup_steps={warmup}", f"optimizer.lr={lr}"
    ).optimizer
    lrs = [lr_at(s, cfg, steps) for s in range(steps)]
    assert lrs[0] == pytest.approx(lr / warmup), "step 0 already learns"
    assert lrs[warmup - 1] == lrs[warmup] == pytest.approx(lr), "warm-up ends at the peak"
    progress = (steps - 1 - warmup) / (steps - warmup)  # of the last update
    last = 1 - progress if schedule == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
    assert lrs[-1] == pytest.approx(lr * last) and lrs[-1] > 0, "the last step still learns"
    # Decay: Hugging Face's get_{linear,cosine}_schedule_with_warmup; warm-up: theirs one step later.
    extra = {} if schedule == "linear" else {"num_cycles": 0.5}
    theirs = [
        lr
        * getattr(hf, f"_get_{schedule}_schedule_with_warmup_lr_lambda")(
            s, num_warmup_steps=warmup, num_training_steps=steps, **extra
        )
        for s in range(steps + 1)
    ]
    assert lrs == pytest.approx(theirs[1 : warmup + 1] + theirs[warmup:steps])
    floor = dataclasses.replace(cfg, min_lr_ratio=0.1)
    assert lr_at(steps - 1, floor, steps) == pytest.approx(lr * (0.1 + 0.9 * last))


def test_training_learns(tmp_path):
    """MLM loss falls by a wide margin on every run, and NSP is learnt: its accuracy over the last log
    window (320 examples) passes 0.7, which chance reaches with probability below 1e-12.

    NSP is learnt by a sudden jump whose step depends on the seed and on the CPU's float path: on
    this project's AMD machine every seed tried (1, 3, 4, 5, 6, 42) was past it by step 240, while on
    an AVX-512 Xeon seed 1 was still at 0.59 there. So NSP is asked of one of up to five seeds (the
    next seed runs only when a run ends before its jump): a test of learning that holds on any CPU,
    at the cost of one run where the first seed learns."""
    overrides = [
        "train.max_steps=240",
        "logging.log_every=20",
        "checkpoint.save_every=240",
        "train.batch_size=16",
        "optimizer.lr=5e-3",
        "data.synthetic.num_topics=16",
        "model.hidden_size=64",
        "model.intermediate_size=128",
        "train.eval_every=0",
    ]
    nsp = []
    for seed in range(1, 6):
        train(tmp_path / f"seed-{seed}", *overrides, f"train.seed={seed}")
        records = [r for r in read_metrics(tmp_path / f"seed-{seed}" / "metrics.jsonl") if r["split"] == "train"]
        first, last = records[0], records[-1]
        assert last["mlm_loss"] < first["mlm_loss"] - 1.0, (seed, first, last)
        nsp.append(last["nsp_acc"])
        if nsp[-1] > 0.7:
            break
    assert nsp[-1] > 0.7, f"NSP not learnt by step 240 with seeds 1-5: last-window accuracies {nsp}"


def test_a_folder_moved_aside_by_an_interrupted_replace_is_put_back(tmp_path):
    train(tmp_path, stop_at=4)
    root = tmp_path / "checkpoints"
    # A crash between the two renames of replacing step-0000004: only the moved-aside copy is left.
    (root / "step-0000004").rename(root / f".tmp-old-step-0000004.{_dead_pid()}")
    checkpoint.remove_leftovers(root)
    assert layout.is_checkpoint(root / "step-0000004")
    assert not list(root.glob(".tmp-*"))


def test_compiled_layers_train_like_eager_ones(tmp_path, monkeypatch):
    """train.compile runs the encoder layers under torch.compile. The suite captures them with the
    aot_eager backend (dynamo + AOTAutograd, seconds) rather than inductor (minutes on a CPU)."""
    import torch._dynamo

    from bertcli import parallel

    monkeypatch.setattr(parallel, "COMPILE_BACKEND", "aot_eager")
    torch._dynamo.reset()
    overrides = [
        "train.max_steps=4",
        "train.eval_every=0",
        "model.hidden_dropout_prob=0",
        "model.attention_probs_dropout_prob=0",
    ]
    train(tmp_path / "eager", *overrides)
    train(tmp_path / "compiled", *overrides, "train.compile=true")
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1, "nothing was compiled"
    a, b = (
        weights(tmp_path / "eager" / "checkpoints" / "step-0000004"),
        weights(tmp_path / "compiled" / "checkpoints" / "step-0000004"),
    )
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-6)


def test_unpadded_training_matches_padded_training(tmp_path, capsys, monkeypatch):
    """train.unpad=true trains on the packed real tokens (on CPU with the reference attention): without
    dropout the weights after 8 steps equal the padded run's; with attention dropout it says why it
    trains padded instead."""
    no_dropout = ("model.attention_probs_dropout_prob=0", "model.hidden_dropout_prob=0", "train.max_steps=8")
    train(tmp_path / "padded", *no_dropout, "train.unpad=false")
    import bertcli.model

    calls = []
    packed_attention = bertcli.model.packed_attention
    monkeypatch.setattr(bertcli.model, "packed_attention", lambda *a: calls.append(1) or packed_attention(*a))
    train(tmp_path / "unpadded", *no_dropout, "train.unpad=true")
    assert len(calls) == 8 * 2  # every step ran packed (2 layers)
    a = weights(tmp_path / "padded" / "checkpoints" / "step-0000008")
    b = weights(tmp_path / "unpadded" / "checkpoints" / "step-0000008")
    assert (
        a["bert.encoder.layer.0.attention.self.query.weight"]
        .ne(BertForPreTraining(micro_config().model).state_dict()["bert.encoder.layer.0.attention.self.query.weight"])
        .any()
    )
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-4, atol=1e-5, msg=key)
    capsys.readouterr()
    train(tmp_path / "dropout", "train.max_steps=2", "train.unpad=true")
    assert "attention_probs_dropout_prob is 0.1" in capsys.readouterr().err


def test_automatic_unpadding_is_for_large_gpu_micro_batches_without_attention_dropout():
    from bertcli.runtime import UNPAD_MIN_TOKENS, unpadded

    def decide(setting, device, attention_dropout, tokens, precision="bf16"):
        return unpadded(
            setting,
            device=torch.device(device),
            precision=precision,
            attention_dropout=attention_dropout,
            micro_batch_tokens=tokens,
        )

    assert decide(None, "cuda", 0.0, UNPAD_MIN_TOKENS) == (True, None)
    assert decide(None, "cuda", 0.0, UNPAD_MIN_TOKENS - 1) == (False, None)  # launch-bound: measured slower
    assert decide(None, "cuda", 0.1, UNPAD_MIN_TOKENS) == (False, None)
    assert decide(None, "cpu", 0.0, UNPAD_MIN_TOKENS) == (False, None)
    assert decide(None, "cuda", 0.0, UNPAD_MIN_TOKENS, precision="fp32") == (False, None)  # FlashAttention: half only
    assert decide(True, "cpu", 0.0, 8) == (True, None)
    assert decide(False, "cuda", 0.0, UNPAD_MIN_TOKENS)[0] is False


def test_a_run_keeps_its_tokenizer_when_its_corpus_changes(tmp_path, small_corpus, cli):
    """The first checkpoint fixes the run's tokenizer: a file added to the corpus folder is prepared
    with it (same vocab.txt), never with a new vocabulary; a prepared folder of another tokenizer is
    refused for resuming; inspect shows the tokenizer next to the prepared data's."""
    from conftest import text_run

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    documents = small_corpus.read_text().split("\n\n")
    (corpus / "a.txt").write_text("\n\n".join(documents[:40]) + "\n")
    config = text_run(tmp_path / "run", corpus, "train.max_steps=4", "train.eval_every=0", "checkpoint.save_every=2")
    assert cli("pretrain", "--config", config, "--quiet").code == 0
    first = (tmp_path / "run" / "checkpoints" / "step-0000004" / "vocab.txt").read_bytes()
    (corpus / "b.txt").write_text("\n\n".join(documents[40:]) + "\nZebra quagga okapi narwhal axolotl.\n")
    result = cli("pretrain", "--config", config, "--set", "train.max_steps=6")  # not --quiet: the line is looked for
    assert result.code == 0, result.err
    assert "with the run's own tokenizer" in result.err
    assert (tmp_path / "run" / "checkpoints" / "step-0000006" / "vocab.txt").read_bytes() == first
    assert (tmp_path / "run" / "data" / "vocab.txt").read_bytes() == first
    report = cli("inspect", tmp_path / "run", "--json")
    training = json.loads(report.out)["training"]
    assert training["tokenizer"] == training["prepared_data_tokenizer"] and len(training["tokenizer"]) == 12

    other = tmp_path / "other-vocab.txt"  # the same words with two ids swapped: same size, other ids
    words = first.decode().splitlines()
    words[-1], words[-2] = words[-2], words[-1]
    other.write_text("\n".join(words) + "\n")
    result = cli(
        "pretrain", "--config", config, "--quiet", "--set", "train.max_steps=8", "--set", f"data.tokenizer.path={other}"
    )
    assert result.code == 2, result.err
    line = result.err_lines[-1]
    assert "not the tokenizer" in line and "data.tokenizer.path" in line and "new output_dir" in line, line
    assert not (tmp_path / "run" / "checkpoints" / "step-0000008").exists()


def test_resuming_with_other_settings_says_what_changes(tmp_path, cli, eight_steps):
    import shutil

    shutil.copytree(eight_steps, tmp_path, dirs_exist_ok=True)
    # Another folder (so other absolute paths), cadence and logging: nothing a resumed run computes.
    config = write_config(
        tmp_path,
        "checkpoint.keep_last=3",
        "train.eval_every=0",
        "logging.log_every=1",
        "checkpoint.save_every=1",
        "logging.tensorboard=false",
    )
    result = cli("pretrain", "--config", config, "--quiet", "--stop-at", "9")
    assert result.code == 0 and "other settings" not in result.err, result.err
    config = write_config(
        tmp_path,
        "checkpoint.keep_last=3",
        "train.eval_every=5",
        "train.seed=7",
        "optimizer.lr=0.001",
        "train.eval_examples=16",
        "logging.tensorboard=false",
    )
    result = cli("pretrain", "--config", config, "--quiet", "--stop-at", "10")
    assert result.code == 0, result.err
    lr = f"{lr_at(9, micro_config().optimizer, 12):.3g} -> {lr_at(9, micro_config('optimizer.lr=0.001').optimizer, 12):.3g}"
    said = [line for line in result.err_lines if "other settings" in line]
    # One line per kind of change, each naming the settings that make it (the global batch is the same).
    assert len(said) == 3, result.err
    assert "train.seed 42 -> 7" in said[0] and "steps 10 on" in said[0] and "other examples" in said[0]
    assert "train.seed 42 -> 7" in said[1] and "train.eval_examples 512 -> 16" in said[1] and "held-out" in said[1]
    assert "optimizer.lr 0.002 -> 0.001" in said[2] and f"learning rate {lr}" in said[2]


def test_a_runs_set_values_stay_with_it_and_its_start_and_step_lines_say_what_a_person_needs(
    tmp_path, cli, eight_steps, monkeypatch
):
    """--set train.max_steps=10 is recorded in the run folder: a plain pretrain keeps it (said), inspect shows it
    during and after the run, a new --set changes it. The start is at most 12 lines; every step line, stderr not a
    terminal, has the learning rate, the time so far and an estimate of the end. The batch line and inspect say how a
    step splits into micro-batches here, and why."""
    import shutil

    from bertcli import summary, trainer

    shutil.copytree(eight_steps, tmp_path, dirs_exist_ok=True)
    config = write_config(tmp_path, "checkpoint.keep_last=3", "train.eval_every=0", "logging.log_every=1")
    first = cli("pretrain", "--config", config, "--set", "train.max_steps=10")  # the YAML says 12
    assert first.code == 0 and layout.list_checkpoints(tmp_path)[-1][0] == 10, first.err
    steps = [i for i, line in enumerate(first.err_lines) if line.startswith("step ")]
    assert steps and steps[0] <= 12, first.err
    for i in steps:
        assert re.search(r"^step \d+/10 \|.* lr [\d.e-]+ .*elapsed, ~[\d:]+ left$", first.err_lines[i]), first.err
    assert "train.max_steps=10" in (tmp_path / layout.RUN_SETTINGS).read_text()
    chosen = json.loads(cli("inspect", config, "--json").out)["batch"]  # what this CPU chooses, and why
    assert (chosen["micro"], chosen["accum"]) == (8, 1) and "25% of this machine's memory" in chosen["why"]
    assert (
        f"batch: 8 sequences a step of up to 32 tokens: 1 micro-batch(es) of 8 on each of 1 process(es) ({chosen['why']})"
        in first.err_lines
    )
    plain = cli("pretrain", "--config", config, "--quiet")
    assert plain.code == 0 and "nothing to do" in plain.err, plain.err
    assert "train.max_steps=10" in plain.err_lines[0] and layout.list_checkpoints(tmp_path)[-1][0] == 10
    assert json.loads(cli("inspect", tmp_path, "--json").out)["training"]["max_steps"] == 10
    during, real = [], trainer.train_step
    monkeypatch.setattr(
        trainer, "train_step", lambda *a, **k: during.append(summary.inspect_path(tmp_path)) or real(*a, **k)
    )
    more = cli("pretrain", "--config", config, "--set", "train.max_steps=11", "--verbose")
    assert more.code == 0 and "resolved config:" in more.err and layout.list_checkpoints(tmp_path)[-1][0] == 11
    assert [r["training"]["max_steps"] for r in during] == [11]


def test_resume_skips_damaged_metrics_records_and_says_so_once(tmp_path, cli, eight_steps):
    import shutil

    shutil.copytree(eight_steps, tmp_path, dirs_exist_ok=True)
    best = shutil.copytree(tmp_path / "checkpoints" / "step-0000004", tmp_path / "checkpoints" / "best")
    (best / "trainer_state.json").write_text(
        '{"step": 4, "eval_metrics": {"mlm_loss": 5.'
    )  # cut: the next best replaces it
    metrics = tmp_path / "metrics.jsonl"
    good = metrics.read_text().splitlines()
    metrics.write_text("\n".join([good[0], '{"step": "4.5", "split": "train"}', "[8]", *good[1:]]) + "\n")
    config = write_config(tmp_path, "checkpoint.keep_last=3", "train.eval_every=0", "logging.tensorboard=false")
    result = cli("pretrain", "--config", config, "--quiet", "--stop-at", "9")
    assert result.code == 0, result.err
    assert [line for line in result.err_lines if "damaged line" in line] == [
        f"{metrics}: 2 damaged line(s) skipped (line 2, 3): not JSON objects with a step; left out "
        "of the file from now on"
    ]
    assert [r["step"] for r in read_metrics(metrics)] == [4, 8, 9]
    assert metrics.read_text().splitlines()[:2] == good[:2]


def test_resuming_another_runs_checkpoint_sets_the_whole_own_history_aside(tmp_path, cli, eight_steps):
    """After --resume OTHER/step-N, the run's own steps and its best are another history: set aside (a
    fall-back would go to one of another model), and its metrics' records kept apart from the new one's."""
    import shutil

    other = Path(shutil.copytree(eight_steps, tmp_path / "other"))
    run = tmp_path / "run"
    train(run, "train.max_steps=4", "train.eval_every=2", "checkpoint.save_every=2", "checkpoint.keep_last=3")
    root = run / "checkpoints"
    assert {p.name for p in root.iterdir()} == {"step-0000002", "step-0000004", "best"}
    source = other / "checkpoints" / "step-0000008"
    result = cli("pretrain", "--config", run / "config.yaml", "--resume", source, "--set", "train.max_steps=10")
    assert result.code == 0, result.err
    for step in (2, 4):  # said, naming the folder and the checkpoint resumed from, and renamed (never deleted)
        assert any(
            line.startswith(f"{root / f'step-000000{step}'} is of step {step}") and str(source) in line
            for line in result.err_lines
        ), result.err
        assert (root / f"abandoned-step-000000{step}" / "model.safetensors").is_file()
    assert f"removed {root / 'best'}: this run resumes from a checkpoint outside its checkpoints folder" in result.err
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step-")) == ["step-0000010"]
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [10, 10]  # (the train and eval records)
    left = run / "metrics.left-behind.jsonl"  # the records of the history left behind are kept
    assert any(
        line.startswith(f"{run / 'metrics.jsonl'}: ")
        and line.endswith(f"left out: of a history this run does not continue; kept in {left}")
        for line in result.err_lines
    ), result.err
    assert {r["step"] for r in read_metrics(left)} == {2, 4}
    assert all(isinstance(r["left_behind"], str) for r in read_metrics(left)), "when: histories stay apart"

    # A fresh start over a run whose checkpoints were deleted drops that file's records: said too.
    import shutil as _shutil

    _shutil.rmtree(root)
    again = cli("pretrain", "--config", run / "config.yaml", "--set", "train.max_steps=2")
    assert again.code == 0 and (
        f"{run / 'metrics.jsonl'}: 2 record(s) of step 10 left out: of a history this run does not continue; kept in "
        f"{left}" in again.err_lines
    ), again.err


def test_resuming_an_older_checkpoint_by_path_sets_the_later_history_aside(tmp_path, cli, eight_steps):
    """`--resume PATH` back to step 4 of a run at step 8 starts another history: step 8 is set aside,
    so that the next slice (the same command, --resume auto) continues from the new one, not from the
    abandoned step 8 ('nothing to do'), and keep_last never prunes the new history first."""
    import shutil

    shutil.copytree(eight_steps, tmp_path, dirs_exist_ok=True)
    root = tmp_path / "checkpoints"
    config = write_config(tmp_path, "checkpoint.keep_last=3", "train.eval_every=0", "logging.tensorboard=false")
    result = cli("pretrain", "--config", config, "--quiet", "--resume", root / "step-0000004", "--stop-at", "6")
    assert result.code == 0, result.err
    size = sum(p.stat().st_size for p in (root / "abandoned-step-0000008").iterdir()) / 2**20
    [line] = [line for line in result.err_lines if line.startswith(f"{root / 'step-0000008'} is of step 8")]
    assert "abandoned-step-0000008" in line, result.err
    # inspect says what is set aside and what it costs (they piled up unseen, a full checkpoint each)
    report = json.loads(cli("inspect", tmp_path, "--json").out)["training"]
    assert report["set_aside"] == [{"path": str(root / "abandoned-step-0000008"), "bytes": round(size * 2**20)}]
    assert f"set aside (1, {size:,.1f} MiB: yours to delete" in cli("inspect", tmp_path).out
    result = cli("pretrain", "--config", config, "--quiet", "--stop-at", "7")
    assert result.code == 0 and "done: step 7" in result.err, result.err
    assert sorted(p.name for p in root.iterdir()) == [
        "abandoned-step-0000008",
        "step-0000004",
        "step-0000006",
        "step-0000007",
    ]


def test_metrics_lines_of_any_length_are_read_in_bounded_memory_and_each_counted(tmp_path):
    """A record is a few hundred bytes: a damaged line of megabytes is read past, never held (inspect
    and resume took 2.3x a 900 MB line), and counted, the last line too (only a torn record of a
    record's size is a crash's leftover, skipped silently)."""
    import tracemalloc

    from bertcli.metrics import read_metrics_checked

    metrics = tmp_path / "metrics.jsonl"
    junk = "a" * (20 << 20)
    metrics.write_text(f'{{"step": 1}}\n{junk}\n{{"step": 2}}\n{junk}')
    tracemalloc.start()
    records, damaged = read_metrics_checked(metrics)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert [r["step"] for r in records] == [1, 2] and peak < 2 << 20, peak
    assert damaged == (f"{metrics}: 2 damaged line(s) skipped (line 2, 4): not JSON objects with a step")
    metrics.write_text('{"step": 1}\n{"step": 2, "lo')  # a crash mid-write: said nothing of
    assert read_metrics_checked(metrics) == ([{"step": 1}], None)


def plant_best(source: Path, best: Path, loss: float = 3.5) -> None:
    """A copy of checkpoint `source` as `best`, with a held-out loss."""
    import shutil

    shutil.copytree(source, best)
    state = json.loads((best / "trainer_state.json").read_text())
    (best / "trainer_state.json").write_text(json.dumps({**state, "eval_metrics": {"mlm_loss": loss}}))


def test_best_belongs_to_the_runs_current_model(tmp_path, cli, eight_steps):
    """A run that starts fresh removes the `best` of an earlier run (here of 2 layers where the new run has
    1); a `best` of another model put back by hand is passed over by export and encode (which name the checkpoint
    they read)."""
    root = tmp_path / "checkpoints"
    plant_best(eight_steps / "checkpoints" / "step-0000008", tmp_path / "old-best")  # 2 layers
    plant_best(eight_steps / "checkpoints" / "step-0000008", root / "best")
    config = write_config(tmp_path, "model.num_hidden_layers=1", "train.max_steps=2", "train.eval_every=0")
    result = cli("pretrain", "--config", config, "--quiet")
    # No step folder holds its weights: renamed, not removed (they would be lost), and said.
    assert result.code == 0 and any(
        line.startswith(f"{root / 'best'}: ") and "abandoned-best" in line for line in result.err_lines
    ), result.err
    assert checkpoint.read_config(root / "abandoned-best").model.num_hidden_layers == 2

    def layers() -> int:  # of the checkpoint export and encode take from the run folder
        from bertcli.export import find_checkpoint

        return checkpoint.read_config(find_checkpoint(tmp_path)).model.num_hidden_layers

    assert not (root / "best").exists() and layers() == 1
    plant_best(tmp_path / "old-best", root / "best")
    assert layers() == 1


def test_best_is_of_the_history_resumed(tmp_path, eight_steps):
    """Resuming keeps a `best` of the same model at or before the step resumed from; a later one (of a history
    left behind, as when a damaged newest checkpoint is set aside) or one of another model is removed."""
    import shutil

    shutil.copytree(eight_steps, tmp_path / "run")
    root, cfg = tmp_path / "run" / "checkpoints", load_run(tmp_path / "run" / "config.yaml")

    plant_best(root / "step-0000008", root / "best")
    assert resume.settle_best(cfg, root / "step-0000008", True) == 3.5 and (root / "best").exists()
    assert resume.settle_best(cfg, root / "step-0000004", True) is None and not (root / "best").exists()
    plant_best(root / "step-0000008", root / "best")
    other = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, hidden_act="relu"))
    assert resume.settle_best(other, root / "step-0000008", True) is None
    assert not (root / "best").exists()


def test_resuming_with_other_tokenizer_settings_says_they_are_ignored(tmp_path, cli, trained):
    """A run keeps its tokenizer: other data.tokenizer settings on a resume were ignored unsaid, and the
    new checkpoint's config.yaml recorded them next to the tokenizer it did not describe."""
    import shutil

    run = Path(shutil.copytree(trained, tmp_path / "run", ignore=shutil.ignore_patterns("tensorboard")))
    overrides = ["data.tokenizer.lowercase=false", "data.tokenizer.vocab_size=3000", "train.max_steps=5"]
    result = cli("pretrain", "--config", run / "config.yaml", *(f"--set={o}" for o in overrides), "--quiet")
    assert result.code == 0, result.err
    [line] = [line for line in result.err_lines if "ignored, as this run keeps the tokenizer" in line]  # (prepare's)
    assert "data.tokenizer.lowercase True -> False" in line and "data.tokenizer.vocab_size 1000 -> 3000" in line
    saved = read_yaml(run / "checkpoints" / "step-0000005" / "config.yaml")["data"]["tokenizer"]
    assert saved == read_yaml(run / "checkpoints" / "step-0000004" / "config.yaml")["data"]["tokenizer"]


def test_a_new_run_resuming_another_runs_checkpoint_prepares_with_its_tokenizer(tmp_path, cli, trained, small_corpus):
    """`--resume PATH` into a run with no checkpoint (and no data.tokenizer.path): its data is prepared
    with the checkpoint's tokenizer, whose ids the weights were trained on (a new vocabulary trained on
    the other corpus would have the resume refused only after the whole corpus was prepared)."""
    from conftest import text_run

    from bertcli.data.tokenizer import read_tokenizer_json, tokenizer_identity

    other = tmp_path / "other.txt"
    other.write_text(small_corpus.read_text().replace("Python", "Snake").replace("the", "teh"))
    config = text_run(tmp_path / "new", other, "train.max_steps=6", "train.eval_every=0")
    ckpt = trained / "checkpoints" / "step-0000004"
    result = cli("pretrain", "--config", config, "--quiet", "--resume", ckpt)
    assert result.code == 0, result.err
    ids = {
        tokenizer_identity(read_tokenizer_json(f))
        for f in (ckpt / "tokenizer.json", tmp_path / "new" / "data" / "tokenizer.json")
    }
    assert len(ids) == 1
    assert (tmp_path / "new" / "checkpoints" / "step-0000006").is_dir()


def test_resuming_names_a_path_setting_changed_only_when_its_file_is_another(tmp_path):
    """A path setting spelt two ways (`../tok.json` in the run's config, resolved to RUN/../tok.json, and
    the same file with --set) names one file: no change is said; another file is."""
    (tmp_path / "run").mkdir()
    (tmp_path / "tok.json").write_text("{}")
    (tmp_path / "corpus.txt").write_text("text\n")
    (tmp_path / "other.txt").write_text("other text\n")

    def config(tokenizer: Path, corpus: Path):
        cfg = micro_config()
        data = dataclasses.replace(
            cfg.data, corpus=str(corpus), tokenizer=dataclasses.replace(cfg.data.tokenizer, path=str(tokenizer))
        )
        return dataclasses.replace(cfg, data=data)

    spelt = config(tmp_path / "run" / ".." / "tok.json", tmp_path / "run" / ".." / "corpus.txt")
    plain = config(tmp_path / "tok.json", tmp_path / "corpus.txt")
    assert resume.differences(spelt, plain, step=4, where="step-0000004", batches=None, then=None, now=None) == []
    other = config(tmp_path / "tok.json", tmp_path / "other.txt")
    lines = resume.differences(spelt, other, step=4, where="s", batches=None, then=None, now=None)
    assert len(lines) == 2 and all("data.corpus" in line for line in lines), lines  # (examples, held-out set)
    # (another tokenizer file: prepare says it or refuses it, by its contents)


def test_a_run_resumed_at_shorter_sequences_keeps_the_longest_it_trained(tmp_path, eight_steps):
    """A run trained at 32 and resumed at 24 has trained 32 positions (its encode and export's
    model_max_length), the longest over its history."""
    import shutil

    shutil.copytree(eight_steps, tmp_path, dirs_exist_ok=True)
    root = tmp_path / "checkpoints"
    assert checkpoint.read_trainer_state(root / "step-0000008")[checkpoint.TRAINED_LENGTH] == 32
    assert checkpoint.checkpoint_trained_length(root / "step-0000008") == 32
    train(tmp_path, "checkpoint.keep_last=3", "train.eval_every=0", "data.max_seq_length=24", stop_at=10)
    assert checkpoint.read_trainer_state(root / "step-0000010")[checkpoint.TRAINED_LENGTH] == 32
    assert checkpoint.checkpoint_trained_length(root / "step-0000010") == 32
    train(tmp_path, "checkpoint.keep_last=3", "train.eval_every=0", "data.max_seq_length=48", stop_at=12)
    assert checkpoint.checkpoint_trained_length(root / "step-0000012") == 48
    train(
        tmp_path,
        "checkpoint.keep_last=3",
        "train.eval_every=0",
        "data.max_seq_length=64",
        "train.max_steps=16",
        stop_at=13,
    )
    assert checkpoint.checkpoint_trained_length(root / "step-0000013") is None  # all 64 positions
    # A checkpoint written before the record: what its config says.
    state = checkpoint.read_trainer_state(root / "step-0000010")
    del state[checkpoint.TRAINED_LENGTH]
    (root / "step-0000010" / "trainer_state.json").write_text(json.dumps(state))
    assert checkpoint.checkpoint_trained_length(root / "step-0000010") == 24


def test_a_run_whose_sigint_is_ignored_keeps_ignoring_it(tmp_path, cli):
    """A script's background job starts with SIGINT ignored (POSIX): the run keeps ignoring it (as under nohup)."""
    config = write_config(tmp_path, "train.max_steps=1", "train.eval_every=0", "logging.tensorboard=false")
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ignored = cli("pretrain", "--config", config)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN, "ignored stays ignored"
    finally:
        signal.signal(signal.SIGINT, before)
    assert ignored.code == 0, ignored.err


def test_a_resume_with_nothing_to_do_changes_none_of_the_runs_checkpoints(tmp_path, cli, eight_steps):
    """`--resume OTHER/step-8` with nothing to do (or the run's own earlier step) trains nothing, so it
    sets none of the run's checkpoints aside and keeps its best."""
    import shutil

    other = Path(shutil.copytree(eight_steps, tmp_path / "other"))
    run = Path(shutil.copytree(eight_steps, tmp_path / "run"))
    root = run / "checkpoints"
    shutil.copytree(root / "step-0000008", root / "best")
    before = sorted(p.name for p in root.iterdir())
    config = write_config(run, "checkpoint.keep_last=3", "train.eval_every=0", "train.max_steps=8")
    for source, args in ((other / "checkpoints" / "step-0000008", []), (root / "step-0000004", ["--stop-at", "4"])):
        result = cli("pretrain", "--config", config, "--resume", source, *args)
        assert result.code == 0 and any(line.startswith("nothing to do") for line in result.err_lines), result.err
        assert sorted(p.name for p in root.iterdir()) == before, result.err
        assert not any("abandoned" in line or "removed" in line for line in result.err_lines), result.err
        # the next look is at the checkpoint that has the step said: another run's, or this one
        assert result.err_lines[-1] == f"next: bertcli inspect {source if not args else run}", result.err
    # Only set-aside checkpoints left: the run starts over, leaving them as they are.
    for name in ("step-0000004", "step-0000008"):
        (root / name).rename(root / f"abandoned-{name}")
    shutil.rmtree(root / "best")
    fresh = cli("pretrain", "--config", config, "--stop-at", "1")
    assert fresh.code == 0 and "done: step 1" in fresh.err, fresh.err
    assert (root / "step-0000001").is_dir() and (root / "abandoned-step-0000008").is_dir()
    assert (root / "abandoned-step-0000004").is_dir()


def test_best_of_an_earlier_held_out_set_is_replaced_at_the_next_evaluation(tmp_path, cli):
    """After a resume that changes the held-out set, best's held-out loss is not comparable with the new
    set's, so best is replaced at the next evaluation, not kept or replaced by comparing those losses."""
    config = write_config(tmp_path, "train.eval_every=4", "checkpoint.keep_last=3", "train.max_steps=12")
    assert cli("pretrain", "--config", config, "--quiet", "--stop-at", "8").code == 0
    best = tmp_path / "checkpoints" / "best"
    assert checkpoint.read_trainer_state(best)["step"] in (4, 8)
    result = cli("pretrain", "--config", config, "--stop-at", "12", "--set", "train.eval_examples=16")
    assert (
        result.code == 0
        and f"{best} is replaced at this run's next evaluation: its mlm_loss was of the set before" in result.err_lines
    ), result.err
    assert checkpoint.read_trainer_state(best)["step"] == 12, "the first evaluation on the new set"
    # Stopped after the change but before an evaluation: the next resume still knows best is of the earlier
    # set, and replaces it rather than comparing its loss again.
    assert cli("pretrain", "--config", config, "--quiet", "--set", "train.max_steps=16", "--stop-at", "13").code == 0
    changed = cli("pretrain", "--config", config, "--set", "train.max_steps=16", "--set", "train.eval_examples=8")
    assert checkpoint.read_trainer_state(best)["step"] == 16 and any(
        "is replaced at this run's next evaluation" in line for line in changed.err_lines
    )
    sets = ["--set", "train.max_steps=24", "--set", "train.eval_examples=4"]
    no_eval = cli("pretrain", "--config", config, "--quiet", *sets, "--set", "train.eval_every=0", "--stop-at", "17")
    assert no_eval.code == 0, no_eval.err  # the set changed, and no evaluation since: best is still of the set before
    resumed = cli("pretrain", "--config", config, *sets, "--set", "train.eval_every=4", "--stop-at", "20")  # (kept)
    assert resumed.code == 0 and any(
        "is replaced at this run's next evaluation" in line for line in resumed.err_lines
    ), resumed.err
    assert checkpoint.read_trainer_state(best)["step"] == 20
    same = cli(
        "pretrain", "--config", config, "--quiet", "--set", "train.max_steps=13", "--set", "train.eval_examples=16"
    )
    assert same.code == 0 and "is replaced at this run's next evaluation" not in same.err


def test_resuming_a_checkpoint_the_run_set_aside_is_refused_in_that_run(tmp_path, cli, eight_steps):
    """`--resume RUN/checkpoints/abandoned-step-8` in RUN would splice histories (a step-5 of another
    branch below it would stay a step folder of the run, its metrics records in metrics.jsonl), so it is
    refused there; from another run it resumes."""
    import shutil

    from conftest import refuse_in_fresh_interpreter

    run = Path(shutil.copytree(eight_steps, tmp_path / "run"))
    root = run / "checkpoints"
    (root / "step-0000008").rename(root / "abandoned-step-0000008")
    config = write_config(run, "checkpoint.keep_last=3", "train.eval_every=0")
    (code, imported), err = refuse_in_fresh_interpreter(
        "pretrain", "--config", config, "--resume", root / "abandoned-step-0000008", cwd=tmp_path
    )
    assert (code, imported) == ("2", "False") and "a checkpoint this run set aside, of another history" in err, err
    other = write_config(tmp_path / "other", "checkpoint.keep_last=3", "train.eval_every=0", "train.max_steps=10")
    elsewhere = cli("pretrain", "--config", other, "--quiet", "--resume", root / "abandoned-step-0000008")
    assert elsewhere.code == 0 and (tmp_path / "other" / "checkpoints" / "step-0000010").is_dir(), elsewhere.err


def test_a_damaged_best_is_named_by_inspect_and_the_intact_checkpoint_by_export(tmp_path, cli, eight_steps):
    """A run copied with its best and its newest step cut (an interrupted rsync): inspect names best's damage
    once, and export of the run refuses it, naming its damaged file."""
    import shutil

    run = Path(shutil.copytree(eight_steps, tmp_path / "run"))
    root = run / "checkpoints"
    best = Path(shutil.copytree(root / "step-0000008", root / "best"))
    for folder in (best, root / "step-0000008"):
        with open(folder / "model.safetensors", "r+b") as fh:
            fh.truncate(1000)
    text = cli("inspect", run).out
    assert re.search(rf"\n  best checkpoint +{re.escape(str(best))} \(step 8, damaged: see below\)\n", text), text
    assert f"  {best / 'model.safetensors'}: " in text, text
    assert json.loads(cli("inspect", run, "--json").out)["training"]["best_damaged"] is True
    alone = cli("inspect", best).out  # listed once, not as the checkpoint and again as best
    assert alone.count(f"{best / 'model.safetensors'}: ") == 1, alone
    result = cli("export", run, tmp_path / "out")
    assert result.code == 2 and len(result.err_lines) == 1 and f"{best / 'model.safetensors'}: " in result.err, (
        result.err
    )
    assert not (tmp_path / "out").exists()


def test_a_best_of_a_history_left_behind_is_set_aside_when_no_step_folder_holds_it(tmp_path, cli, eight_steps):
    """A best past the step `--resume` goes back to, whose step folder keep_last pruned (or that was never
    saved as one), is the only copy of those weights: it is set aside, as the later step folders are, not
    removed; one whose step folder is kept (set aside too) is removed."""
    import shutil

    run = Path(shutil.copytree(eight_steps, tmp_path / "run"))
    root = run / "checkpoints"
    best = root / "best"
    plant_best(root / "step-0000008", best, 1.0)
    state = json.loads((best / "trainer_state.json").read_text())
    (best / "trainer_state.json").write_text(json.dumps({**state, "step": 9}))  # as if step 9 was never saved
    weights = (best / "model.safetensors").read_bytes()
    config = write_config(run, "checkpoint.keep_last=3", "train.eval_every=0", "train.max_steps=8")
    result = cli("pretrain", "--config", config, "--resume", root / "step-0000004", "--stop-at", "5")
    assert result.code == 0, result.err
    assert (
        f"{best}: it is of step 9, past the step resumed from (4): a history left behind; no step folder holds its "
        "weights, so it is renamed abandoned-best"
    ) in result.err, result.err
    assert (root / "abandoned-best" / "model.safetensors").read_bytes() == weights
    report = json.loads(cli("inspect", run, "--json").out)["training"]
    assert str(root / "abandoned-best") in [c["path"] for c in report["set_aside"]]


def test_the_probe_runs_at_each_evaluation_is_logged_and_chooses_best(tmp_path, small_corpus):
    """eval.probe's figures at each evaluation in metrics.jsonl and TensorBoard, the same for the same seed;
    checkpoint.best_metric probe_accuracy keeps the evaluation with the highest probe accuracy as `best`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    words = {"code": "function class module return import", "prose": "river mountain garden evening song"}
    rows = [
        {"text": f"{w} {i}", "label": label} for label, ws in words.items() for i in range(12) for w in ws.split()[:3]
    ]
    (tmp_path / "labels.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    figures = []
    for name in ("a", "b"):
        sets = ["train.max_steps=4", "train.eval_every=2", "data.prepared_dir=../data", "eval.probe=../labels.jsonl"]
        sets.append("checkpoint.best_metric=probe_accuracy")
        pretrain(load_run(text_run(tmp_path / name, small_corpus, *sets)), quiet=True)
        evals = [r for r in map(json.loads, (tmp_path / name / "metrics.jsonl").open()) if r["split"] == "eval"]
        assert [r["step"] for r in evals] == [2, 4]
        figures.append([(r["probe_accuracy"], r["probe_macro_f1"], r["probe_majority"]) for r in evals])
    assert figures[0] == figures[1]  # the same seed: the same probe figures
    assert all(a > m for a, _, m in figures[0]), figures  # words of two kinds: above the majority class
    events = EventAccumulator(str(tmp_path / "a" / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("eval/probe_accuracy")] == [2, 4]
    best = json.loads((tmp_path / "a" / "checkpoints" / "best" / "trainer_state.json").read_text())
    assert best["eval_metrics"]["probe_accuracy"] == max(a for a, _, _ in figures[0])
    # Resumed with other labeled data, best's probe accuracy is no bar: best is replaced at the next evaluation.
    cfg = load_run(tmp_path / "a" / "config.yaml")
    other = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, probe=str(tmp_path / "other.jsonl")))
    assert resume.best_of_other_set(tmp_path / "a", other, None)
    assert not resume.best_of_other_set(tmp_path / "a", cfg, None)
    fewer = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, eval_examples=cfg.train.eval_examples // 2))
    assert not resume.best_of_other_set(tmp_path / "a", fewer, None), "the probe's figures are not of held-out text"
    mlm = dataclasses.replace(other, checkpoint=dataclasses.replace(other.checkpoint, best_metric="mlm_loss"))
    assert not resume.best_of_other_set(tmp_path / "a", mlm, None), "the held-out loss is of the same examples"
    score = checkpoint.best_score  # lower is better: a loss as it is, an accuracy negated; NaN is no score
    assert score({"probe_accuracy": 0.9}, "probe_accuracy") < score({"probe_accuracy": 0.8}, "probe_accuracy")
    assert score({"mlm_loss": 2.0}, "mlm_loss") < score({"mlm_loss": 3.0}, "mlm_loss")
    assert score({"mlm_loss": math.nan}, "mlm_loss") is None and score({}, "probe_macro_f1") is None
    from bertcli.config import Config, DataConfig, EvalConfig

    no_held_out = Config(eval=EvalConfig(probe="p.jsonl"), data=DataConfig(validation_fraction=0))
    assert [key for key, _ in no_held_out.problems()] == ["eval.probe"]  # no evaluation would ever run it
