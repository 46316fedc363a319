"""Untrusted files: a malicious pickle planted wherever bertcli reads must never run."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
from conftest import without_file_hashes, write_config


class Payload:
    """Unpickling this creates a file: proof that code ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def plant(path, marker) -> None:
    path.write_bytes(pickle.dumps({"optimizer": Payload(str(marker)), "step": 4}))


def test_a_malicious_training_state_is_refused_and_never_run(tmp_path, cli):
    config = write_config(tmp_path / "run", "train.max_steps=4", "train.eval_every=0")
    assert cli("pretrain", "--config", config, "--quiet").code == 0
    marker = tmp_path / "pwned"
    ckpt = tmp_path / "run" / "checkpoints" / "step-0000004"
    plant(ckpt / "training_state.pt", marker)
    without_file_hashes(ckpt)  # an attacker rewrites the record too
    before = {p.name: p.read_bytes() for p in ckpt.iterdir()}
    result = cli("pretrain", "--config", config, "--set", "train.max_steps=8", "--quiet")
    errors = [line for line in result.err_lines if line.startswith("bertcli: error:")]
    assert result.code == 1 and len(errors) == 1, result.err[-500:]
    assert "step-0000004" in errors[0] and "training_state.pt" in errors[0], errors
    assert "weights_only" not in result.err and "Traceback" not in result.err and "Warning" not in result.err
    assert not marker.exists(), "the pickle's code ran"
    # The refused checkpoint stays where it was, as it was (the user's to look at), and no step was trained.
    assert {p.name: p.read_bytes() for p in ckpt.iterdir()} == before
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["step-0000004"]


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.safetensors"])
def test_a_malicious_weights_file_in_an_imported_folder_is_refused(tmp_path, cli, name):
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "hf"
    config = transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=48
    )
    transformers.BertForPreTraining(config).save_pretrained(folder)
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "pwned"
    plant(folder / name, marker)
    (folder / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(94)])
    )
    (tmp_path / "in.txt").write_text("w1 w2\n")
    result = cli("encode", "--model", folder, tmp_path / "in.txt")
    assert result.code == 2 and len(result.err_lines) == 1
    assert ("safetensors only" in result.err) if name == "pytorch_model.bin" else ("cannot read weights" in result.err)
    assert not marker.exists(), "the pickle's code ran"


def snapshot(root, skip):
    return {p: p.stat().st_mtime_ns for p in root.rglob("*") if skip not in p.parents and p != skip}


def test_paths_in_a_tampered_manifest_are_never_followed(tmp_path, cli, small_corpus):
    import json

    from conftest import text_run

    run = tmp_path / "run"
    config = text_run(run, small_corpus, "train.max_steps=2", "train.eval_every=0")
    assert cli("prepare", "--config", config, "--quiet").code == 0
    manifest_path = run / "data" / "manifest.json"
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "victim.txt").write_text("keep me\n")
    manifest = json.loads(manifest_path.read_text())
    for entry in manifest["corpus"]["files"]:
        entry["path"] = "../../outside/victim.txt"
    manifest["tokenizer"]["source"] = "../../outside/tokenizer.json"
    manifest_path.write_text(json.dumps(manifest))
    before = snapshot(tmp_path, run)
    assert cli("prepare", "--config", config, "--quiet").code == 0
    assert cli("pretrain", "--config", config, "--quiet").code == 0
    assert cli("inspect", run / "data").code == 0
    # Shard names and splits that would point outside: the manifest is refused as damaged and rebuilt.
    manifest["dtype"] = "object"
    manifest["splits"]["../../outside/x"] = manifest["splits"].pop("valid")
    manifest_path.write_text(json.dumps(manifest))
    damaged = cli("inspect", run / "data")
    assert damaged.code == 2 and damaged.err_lines[-1].startswith("bertcli: error: "), damaged.err
    assert str(run / "data") in damaged.err_lines[-1] and "manifest.json" in damaged.err_lines[-1], damaged.err
    rebuilt = cli("prepare", "--config", config, "--quiet")
    assert rebuilt.code == 0 and str(run / "data") in rebuilt.err, rebuilt.err
    assert cli("inspect", run / "data").code == 0  # rebuilt whole
    assert snapshot(tmp_path, run) == before, "nothing outside the run folder was written"
    assert (tmp_path / "outside" / "victim.txt").read_text() == "keep me\n"


@pytest.mark.parametrize("command", ["export", "encode"])
@pytest.mark.parametrize("damage", ["linked vocab.txt", "linked weights", "nan weights"])
def test_a_link_or_non_finite_weights_in_a_checkpoint_is_refused(tmp_path, cli, trained, command, damage):
    """A checkpoint's files are bertcli's own: a link is never followed out of it (its target could be any
    file, which export would publish), and weights with NaN are no model (encode would print NaN vectors)."""
    import shutil

    import safetensors.torch

    ckpt = tmp_path / "ckpt"
    shutil.copytree(trained / "checkpoints" / "step-0000004", ckpt)
    name = "vocab.txt" if damage == "linked vocab.txt" else "model.safetensors"
    target = tmp_path / "secret.txt"
    if damage == "linked vocab.txt":
        target.write_text("[PAD]\nhunter2\n")
    elif damage == "linked weights":  # a good file, but not the checkpoint's own
        shutil.copyfile(ckpt / name, target)
    else:
        weights = safetensors.torch.load_file(ckpt / name)
        weights["bert.encoder.layer.0.output.dense.weight"][3, 5] = float("nan")
        safetensors.torch.save_file(weights, ckpt / name)
    if damage.startswith("linked"):
        (ckpt / name).unlink()
        (ckpt / name).symlink_to(target)
    without_file_hashes(ckpt)  # the checks below the record of the files' SHA-256
    (tmp_path / "in.txt").write_text("a line of text\n")
    args = (
        ["export", ckpt, tmp_path / "out"] if command == "export" else ["encode", "--model", ckpt, tmp_path / "in.txt"]
    )
    result = cli(*args)
    assert result.code == 2 and len(result.err_lines) == 1 and result.out == "", result.err
    assert result.err_lines[0].startswith(f"bertcli: error: {ckpt / name}")
    assert ("symbolic link" if damage.startswith("linked") else "NaN or inf") in result.err
    assert not (tmp_path / "out").exists() and "hunter2" not in result.err


def edit_tokenizer(ckpt: Path, file: str) -> None:
    """Edit a checkpoint's tokenizer file: one line of vocab.txt, or tokenizer.json's lower-casing
    turned off (its vocabulary, and so vocab.txt, unchanged)."""
    import json

    if file == "vocab.txt":
        lines = (ckpt / file).read_text().splitlines()
        lines[200] = "zzzhacked"
        (ckpt / file).write_text("\n".join(lines) + "\n")
    else:
        spec = json.loads((ckpt / file).read_text())
        spec["normalizer"]["lowercase"] = False
        (ckpt / file).write_text(json.dumps(spec))


@pytest.mark.parametrize("command", ["export", "encode"])
@pytest.mark.parametrize("file", ["vocab.txt", "tokenizer.json"])
def test_an_edited_tokenizer_file_in_a_checkpoint_is_never_used(tmp_path, cli, trained, file, command):
    """The tokenizer files must be the ones the model was trained with: a vocab.txt with one line edited
    (read alone) or a tokenizer.json with its lower-casing turned off gives other ids, silently."""
    import shutil

    ckpt = Path(shutil.copytree(trained / "checkpoints" / "step-0000004", tmp_path / "ckpt"))
    edit_tokenizer(ckpt, file)
    (tmp_path / "in.txt").write_text("a line of text\n")
    args = (
        ["export", ckpt, tmp_path / "out"] if command == "export" else ["encode", "--model", ckpt, tmp_path / "in.txt"]
    )
    edited = (ckpt / file).read_bytes()
    result = cli(*args)
    assert result.code == 2 and result.out == "" and len(result.err_lines) == 1, result.err
    assert result.err_lines[0].startswith(f"bertcli: error: {ckpt / file}: ") and "SHA-256" in result.err, result.err
    assert not (tmp_path / "out").exists()
    assert (ckpt / file).read_bytes() == edited  # refused, not repaired behind the user's back


def test_a_checkpoint_from_before_tokenizer_hashes_still_needs_one_vocabulary(tmp_path, cli, trained):
    import json
    import shutil

    ckpt = Path(shutil.copytree(trained / "checkpoints" / "step-0000004", tmp_path / "ckpt"))
    state = json.loads((ckpt / "trainer_state.json").read_text())
    del state["tokenizer_sha256"]
    state["format_version"] = 2  # written before checkpoints had to record it
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    assert cli("export", ckpt, tmp_path / "good").code == 0
    edit_tokenizer(ckpt, "vocab.txt")
    result = cli("export", ckpt, tmp_path / "out")
    assert result.code == 2 and len(result.err_lines) == 1, result.err
    assert result.err_lines[0].startswith(f"bertcli: error: {ckpt / 'vocab.txt'}: "), result.err
    assert "tokenizer.json" in result.err, result.err  # the file it must match
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("strip", ["everything", "files_sha256", "tokenizer_sha256", "config entry"])
def test_a_checkpoint_stripped_of_its_records_is_damaged(tmp_path, cli, trained, strip):
    """A trainer_state.json cut down to `{}`, or without its SHA-256 records, must not be read as a
    checkpoint from before the records: an edited config.yaml would pass, giving other vectors with
    exit 0. Every checkpoint of the current format holds them."""
    import json
    import shutil

    ckpt = Path(shutil.copytree(trained / "checkpoints" / "step-0000004", tmp_path / "ckpt"))
    if strip != "tokenizer_sha256":  # (that record guards the tokenizer files: nothing else changes)
        config = (ckpt / "config.yaml").read_text()
        (ckpt / "config.yaml").write_text(config.replace("hidden_act: gelu", "hidden_act: relu"))
    state = json.loads((ckpt / "trainer_state.json").read_text())
    if strip == "everything":
        state = {}
    elif strip == "config entry":
        del state["files_sha256"]["config.yaml"]
    else:
        del state[strip]
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    (tmp_path / "in.txt").write_text("hello world\n")
    for args in (("export", ckpt, tmp_path / "out"), ("encode", "--model", ckpt, tmp_path / "in.txt")):
        result = cli(*args)
        assert result.code == 2 and len(result.err_lines) == 1 and result.out == "", result.err
        assert result.err_lines[0].startswith(f"bertcli: error: {ckpt / 'trainer_state.json'}: "), result.err
        record = {"everything": "_sha256", "config entry": "files_sha256"}.get(strip, strip)
        assert record in result.err, result.err  # the record it lacks
    assert not (tmp_path / "out").exists()


def test_resuming_never_takes_the_edited_tokenizer_of_a_checkpoint(tmp_path, cli, trained):
    # An edited tokenizer.json in the run's checkpoint must not be laundered: preparing the data again
    # with it (the run's own tokenizer) and resuming. The checkpoint is damage, like any other.
    import shutil

    run = Path(shutil.copytree(trained, tmp_path / "run"))
    data_tokenizer = (run / "data" / "tokenizer.json").read_bytes()
    edit_tokenizer(run / "checkpoints" / "step-0000004", "tokenizer.json")
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    result = cli(
        "pretrain", "--config", run / "config.yaml", "--set", "train.max_steps=6", "--set", f"output_dir={run}"
    )
    assert result.code == 1 and "Traceback" not in result.err
    errors = [line for line in result.err_lines if line.startswith("bertcli: error:")]
    assert errors == result.err_lines[-1:], result.err
    assert errors[0].startswith(f"bertcli: error: {run / 'checkpoints'}: "), result.err
    assert "step-0000004" in errors[0] and "tokenizer.json" in errors[0], result.err
    assert (run / "data" / "tokenizer.json").read_bytes() == data_tokenizer
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == checkpoints  # nothing trained, nothing moved


def test_non_finite_weights_in_a_hugging_face_folder_are_refused(tmp_path, cli, trained):
    import safetensors.torch

    assert cli("export", trained, tmp_path / "hf").code == 0
    file = tmp_path / "hf" / "model.safetensors"
    weights = safetensors.torch.load_file(file)
    weights["bert.embeddings.LayerNorm.weight"][0] = float("inf")
    safetensors.torch.save_file(weights, file)
    (tmp_path / "in.txt").write_text("a line of text\n")
    result = cli("encode", "--model", tmp_path / "hf", tmp_path / "in.txt")
    assert result.code == 2 and result.out == "" and len(result.err_lines) == 1, result.err
    assert result.err_lines[0].startswith(f"bertcli: error: {file}: "), result.err
    assert "bert.embeddings.LayerNorm.weight" in result.err and "NaN or inf" in result.err, result.err


def test_a_linked_tokenizer_file_in_the_prepared_data_never_reaches_a_checkpoint(tmp_path, cli, trained):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns("checkpoints", "metrics.jsonl", "tensorboard"))
    (tmp_path / "secret.txt").write_text("[PAD]\nhunter2\n")
    (run / "data" / "vocab.txt").unlink()
    (run / "data" / "vocab.txt").symlink_to(tmp_path / "secret.txt")
    result = cli("pretrain", "--config", run / "config.yaml", "--quiet", "--set", "train.max_steps=2")
    assert "Traceback" not in result.err and "hunter2" not in result.err
    if result.code != 0:  # refused (it may also be prepared again)
        assert result.code == 2 and result.err_lines[-1].startswith(f"bertcli: error: {run / 'data' / 'vocab.txt'}")
    assert all("hunter2" not in path.read_text() for path in run.rglob("vocab.txt") if not path.is_symlink())


@pytest.mark.parametrize("lock", [".lock", ".data.lock"])
def test_a_lock_file_that_is_a_symbolic_link_is_never_written_through(tmp_path, cli, lock, small_corpus):
    """Taking a lock opens the lock file for writing: through a link it would truncate the target."""
    from conftest import text_run

    config = text_run(tmp_path / "run", small_corpus, "train.max_steps=2")
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me\n")
    (tmp_path / "run" / lock).symlink_to(victim)
    result = cli("pretrain", "--config", config, "--quiet")
    assert result.code == 2 and "Traceback" not in result.err and len(result.err_lines) == 1, result.err
    assert result.err_lines[0].startswith(f"bertcli: error: {tmp_path / 'run' / lock}"), result.err
    assert "symbolic link" in result.err, result.err
    assert victim.read_text() == "keep me\n"
    assert (tmp_path / "run" / lock).is_symlink()  # left for the user to remove


@pytest.mark.parametrize(
    "command",
    [
        "encode-layer",
        "encode-flipped",
        "export-flipped",
        "export-flipped-best",
        "pretrain-other-model",
        "pretrain-other-tokenizer",
        "pretrain-other-tokenizer-size",
    ],
)
def test_a_checkpoint_encode_or_export_cannot_use_is_refused_before_torch_loads(tmp_path, trained, command):
    """A run's --layer out of range, weights that fail their SHA-256 record, another model or tokenizer:
    checked from the files before torch is imported (after it, the refusal took 4-6 s and 250-265 MB)."""
    import shutil

    from conftest import refuse_in_fresh_interpreter

    run = Path(shutil.copytree(trained, tmp_path / "run"))
    ckpt = run / "checkpoints" / "step-0000004"
    (tmp_path / "in.txt").write_text("hello\n")
    if command == "encode-layer":
        args, needles = ("encode", "--model", run, "--layer", "9", "in.txt"), ["--layer 9"]
    elif command == "pretrain-other-model":
        args = (
            "pretrain",
            "--config",
            run / "config.yaml",
            "--set",
            "model.hidden_act=relu",
            "--set",
            "train.max_steps=6",
        )
        needles = [str(ckpt), "model.hidden_act", "'gelu'", "'relu'"]
    elif command.startswith("pretrain-other-tokenizer"):
        words = (run / "data" / "vocab.txt").read_text().splitlines()
        words[-1], words[-2] = words[-2], words[-1]  # the same size, two ids swapped
        # Another size too: it is another tokenizer, not another model.vocab_size (the config sets none).
        words += ["zzzextra"] if command.endswith("size") else []
        (tmp_path / "other.txt").write_text("\n".join(words) + "\n")
        tokenizer = f"data.tokenizer.path={tmp_path / 'other.txt'}"
        args = ("pretrain", "--config", run / "config.yaml", "--set", tokenizer, "--set", "train.max_steps=6")
        needles = [str(tmp_path / "other.txt")]
    elif command == "export-flipped-best":  # a run's best: the line names its damaged file
        best = Path(shutil.copytree(ckpt, run / "checkpoints" / "best"))
        weights = bytearray((best / "model.safetensors").read_bytes())
        weights[len(weights) // 2] ^= 1
        (best / "model.safetensors").write_bytes(bytes(weights))
        needles = [f"bertcli: error: {best / 'model.safetensors'}: ", "SHA-256"]
        args = ("export", run, "out")
    else:
        weights = bytearray((ckpt / "model.safetensors").read_bytes())
        weights[len(weights) // 2] ^= 1
        (ckpt / "model.safetensors").write_bytes(bytes(weights))
        args = ("encode", "--model", ckpt, "in.txt") if command == "encode-flipped" else ("export", ckpt, "out")
        needles = [f"bertcli: error: {ckpt / 'model.safetensors'}: ", "SHA-256"]
    out, err = refuse_in_fresh_interpreter(*args, cwd=tmp_path)
    assert out == ["2", "False"], (out, err)
    assert len(err.splitlines()) == 1 and err.startswith("bertcli: error: "), err
    assert all(needle in err for needle in needles), (needles, err)
    assert not (tmp_path / "out").exists()


def test_resume_of_a_checkpoint_whose_files_changed_is_refused_before_torch_loads(tmp_path, trained):
    """--resume PATH of a checkpoint whose training state fails its SHA-256 record: the hashes are
    compared before torch is imported (after it, the refusal took 4-5 s and 265 MB)."""
    import shutil

    from conftest import refuse_in_fresh_interpreter

    run = Path(shutil.copytree(trained, tmp_path / "run"))
    ckpt = Path(shutil.copytree(run / "checkpoints" / "step-0000004", tmp_path / "other"))
    state = bytearray((ckpt / "training_state.pt").read_bytes())
    state[len(state) // 2] ^= 1
    (ckpt / "training_state.pt").write_bytes(bytes(state))
    out, err = refuse_in_fresh_interpreter(
        "pretrain", "--config", run / "config.yaml", "--resume", ckpt, "--set", "train.max_steps=6", cwd=tmp_path
    )
    assert out == ["1", "False"], (out, err)
    assert len(err.splitlines()) == 1 and err.startswith(f"bertcli: error: {ckpt} "), err
    assert "training_state.pt" in err and "SHA-256" in err, err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-0000004"]  # nothing set aside


def test_a_file_edited_in_place_after_it_was_hashed_is_hashed_anew(tmp_path):
    """sha256_of keeps the hashes of large files for the second check of the same weights: an edit of
    the same size with its modification time set back still changes the ctime, and is hashed anew."""
    import hashlib
    import os

    from bertcli.store import HASH_CACHE_BYTES, sha256_of

    path = tmp_path / "model.safetensors"
    data = bytearray(os.urandom(HASH_CACHE_BYTES + 1))
    path.write_bytes(bytes(data))
    assert sha256_of(path) == sha256_of(path) == hashlib.sha256(data).hexdigest()
    stat = path.stat()
    data[len(data) // 2] ^= 1
    with open(path, "r+b") as fh:  # in place: the same inode and size
        fh.write(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert sha256_of(path) == hashlib.sha256(data).hexdigest()
