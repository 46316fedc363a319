"""layout.py: the folder layouts bertcli writes agree with what it writes, and identify() says what a path is."""

from __future__ import annotations

import json
import shutil

from bertcli import layout
from bertcli.layout import Kind


def entries(folder):
    """Every path under `folder`, relative and '/'-separated, folders included."""
    return {path.relative_to(folder).as_posix() for path in folder.rglob("*")}


def test_what_a_run_writes_is_what_layout_names(trained):
    """A run folder, its checkpoints and its prepared data hold only names that layout.py gives them
    (ownership, pruning, inspect and prepare read them from there), and every file a complete
    checkpoint needs."""
    data = trained / "data"  # the default prepared_dir
    own = {*layout.RUN_FILES, *layout.RUN_FOLDERS, layout.CHECKPOINTS, data.name, layout.prepared_lock(data).name}
    assert {path.name for path in trained.iterdir()} <= own
    checkpoints = [path for path in layout.checkpoints_dir(trained).iterdir()]
    assert checkpoints and all(layout.STEP_DIR.match(path.name) or path.name == layout.BEST for path in checkpoints)
    for folder in checkpoints:
        assert set(layout.CHECKPOINT_FILES) <= entries(folder) <= layout.CHECKPOINT.paths, folder
    prepared = entries(data)
    assert {layout.MANIFEST, *layout.TOKENIZER_FILES, layout.UNITS, layout.INDEX} <= prepared
    assert all(layout.PREPARED.holds(rel) for rel in prepared), sorted(prepared)


def test_identify_says_what_each_folder_is(trained, tmp_path):
    newest = layout.list_checkpoints(trained)[-1][1]
    found = layout.identify(trained)
    assert (found.kind, found.config, found.started) == (Kind.RUN, trained / layout.RUN_CONFIG, True)
    assert [path for _, path in found.checkpoints] == [path for _, path in layout.list_checkpoints(trained)]
    assert layout.identify(newest).kind is Kind.CHECKPOINT
    assert layout.identify(trained / "data").kind is Kind.PREPARED
    assert layout.identify(trained / layout.RUN_CONFIG).kind is Kind.FILE
    assert layout.identify(tmp_path / "nothing").kind is Kind.MISSING
    assert layout.identify(tmp_path).kind is Kind.OTHER  # an empty folder

    lacking = tmp_path / "lacking"
    shutil.copytree(newest, lacking)
    (lacking / layout.TRAINING_STATE).unlink()
    found = layout.identify(lacking)
    assert (found.kind, found.missing) == (Kind.INCOMPLETE_CHECKPOINT, (layout.TRAINING_STATE,))

    unstarted = tmp_path / "unstarted"
    unstarted.mkdir()
    shutil.copy(trained / layout.RUN_CONFIG, unstarted / layout.RUN_CONFIG)
    found = layout.identify(unstarted)
    assert (found.kind, found.started, found.checkpoints) == (Kind.RUN, False, ())

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / layout.HF_CONFIG).write_text(json.dumps({"model_type": "bert"}))
    assert (layout.identify(hf).kind, layout.identify(hf).config) == (Kind.HF, hf / layout.HF_CONFIG)
    (hf / layout.SENTENCE_MODULES).write_text("[]")
    assert layout.identify(hf).kind is Kind.SENTENCE  # its settings are sbert.py's to read


def test_inspect_names_the_files_an_incomplete_checkpoint_lacks(trained, tmp_path, cli):
    """A checkpoint folder that lost a file is said to be one, with what it lacks (inspect used to
    read its config.yaml as a run config and report the run's training instead)."""
    lacking = tmp_path / "step-0000004"
    shutil.copytree(layout.list_checkpoints(trained)[-1][1], lacking)
    (lacking / layout.TRAINING_STATE).unlink()
    result = cli("inspect", lacking)
    assert result.code == 2, result.err
    assert f"not a complete checkpoint (missing {layout.TRAINING_STATE})" in result.err
