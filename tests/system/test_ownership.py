"""bertcli never deletes or moves what it did not write: every target that holds the user's files,
or is, contains or lies inside an input, is refused (exit 2, one line naming it) and every file
is byte-identical afterwards; bertcli's own folders are still replaced."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from conftest import text_run

from bertcli import layout
from bertcli.store import not_owned


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under `root`: a file's sha256, a link's target, a folder's mark (but the .lock
    that every pretrain creates in its output_dir)."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + [f for f in files if f != ".lock"]:
            path = Path(folder) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                found[rel] = "-> " + os.readlink(path)
            elif path.is_dir():
                found[rel] = "folder"
            else:
                found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def refused(result, path: Path) -> None:
    assert result.code == 2, result.err
    assert len(result.err_lines) == 1 and str(path) in result.err, result.err


@pytest.fixture
def user_folder(tmp_path, small_corpus) -> Path:
    """A folder as a user has it: a corpus, notes, a config from `bertcli init . --corpus`."""
    home = tmp_path / "home"
    home.mkdir()
    shutil.copyfile(small_corpus, home / "corpus.txt")
    (home / "notes.md").write_text("my notes\n")
    text_run(home, home / "corpus.txt")
    return home


@pytest.fixture
def run_copy(trained, tmp_path) -> Path:
    """A copy of the trained run, so that a test that fails (on old code) spoils only its own."""
    return Path(shutil.copytree(trained, tmp_path / "run"))


# ------------------------------------------------------------------------------------- prepare


def test_prepared_dir_equal_to_the_run_folder_is_refused(user_folder, cli, monkeypatch):
    monkeypatch.chdir(user_folder)  # a path typed with --set is relative to where it is typed
    before = snapshot(user_folder)
    result = cli("prepare", "--config", user_folder / "config.yaml", "--set", "data.prepared_dir=.", "--quiet")
    refused(result, user_folder)
    assert "data.prepared_dir" in result.err
    assert snapshot(user_folder) == before


def test_prepared_dir_naming_a_folder_of_unrelated_files_is_refused(user_folder, cli, tmp_path, monkeypatch):
    monkeypatch.chdir(user_folder)
    precious = tmp_path / "precious"
    (precious / "sub").mkdir(parents=True)
    (precious / "thesis.tex").write_text("chapter 1\n")
    (precious / "sub" / "data.bin").write_bytes(bytes(range(256)))
    before = snapshot(tmp_path)
    result = cli(
        "prepare", "--config", user_folder / "config.yaml", "--set", "data.prepared_dir=../precious", "--quiet"
    )
    refused(result, "precious")
    assert snapshot(tmp_path) == before


def test_a_folder_with_a_manifest_not_of_bertcli_is_refused_not_said_to_be_prepared_again(user_folder, cli, tmp_path):
    """Only the refusal of X as not bertcli's: no line before it saying that X is prepared again (which
    would say the opposite)."""
    mine = tmp_path / "mydata"
    (mine / "units").mkdir(parents=True)
    (mine / "manifest.json").write_text("{}")
    before = snapshot(tmp_path)
    result = cli("prepare", "--config", user_folder / "config.yaml", "--set", f"data.prepared_dir={mine}")
    refused(result, mine)
    assert len(result.err_lines) == 1, result.err
    assert snapshot(tmp_path) == before


def test_prepared_dir_naming_the_corpus_file_is_refused(user_folder, cli, monkeypatch):
    monkeypatch.chdir(user_folder)
    before = snapshot(user_folder)
    result = cli("prepare", "--config", user_folder / "config.yaml", "--set", "data.prepared_dir=corpus.txt", "--quiet")
    refused(result, user_folder / "corpus.txt")
    assert snapshot(user_folder) == before


def test_prepared_data_the_user_added_to_is_not_replaced_but_bertcli_s_own_is(user_folder, cli):
    config = user_folder / "config.yaml"
    assert cli("prepare", "--config", config, "--quiet").code == 0
    data = user_folder / "data"
    assert not_owned(data, layout.PREPARED) is None, "a prepared folder is bertcli's own"
    (data / "README.txt").write_text("what I did\n")
    before = snapshot(user_folder)
    result = cli("prepare", "--config", config, "--force", "--quiet")
    refused(result, data)
    assert "README.txt" in result.err
    assert snapshot(user_folder) == before
    (data / "README.txt").unlink()
    # A symbolic link to prepared data: the folder it points to is replaced, the link is kept.
    data.rename(user_folder / "real-data")
    data.symlink_to("real-data")
    assert cli("prepare", "--config", config, "--force", "--quiet").code == 0
    assert data.is_symlink() and (user_folder / "real-data" / "manifest.json").is_file()
    assert not [p for p in user_folder.iterdir() if p.name.startswith(".tmp-")]


# ----------------------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("name", ["step-0000006", "best"])
def test_a_checkpoint_folder_bertcli_did_not_write_is_refused_before_training(tmp_path, small_corpus, cli, name):
    config = text_run(tmp_path, small_corpus, "train.max_steps=6")  # evaluates at step 6: writes best
    theirs = tmp_path / "checkpoints" / name
    theirs.mkdir(parents=True)
    (theirs / "results.csv").write_text("step,loss\n8,1.0\n")
    before = snapshot(tmp_path)
    result = cli("pretrain", "--config", config, "--quiet")
    refused(result, theirs)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("name", ["best", "step-0000008"])
def test_a_symbolic_link_in_checkpoints_is_refused_not_written_through(run_copy, cli, tmp_path, name):
    """A `best` linked to step-0000004 (of this run or another's) was replaced by the new best: the
    folder kept its name and held another step, silently."""
    other = Path(shutil.copytree(run_copy / "checkpoints" / "step-0000004", tmp_path / "other-run-step-4"))
    for target in (run_copy / "checkpoints" / "step-0000004", other):
        link = run_copy / "checkpoints" / name
        link.symlink_to(target, target_is_directory=True)
        before = snapshot(run_copy) | snapshot(target)
        overrides = ("--set", "train.max_steps=8", "--set", "train.eval_every=4", "--set", "checkpoint.save_every=4")
        result = cli("pretrain", "--config", run_copy / "config.yaml", *overrides, "--quiet")
        refused(result, link)
        assert "symbolic link" in result.err
        assert snapshot(run_copy) | snapshot(target) == before
        link.unlink()


@pytest.mark.parametrize("name", ["best", "step-0000099", "checkpoints"])
def test_encode_and_export_of_a_run_never_read_another_runs_checkpoint_through_a_link(run_copy, cli, tmp_path, name):
    """best, a step folder or checkpoints/ itself linked to another run's checkpoint of the same model:
    encode and export would read it as this run's (its vectors, its weights published)."""
    other = Path(shutil.copytree(run_copy, tmp_path / "other-run"))
    if name == "checkpoints":
        shutil.rmtree(run_copy / "checkpoints")
        link = run_copy / "checkpoints"
        link.symlink_to(other / "checkpoints", target_is_directory=True)
    else:
        link = run_copy / "checkpoints" / name
        if link.exists():
            shutil.rmtree(link)
        link.symlink_to(other / "checkpoints" / "step-0000004", target_is_directory=True)
    (tmp_path / "in.txt").write_text("hello\n")
    for args in (("encode", "--model", run_copy, tmp_path / "in.txt"), ("export", run_copy, tmp_path / "out")):
        result = cli(*args)
        refused(result, link)
        assert "symbolic link" in result.err and result.out == ""
    assert not (tmp_path / "out").exists()


def test_encode_and_export_of_a_run_follow_its_config_output_dir(run_copy, cli, tmp_path):
    """A run folder whose config.yaml keeps the checkpoints elsewhere (output_dir): encode and export use
    output_dir's, as pretrain and inspect do, never the folder's own stale checkpoints/ (another
    history's weights). Both there: refused; only output_dir's: those are read."""
    import re

    folder = tmp_path / "config-only"
    folder.mkdir()
    config = (run_copy / "config.yaml").read_text()
    assert re.search(r"^output_dir: .*$", config, flags=re.M)
    (folder / "config.yaml").write_text(re.sub(r"^output_dir: .*$", f"output_dir: {run_copy}", config, flags=re.M))
    (tmp_path / "in.txt").write_text("hello\n")
    ours = cli("encode", "--model", folder, tmp_path / "in.txt", "-f", "tsv")
    assert ours.code == 0 and ours.out == cli("encode", "--model", run_copy, tmp_path / "in.txt", "-f", "tsv").out
    assert cli("export", folder, tmp_path / "out").code == 0
    shutil.copytree(run_copy / "checkpoints", folder / "checkpoints")  # the folder's own, stale
    for args in (("encode", "--model", folder, tmp_path / "in.txt"), ("export", folder, tmp_path / "out2")):
        result = cli(*args)
        assert result.code == 2 and len(result.err_lines) == 1, result.err
        assert f"{folder}: checkpoints/" in result.err and f"output_dir {run_copy}" in result.err, result.err


def test_an_incomplete_best_is_passed_over_and_the_checkpoint_read_named(run_copy, cli, tmp_path):
    best = Path(shutil.copytree(run_copy / "checkpoints" / "step-0000004", run_copy / "checkpoints" / "best"))
    (best / "model.safetensors").unlink()  # a copy cut short
    (tmp_path / "in.txt").write_text("hello\n")
    result = cli("encode", "--model", run_copy, tmp_path / "in.txt")
    assert result.code == 0, result.err
    newest = layout.list_checkpoints(run_copy)[-1][1]
    assert any(line.startswith(f"bertcli encode: the vectors of {newest} (step ") for line in result.err_lines), (
        result.err
    )


def test_init_force_of_a_run_in_use_is_refused_and_of_a_trained_one_keeps_its_checkpoints(run_copy, cli):
    """init --force is refused on a run that is training; on a trained one it replaces config.yaml alone
    (the next pretrain names the settings that differ from its checkpoints' when it resumes)."""
    from bertcli import store

    before = snapshot(run_copy)
    with store.run_lock(run_copy):
        result = cli("init", run_copy, "--force")
    assert result.code == 1 and len(result.err_lines) == 1, result.err
    assert result.err_lines[0].startswith(f"bertcli: error: {run_copy} ") and "in use" in result.err, result.err
    assert snapshot(run_copy) == before
    config = (run_copy / "config.yaml").read_bytes()
    result = cli("init", run_copy, "--force")
    assert result.code == 0 and (run_copy / "config.yaml").read_bytes() != config, result.err
    assert {k: v for k, v in snapshot(run_copy).items() if k != "config.yaml"} == {
        k: v for k, v in before.items() if k != "config.yaml"
    }


def test_an_old_checkpoint_the_user_added_to_is_never_pruned(run_copy, cli):
    old = run_copy / "checkpoints" / "step-0000004"
    assert not_owned(old, layout.CHECKPOINT) is None, "a checkpoint is bertcli's own"
    (old / "notes.txt").write_text("the good one\n")
    before = snapshot(run_copy)
    # Saves at 8 and 12 and keeps the last 2: pruning would delete step 4.
    result = cli("pretrain", "--config", run_copy / "config.yaml", "--set", "train.max_steps=12", "--quiet")
    refused(result, old)
    assert snapshot(run_copy) == before


# --------------------------------------------------------------------------------------- export


@pytest.mark.parametrize("target", ["checkpoint", "run folder", "inside"])
def test_export_onto_its_source_checkpoint_is_refused(run_copy, cli, target):
    ckpt = layout.list_checkpoints(run_copy)[-1][1]
    out = {"checkpoint": ckpt, "run folder": run_copy, "inside": ckpt / "hf"}[target]
    before = snapshot(run_copy)
    result = cli("export", ckpt, out, "--force")
    refused(result, ckpt)
    assert snapshot(run_copy) == before


def test_export_force_replaces_only_an_earlier_export(run_copy, cli, tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "config.json").write_text('{"mine": true}\n')
    before = snapshot(precious)
    refused(cli("export", run_copy, precious, "--force"), precious)
    assert snapshot(precious) == before
    # Without --force too: said at once (no "pass --force", which would refuse it too)
    result = cli("export", run_copy, precious)
    refused(result, precious)
    assert "--force" not in result.err and snapshot(precious) == before
    (tmp_path / "victim.csv").write_text("a,b\n")
    result = cli("export", run_copy, tmp_path / "victim.csv")
    assert result.code == 2 and "victim.csv is a file, not a folder, so bertcli left it untouched" in result.err

    out = tmp_path / "hf"
    assert cli("export", run_copy, out).code == 0
    assert not_owned(out, layout.EXPORT) is None, "an export is bertcli's own"
    again = cli("export", run_copy, out)  # an earlier export: --force replaces it
    assert again.code == 2 and "already exists; pass --force to replace it" in again.err, again.err
    assert cli("export", run_copy, out, "--force").code == 0, "an earlier export is replaced"
    (out / "eval.txt").write_text("scores\n")
    before = snapshot(out)
    result = cli("export", run_copy, out, "--force")
    refused(result, out)
    assert "eval.txt" in result.err and snapshot(out) == before


# ----------------------------------------------------------------------------------------- init


def test_init_force_replaces_only_a_bertcli_config_and_nothing_else(tmp_path, cli):
    (tmp_path / "config.yaml").write_text("services:\n  web:\n    image: nginx\n")
    (tmp_path / "notes.md").write_text("my notes\n")
    before = snapshot(tmp_path)
    refused(cli("init", tmp_path, "--force"), tmp_path / "config.yaml")
    assert snapshot(tmp_path) == before

    (tmp_path / "config.yaml").write_text("# my notes on the runs to try\n---\n...\n")  # YAML's empty document
    before = snapshot(tmp_path)
    refused(cli("init", tmp_path, "--force"), tmp_path / "config.yaml")  # (an empty YAML document is no bertcli config)
    assert snapshot(tmp_path) == before

    (tmp_path / "config.yaml").write_text("\n")  # an empty file: nothing to lose
    assert cli("init", tmp_path, "--force").code == 0
    (tmp_path / "config.yaml").unlink()
    assert cli("init", tmp_path).code == 0
    assert cli("init", tmp_path, "--force", "--preset", "small").code == 0, "a bertcli config is overwritten"
    assert "preset 'small'" in (tmp_path / "config.yaml").read_text()
    # (the run's lock file, which init --force takes to check that no command is using the run, stays)
    assert (tmp_path / "notes.md").read_text() == "my notes\n"
    assert {p.name for p in tmp_path.iterdir()} - {layout.LOCK} == {"notes.md", "config.yaml"}


def test_init_force_never_writes_through_a_linked_config(tmp_path, cli):
    """A config.yaml that is a link to a shared template: init --force would replace the template by
    the preset."""
    shared = tmp_path / "templates"
    shared.mkdir()
    assert cli("init", shared, "--preset", "small").code == 0  # a bertcli config: the ownership check passes
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").symlink_to(shared / "config.yaml")
    before = snapshot(tmp_path)
    result = cli("init", run, "--force")
    refused(result, run / "config.yaml")
    assert "symbolic link" in result.err
    assert snapshot(tmp_path) == before


# --------------------------------------------------------------------------------------- encode


@pytest.mark.parametrize(
    "target",
    [
        "input",
        "model file",
        "folder",
        "in a checkpoint",
        "in checkpoints/",
        "in prepared data",
        "in an export",
        "run config",
        "run metrics",
        "run metrics left behind",  # (a resume would overwrite it)
        "run lock",
        "prepared data's lock",
        "in tensorboard/",
    ],
)
def test_encode_output_never_replaces_an_input(run_copy, cli, tmp_path, target):
    """Nor is it written into a folder bertcli owns: the next pretrain, prepare or export --force
    would refuse the folder for holding a file bertcli did not write."""
    from bertcli.export import export

    lines = tmp_path / "lines.txt"
    lines.write_text("The first line.\nThe second line.\n")
    ckpt = layout.list_checkpoints(run_copy)[-1][1]
    out = {
        "input": lines,
        "model file": ckpt / "model.safetensors",
        "folder": tmp_path,
        "in a checkpoint": ckpt / "v.npy",
        "in checkpoints/": ckpt.parent / "v.npy",
        "in prepared data": run_copy / "data" / "v.npy",
        "in an export": (export(run_copy, tmp_path / "hf") if target == "in an export" else tmp_path) / "v.npy",
        "run config": run_copy / "config.yaml",
        "run metrics": run_copy / "metrics.jsonl",
        "run metrics left behind": run_copy / "metrics.left-behind.jsonl",
        "run lock": run_copy / ".lock",
        "prepared data's lock": run_copy / ".data.lock",
        "in tensorboard/": run_copy / "tensorboard" / "v.npy",
    }[target]
    before = snapshot(tmp_path)
    result = cli("encode", lines, "--model", run_copy, "--format", "npy", "--output", out)
    refused(result, out)
    assert snapshot(tmp_path) == before


def test_removing_a_linked_folder_removes_the_link_only(tmp_path):
    """A folder bertcli removes (a damaged unit, an old checkpoint) that is a symbolic link loses its
    link, never what it points to, and leaves no temporary name behind."""
    from bertcli import store

    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "kept.txt").write_text("yours")
    (tmp_path / "parent").mkdir()
    link = tmp_path / "parent" / "step-0000004"
    link.symlink_to(target, target_is_directory=True)
    store.remove_folder(link)
    assert not link.is_symlink() and not list((tmp_path / "parent").iterdir())
    assert (target / "kept.txt").read_text() == "yours"


def test_a_folder_replaced_is_never_missing_to_a_reader(tmp_path, monkeypatch):
    """`best` replaced in two renames (old aside, new in) was missing for a moment: an encode of the
    run then took the newest step instead, or read a step folder pruned under it (exit 1). Where the
    system swaps folders in one step (Linux), every rename and removal sees a whole folder in place."""
    from bertcli import store

    final = tmp_path / "best"
    final.mkdir()
    (final / "model.safetensors").write_text("old")
    seen = []

    def watching(real):
        def call(*args, **kwargs):
            seen.append((final / "model.safetensors").read_text() if final.is_dir() else None)
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(store.os, "replace", watching(os.replace))
    monkeypatch.setattr(store.shutil, "rmtree", watching(shutil.rmtree))
    if not store.exchange(tmp_path / "best", tmp_path / "best"):
        pytest.skip("this system cannot swap two folders in one step")
    with store.folder(final, lambda target: None) as tmp:
        (tmp / "model.safetensors").write_text("new")
    assert (final / "model.safetensors").read_text() == "new"
    assert seen and None not in seen, seen
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best"]


@pytest.mark.parametrize("kind", ["hf", "sentence", "root"])
def test_an_output_dir_that_is_a_model_folder_or_the_root_is_refused(run_copy, cli, tmp_path, kind):
    """A run trained into a Hugging Face or sentence-transformers folder would be mixed up with that
    model: inspect and encode of the folder read the model, not the run; and output_dir=/ would write
    the run's files at the root of the file system."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bert"}')
    if kind == "sentence":
        (folder / "modules.json").write_text("[]")
    output = Path("/") if kind == "root" else folder
    before = snapshot(tmp_path)
    result = cli("pretrain", "--config", run_copy / "config.yaml", "--set", f"output_dir={output}", "--quiet")
    assert result.code == 2 and len(result.err_lines) == 1, result.err
    if kind == "root":
        assert "is the root of the file system: set output_dir to a folder of its own" in result.err
    else:
        folder_kind = "a sentence-transformers folder" if kind == "sentence" else "a Hugging Face folder"
        assert f"output_dir {folder} is {folder_kind}: the run's checkpoints there would be mixed up" in result.err
    assert snapshot(tmp_path) == before


def test_export_of_a_model_folder_holding_checkpoints_says_one_line(run_copy, cli, tmp_path):
    """Such a folder (a run trained into a model folder, before that was refused) gives its error alone:
    no "checkpoints/best is None, so it is passed over" before it (a leaked None, two lines)."""
    folder = tmp_path / "model"
    shutil.copytree(layout.list_checkpoints(run_copy)[-1][1], folder / "checkpoints" / "best")
    (folder / "config.json").write_text('{"model_type": "bert"}')
    (folder / "modules.json").write_text("[]")
    result = cli("export", folder, tmp_path / "out")
    assert result.code == 2 and len(result.err_lines) == 1 and "None" not in result.err, result.err


@pytest.mark.parametrize(
    "target, what",
    [
        ("checkpoints/step-0000004/x", "lies inside"),
        ("checkpoints", "is a run's checkpoints folder"),
        ("data", "is prepared data"),
        ("export", "is an export"),
        ("tensorboard/x", "inside the tensorboard/ folder"),
    ],
)
def test_an_output_dir_inside_what_bertcli_owns_is_refused(run_copy, cli, tmp_path, target, what):
    """A run trained into another run's checkpoint, checkpoints/, prepared data or an export (exit 0),
    whose owner then refused it for holding files bertcli did not write."""
    if target == "export":
        assert cli("export", run_copy, run_copy / "export").code == 0
    (run_copy / "tensorboard").mkdir(exist_ok=True)
    output = run_copy / target
    config = tmp_path / "other" / "config.yaml"
    config.parent.mkdir()
    shutil.copyfile(run_copy / "config.yaml", config)
    before = snapshot(run_copy)
    result = cli("pretrain", "--config", config, "--set", f"output_dir={output}", "--quiet")
    refused(result, output)
    assert what in result.err
    assert snapshot(run_copy) == before
    if target.startswith("checkpoints/"):  # init DIR sets output_dir: a checkpoint's config.yaml stays its own
        forced = cli("init", output.parent, "--force")
        assert forced.code == 2 and "is a checkpoint of bertcli's" in forced.err, forced.err
        assert snapshot(run_copy) == before


def test_a_checkpoints_folder_that_is_a_symbolic_link_is_refused(run_copy, cli, tmp_path):
    """RUN/checkpoints linked to another run's: pretrain wrote its steps and best there and pruned the
    other run's step-0000010 (exit 0); every reader of the other run then used this run's model."""
    other = Path(shutil.copytree(run_copy, tmp_path / "other", ignore=shutil.ignore_patterns("tensorboard")))
    shutil.rmtree(run_copy / "checkpoints")
    (run_copy / "checkpoints").symlink_to(other / "checkpoints", target_is_directory=True)
    before = snapshot(other)
    overrides = ("--set", "train.max_steps=8", "--set", "checkpoint.save_every=2", "--set", "checkpoint.keep_last=1")
    result = cli("pretrain", "--config", run_copy / "config.yaml", *overrides, "--quiet")
    refused(result, run_copy / "checkpoints")
    assert "symbolic link" in result.err
    assert snapshot(other) == before
