"""The command line: exit codes, one-line errors, stdout for data only, inspect."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, run_process, write_config

from bertcli import __version__


def test_version_and_help(cli):
    result = cli("--version")
    assert result.code == 0 and result.out.strip() == f"bertcli {__version__}"
    for args in (["-h"], ["init", "-h"], ["pretrain", "--help"], ["inspect", "-h"]):
        result = cli(*args)
        assert result.code == 0 and "Usage" in result.out, args


def test_python_dash_m_and_usage_errors_exit_2():
    proc = run_process("pretrain")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "bertcli: error: Missing option '--config' / '-c'. (see 'bertcli pretrain --help')"
    ]
    assert proc.stdout == ""


def test_init_writes_a_config_and_refuses_to_overwrite(tmp_path, cli):
    result = cli("init", tmp_path / "run", "--preset", "small", "--set", "train.max_steps=50")
    assert result.code == 0 and result.out == ""
    assert f"next: bertcli pretrain --config {tmp_path / 'run' / 'config.yaml'}" in result.err
    text = (tmp_path / "run" / "config.yaml").read_text()
    assert "max_steps: 50" in text and "hidden_size: 512" in text
    again = cli("init", tmp_path / "run", "--preset", "tiny")
    assert again.code == 2 and len(again.err_lines) == 1 and "--force" in again.err
    assert (tmp_path / "run" / "config.yaml").read_text() == text, "nothing was overwritten"
    forced = cli("init", tmp_path / "run", "--preset", "tiny", "--force")
    assert forced.code == 0 and "hidden_size: 128" in (tmp_path / "run" / "config.yaml").read_text()
    bad = cli("init", tmp_path / "other", "--preset", "huge")
    assert bad.code == 2 and len(bad.err_lines) == 1 and "huge" in bad.err
    assert not (tmp_path / "other").exists()


def test_init_writes_a_non_ascii_path_as_typed(tmp_path, cli, small_corpus):
    """The path "ünï cödé/corp us.txt" is written as typed, not as "\\xFCn\\xEF c\\xF6d\\xE9/corp us.txt"
    (valid YAML, unreadable in a file meant to be read and edited)."""
    import shutil

    from bertcli.resolve import load_run

    corpus = tmp_path / "ünï cödé" / "corp us.txt"
    corpus.parent.mkdir()
    shutil.copy(small_corpus, corpus)
    assert cli("init", tmp_path / "rün 1", "--corpus", corpus).code == 0
    config = tmp_path / "rün 1" / "config.yaml"
    assert f'corpus: "{corpus}"' in config.read_text(encoding="utf-8") or f"corpus: {corpus}" in config.read_text(
        encoding="utf-8"
    )
    assert load_run(config).data.corpus == str(corpus)


def test_bad_config_exits_2_with_one_line_per_problem_and_no_traceback(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("model:\n  hidden_sze: 64\n  num_attention_heads: two\ndata:\n  masked_lm_prob: 1.5\n")
    proc = run_process("pretrain", "--config", path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 3, lines  # unknown key + wrong type + impossible value, all at once
    assert all(line.startswith(f"bertcli: error: {path}: ") for line in lines)
    assert "did you mean 'hidden_size'" in lines[0] and "expected an integer" in lines[1]
    assert "data.masked_lm_prob: must be in (0, 1), got 1.5" in lines[2]
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    path.write_text(
        "model:\n  hidden_size: 100\n  num_attention_heads: 3\ndata:\n  masked_lm_prob: 1.5\n"
        "train:\n  mlm_weight: 0\n  nsp_weight: 0\n"
    )
    proc = run_process("pretrain", "--config", path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 3, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (["pretrain", "--config", "missing.yaml"], "config file not found"),
        (["pretrain", "--config", "{cfg}", "--set", "train.max_stepz=3"], "did you mean 'max_steps'"),
        (["pretrain", "--config", "{cfg}", "--set", "nonsense"], "expected section.key=value"),
        (["pretrain", "--config", "{cfg}", "--device", "tpu"], "--device 'tpu'"),
        (["pretrain", "--config", "{cfg}", "--resume", "nowhere"], "no such checkpoint"),
        (["inspect", "nowhere"], "no such file or folder"),
        (["inspect", "{dir}"], "not a config file, a run folder"),
    ],
)
def test_usage_errors(tmp_path, cli, args, needle):
    cfg = write_config(tmp_path / "run")
    (tmp_path / "empty").mkdir()
    args = [a.format(cfg=cfg, dir=tmp_path / "empty") for a in args]
    result = cli(*args)
    assert result.code == 2, result.err
    assert len(result.err_lines) == 1 and needle in result.err and "Traceback" not in result.err
    assert result.out == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_without_a_gpu_is_a_usage_error(tmp_path, cli):
    """A CPU build of torch is refused from its files before torch loads (after the import: 4-5 s);
    a CUDA build on a machine without a GPU, after asking the driver."""
    from conftest import refuse_in_fresh_interpreter

    cpu_build = torch.version.cuda is None and torch.version.hip is None
    result = cli("pretrain", "--config", write_config(tmp_path), "--device", "cuda")
    assert result.code == 2 and ("a CPU build" if cpu_build else "no CUDA GPU") in result.err, result.err
    if cpu_build:
        (tmp_path / "in.txt").write_text("hello\n")
        for args in (
            ["pretrain", "--config", tmp_path / "config.yaml", "--device", "cuda:1"],
            ["encode", "--model", tmp_path / "nothing", tmp_path / "in.txt", "--device", "cuda"],
        ):
            (code, imported), err = refuse_in_fresh_interpreter(*args, cwd=tmp_path)
            assert (code, imported) == ("2", "False") and "is a CPU build, without CUDA" in err, err


def test_quiet_pretrain_says_errors_warnings_and_the_summary_only(tmp_path, cli, trained):
    """--quiet on a text run that resumes and prepares again: no "resuming from", no "up to date", no
    "preparing ... with the run's own tokenizer", no "prepared ..." line."""
    import shutil

    run = Path(shutil.copytree(trained, tmp_path / "run"))
    summary = ("done: ", "checkpoint: ", "next: ", "warning: ", "resuming step-")  # the last: settings that differ
    for step, fault in ((6, None), (8, lambda: shutil.rmtree(run / "data"))):
        if fault:
            fault()
        result = cli("pretrain", "--config", run / "config.yaml", "--quiet", "--set", f"train.max_steps={step}")
        assert result.code == 0 and f"done: step {step}" in result.err, result.err
        assert [line for line in result.err_lines if not line.startswith(summary)] == [], result.err


def test_quiet_pretrain_leaves_out_the_corpus_lines_that_are_no_warnings(tmp_path, cli):
    """Under --quiet the corpus folder's skipped files and the vocabulary's sample are not said: they
    are how the work goes (shown without --quiet), not warnings."""
    corpus = tmp_path / "corpus"
    (corpus / ".ipynb_checkpoints").mkdir(parents=True)
    text = "".join(f"Document {i} has a first sentence. And a second one here.\n\n" for i in range(80))
    (corpus / "a.txt").write_text(text)
    (corpus / ".ipynb_checkpoints" / "a-checkpoint.txt").write_text(text)
    (corpus / "README.md").write_text("# not text\n")
    args = (f"data.corpus={corpus}", "model.vocab_size=null", "data.tokenizer.vocab_size=200")
    cfg = write_config(tmp_path / "run", *args, "data.tokenizer.sample_chars=2000", "train.max_steps=2")
    quiet = cli("pretrain", "--config", cfg, "--quiet")
    assert quiet.code == 0 and [line.split(":")[0] for line in quiet.err_lines] == ["done", "checkpoint", "next"], (
        quiet.err
    )
    other = write_config(tmp_path / "other", *args, "data.tokenizer.sample_chars=2000")
    said = cli("prepare", "--config", other)  # not quiet (and a vocabulary to train): both lines
    assert said.code == 0 and any(f"{corpus}: skipped 1 hidden" in line for line in said.err_lines), said.err
    assert any(line.startswith("the vocabulary was trained on a sample") for line in said.err_lines), said.err


def test_pretrain_then_inspect_run_checkpoint_and_config(tmp_path, cli):
    cfg = write_config(tmp_path / "run")
    result = cli("pretrain", "--config", cfg, "--quiet", "--set", "optimizer.warmup_steps=24")
    assert result.code == 0, result.err
    assert result.out == "", "pretrain writes nothing to stdout"
    assert "done: step 12" in result.err and "resolved config:" not in result.err  # --quiet: the summary only
    assert len(result.err_lines) == 4, result.err  # a warning, done, checkpoint, next
    assert result.err_lines[0].startswith(
        "warning: optimizer.warmup_steps=24 is past train.max_steps=12: the learning rate rises to 50% of optimizer.lr"
    )

    report = json.loads(cli("inspect", tmp_path / "run", "--json").out)
    assert report["kind"] == "run"
    assert report["training"]["step"] == 12
    assert report["training"]["last_metrics"]["step"] == 12
    assert set(report["training"]["last_metrics"]) >= {"loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc"}
    assert [c["step"] for c in report["training"]["checkpoints"]] == [8, 12]
    assert report["parameters"]["total"] == 25_730

    ckpt = json.loads(cli("inspect", tmp_path / "run" / "checkpoints" / "step-0000008", "--json").out)
    assert ckpt["kind"] == "checkpoint" and ckpt["training"]["step"] == 8

    text = cli("inspect", cfg)
    assert text.code == 0 and "parameters" in text.out and "25,730" in text.out and "training FLOPs" in text.out


def test_inspect_a_run_with_damaged_files_shows_the_rest_and_names_them(tmp_path, cli, trained):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns("tensorboard"))
    newest = run / "checkpoints" / "step-0000004"
    (newest / "trainer_state.json").write_text('{"step": 4,')  # cut
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join([lines[0], '{"step": "4", "split": "train"}', *lines[1:]]) + "\n")
    result = cli("inspect", run)
    assert result.code == 0, result.err
    assert f"{newest / 'trainer_state.json'}: " in result.out
    said = [line for line in result.out.splitlines() if f"{run / 'metrics.jsonl'}: " in line]
    assert len(said) == 1 and "line 2" in said[0], result.out
    report = json.loads(cli("inspect", run, "--json").out)["training"]
    assert len(report["damaged"]) == 2 and report["step"] == 4 and report["last_metrics"]["step"] == 4
    alone = cli("inspect", newest)
    assert alone.code == 0 and f"{newest / 'trainer_state.json'}: " in alone.out
    # (not "step 0 / 4" and "tokens seen 0" for a checkpoint of step 4, read as real)
    shown: dict[str, str] = {}  # the first line of each label: the training section's
    for line in alone.out.splitlines():
        shown.setdefault(line.strip().split("  ")[0], line)
    assert "unknown" in shown["step"] and "unknown" in shown["tokens seen"], alone.out
    report = json.loads(cli("inspect", newest, "--json").out)["training"]
    assert report["step"] is None and report["tokens_seen"] is None

    cut = newest.parent / "cut"  # weights cut short: a damaged line too, not an error (as a flipped byte)
    shutil.copytree(trained / "checkpoints" / "step-0000004", cut)
    with open(cut / "model.safetensors", "r+b") as fh:
        fh.truncate(1000)
    result = cli("inspect", cut)
    assert result.code == 0 and f"{cut / 'model.safetensors'}: " in result.out, result
    alone = Path(shutil.copytree(newest, tmp_path / "alone"))  # out of its run: no run folder or list to show
    result = cli("inspect", alone)  # (no "output_dir ." nor "checkpoints (0) none yet")
    assert result.code == 0 and "output_dir" not in result.out and "checkpoints (" not in result.out, result.out


def test_inspect_of_a_config_sizes_the_vocabulary_from_data_of_its_own_inputs_only(tmp_path, cli, small_corpus):
    """A config whose prepared_dir holds data another config prepared (another corpus and vocabulary
    size) is not shown with that data's vocabulary and parameter count."""
    documents = small_corpus.read_text().split("\n\n")
    (tmp_path / "a.txt").write_text("\n\n".join(documents[:30]) + "\n")
    (tmp_path / "b.txt").write_text("\n\n".join(documents[30:]) + "\n")
    for name, corpus, size in (("one", "a.txt", 300), ("two", "b.txt", 400)):
        (tmp_path / f"{name}.yaml").write_text(
            f"data:\n  corpus: {corpus}\n  tokenizer: {{vocab_size: {size}}}\n  validation_fraction: 0\n"
        )
    assert cli("prepare", "--config", tmp_path / "one.yaml", "--quiet").code == 0
    trained = json.loads((tmp_path / "data" / "manifest.json").read_text())["tokenizer"]["vocab_size"]
    one = json.loads(cli("inspect", tmp_path / "one.yaml", "--json").out)["architecture"]
    assert one["vocab_size"] == trained and one["vocab_size_note"] == f"from the tokenizer in {tmp_path / 'data'}"
    two = json.loads(cli("inspect", tmp_path / "two.yaml", "--json").out)["architecture"]
    assert two["vocab_size"] == 400 and "holds data of other inputs" in two["vocab_size_note"], two


def test_inspect_of_a_run_whose_config_was_edited_to_another_model_warns(tmp_path, cli, trained):
    """The config's architecture shown beside checkpoints of another is warned of."""
    import shutil

    run = Path(shutil.copytree(trained, tmp_path / "run", ignore=shutil.ignore_patterns("tensorboard")))
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("  hidden_act: gelu", "  hidden_act: relu"))
    line = (
        "the architecture above is the config's; pretrain would refuse it: cannot resume from "
        f"{run / 'checkpoints' / 'step-0000004'}: model.hidden_act='gelu' in the checkpoint vs 'relu' in the config"
    )
    assert line in cli("inspect", run).out
    assert json.loads(cli("inspect", run, "--json").out)["training"]["warnings"][0].startswith(line)
    assert "warnings" not in json.loads(cli("inspect", trained, "--json").out)["training"]


def test_inspect_of_a_run_whose_checkpoint_is_pruned_while_read_makes_the_report_again(cli, trained, monkeypatch):
    """inspect RUN while the run saves every step: a step pruned while read ("step-N/
    trainer_state.json: No such file or directory") makes the report again, not exit 1."""
    from bertcli import summary

    real, calls = summary.checkpoint.change, []

    def pruned_once(path, *args):  # the run's next save prunes the step while inspect reads it
        calls.append(path)
        if len(calls) == 2:  # (the first is read_config's, of config.yaml alone)
            raise FileNotFoundError(2, "No such file or directory", str(path / "trainer_state.json"))
        return real(path, *args)

    monkeypatch.setattr(summary.checkpoint, "change", pruned_once)
    result = cli("inspect", trained)
    assert result.code == 0 and len(calls) >= 3 and "step" in result.out, result.err


def test_inspect_says_what_to_pass_for_paths_it_does_not_read(tmp_path, cli, trained):
    """One list of what inspect reads, whatever the miss; a part of a run or of a sentence-transformers
    model is answered with the folder to pass."""
    import shutil

    accepted = "a prepared-data folder"
    missing = cli("inspect", tmp_path / "nope")
    assert missing.code == 2 and accepted in missing.err and "Hugging Face (or sentence-transformers)" in missing.err
    (tmp_path / "empty").mkdir()
    other = cli("inspect", tmp_path / "empty")
    assert other.code == 2 and "a prepared-data folder (with manifest.json)" in other.err
    assert "Hugging Face (or sentence-transformers) model folder" in other.err
    part = cli("inspect", trained / "checkpoints")
    assert part.err_lines == [
        f"bertcli: error: {trained / 'checkpoints'}: a run's checkpoints folder, not a checkpoint: pass the run "
        f"folder, {trained}"
    ]
    model = tmp_path / "st"  # an export: a sentence-transformers layout, its BERT at the top, its pooling in 1_Pooling
    assert cli("export", trained, model).code == 0 and (model / "1_Pooling" / "config.json").is_file()
    (tmp_path / "in.txt").write_text("a line\n")
    for args, command in (  # not "copy tokenizer files there" (encode), nor read as a model (init)
        (["inspect", model / "1_Pooling"], "inspect"),
        (["encode", "--model", model / "1_Pooling", tmp_path / "in.txt"], "encode --model"),
        (["init", tmp_path / "cont", "--init-from", model / "1_Pooling"], "init --init-from"),
    ):
        pooling = cli(*args)
        assert pooling.code == 2 and pooling.err_lines == [
            f"bertcli: error: {model / '1_Pooling'}: a module of sentence-transformers model {model}, not a model: "
            f"{command} {model}"
        ], pooling.err
    assert not (tmp_path / "cont").exists()
    run = Path(shutil.copytree(trained, tmp_path / "run" / "sub", ignore=shutil.ignore_patterns("tensorboard")))
    config = run / "config.yaml"  # its output_dir written with "..": shown as the folder it names
    config.write_text(config.read_text().replace("output_dir: .", "output_dir: ../sub"))
    assert json.loads(cli("inspect", run, "--json").out)["training"]["output_dir"] == str(run)


def test_inspect_names_a_checkpoint_file_changed_since_it_was_written(tmp_path, cli, trained):
    """A flipped byte in the weights (still finite) is what encode, export and resume refuse by its
    SHA-256: inspect, of the checkpoint or of its run, names it too instead of a clean report."""
    import shutil

    run = Path(shutil.copytree(trained, tmp_path / "run", ignore=shutil.ignore_patterns("tensorboard")))
    weights = run / "checkpoints" / "step-0000004" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x01  # the low bits of the last float
    weights.write_bytes(bytes(data))
    for path in (run, weights.parent):
        result = cli("inspect", path)
        said = [line for line in result.out.splitlines() if f"{weights}: " in line]
        assert result.code == 0 and len(said) == 1 and "SHA-256" in said[0], result.out
        damaged = json.loads(cli("inspect", path, "--json").out)["training"]["damaged"]
        assert [d for d in damaged if d.startswith(f"{weights}: ") and "SHA-256" in d], damaged


def test_inspect_a_run_names_damage_to_its_prepared_data(tmp_path, cli, trained):
    """inspect RUN checks the run's prepared data as inspect RUN/data does: damage is one line of the report."""
    import shutil

    run = Path(shutil.copytree(trained, tmp_path / "run", ignore=shutil.ignore_patterns("tensorboard")))
    unit = json.loads((run / "data" / "manifest.json").read_text())["units"][0]["key"]
    tokens = run / "data" / "units" / unit / "train" / "tokens.bin"
    with open(tokens, "r+b") as fh:
        fh.truncate(tokens.stat().st_size // 2)
    problem = f"units/{unit}/train/tokens.bin holds {tokens.stat().st_size:,} bytes"
    data = cli("inspect", run / "data")
    assert data.code == 2 and problem in data.err
    result = cli("inspect", run)
    assert result.code == 0, result.err
    [line] = [line for line in result.out.splitlines() if problem in line]
    assert f"{run / 'data'}: the prepared data is damaged ({problem}" in line
    assert any(problem in d for d in json.loads(cli("inspect", run, "--json").out)["training"]["damaged"])


def test_inspect_base_and_large_parameter_counts(cli):
    for preset, total in (("base", 110_106_428), ("large", 336_226_108)):
        report = json.loads(cli("inspect", REPO / "configs" / f"{preset}.yaml", "--json").out)
        assert report["parameters"]["total"] == total


def test_inspect_never_imports_torch(tmp_path, cli, trained):
    """inspect is torch-free (1.6 to 3.4 s and 250 to 320 MB went to importing torch): a config, a run,
    a checkpoint, prepared data and a Hugging Face folder are inspected in one process whose imports
    of torch fail (finding its files still works), with the exit code and the report's figures those of the ordinary inspect."""
    export = tmp_path / "export"
    assert cli("export", trained, export).code == 0
    paths = [trained / "config.yaml", trained, trained / "checkpoints" / "step-0000004", trained / "data", export]
    script = f"""
import importlib.abc, json, sys
class NoTorch(importlib.abc.Loader):  # torch may be found (its build is read from its files), not run
    def create_module(self, spec):
        raise ImportError("torch imported by inspect")
class NoTorchFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        for finder in sys.meta_path[1:]:
            if name.split(".")[0] == "torch" and (spec := finder.find_spec(name, path, target)):
                spec.loader = NoTorch()
                return spec
sys.meta_path.insert(0, NoTorchFinder())
from bertcli.cli import main
codes = []
for path in {[str(p) for p in paths]!r}:
    sys.argv = ["bertcli", "inspect", path, "--json"]
    try:
        main()
    except SystemExit as exc:
        codes.append(exc.code)
print(json.dumps(codes))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    reports, codes = result.stdout.splitlines()[:-1], json.loads(result.stdout.splitlines()[-1])
    assert codes == [0] * len(paths), result.stderr
    for path, line in zip(paths, reports):
        assert json.loads(line) == json.loads(cli("inspect", path, "--json").out)


def test_closed_pipe_exits_quietly():
    # One process (they are slow to start): pipefail makes the exit code bertcli's, not head's.
    proc = subprocess.run(
        f"set -o pipefail; {sys.executable} -m bertcli inspect configs/base.yaml | head -1",
        shell=True,
        cwd=REPO,
        capture_output=True,
        text=True,
        executable="/bin/bash",
    )
    assert proc.stdout.startswith("config: configs/base.yaml") and proc.stderr == "" and proc.returncode == 0


def test_an_eof_error_is_a_failure_not_an_interrupt(cli, monkeypatch):
    """Click turns an EOFError into Abort, which main() used to report as Ctrl-C (exit 130)."""
    import bertcli.summary

    def cut_short(path):
        raise EOFError("Compressed file ended before the end-of-stream marker was reached")

    monkeypatch.setattr(bertcli.summary, "inspect_path", cut_short)
    result = cli("inspect", "anything")
    assert result.code == 1 and "interrupted" not in result.err
    assert result.err_lines == [
        "bertcli: error: EOFError: Compressed file ended before the end-of-stream marker "
        "was reached (run again with --debug for the traceback)"
    ]


def test_next_hints_name_the_real_folders_and_run_as_printed(tmp_path, cli, monkeypatch, small_corpus):
    """Each command's last line is a command to paste: quoted paths (with spaces), the real output folder."""
    import shlex

    from conftest import TEXT

    def hints(result) -> list[list[str]]:
        assert result.code == 0, result.err
        line = result.err_lines[-1]
        assert line.startswith("next: ")
        return [shlex.split(command) for command in line.removeprefix("next: ").split("   or   ")]

    monkeypatch.chdir(tmp_path)
    sets = [a for o in TEXT + ["train.max_steps=2", "train.eval_every=0", "output_dir=out dir"] for a in ("--set", o)]
    [pretrain] = hints(cli("init", "my runs/demo", "--corpus", small_corpus, *sets))
    assert pretrain == ["bertcli", "pretrain", "--config", "my runs/demo/config.yaml"]
    inspect, pretrain = hints(
        cli("prepare", "--config", "my runs/demo/config.yaml", "--quiet", "--set", "data.prepared_dir=prep data")
    )
    assert inspect == ["bertcli", "inspect", "prep data"]  # a path typed here is relative to here
    assert cli(*inspect[1:]).code == 0
    result = cli(*pretrain[1:])  # the same overrides: the data just prepared, not a new copy
    assert "is up to date" in result.err and not (tmp_path / "my runs" / "demo" / "data").exists()
    [inspect] = hints(result)
    assert inspect == ["bertcli", "inspect", "out dir"]
    report = json.loads(cli(*inspect[1:], "--json").out)
    assert report["kind"] == "run" and report["training"]["step"] == 2


def test_help_at_80_columns_is_wrapped_whole(cli, monkeypatch):
    """Rich's help cut words with "…" at 80 columns and showed every flag as <bool>."""
    from bertcli.cli import app

    monkeypatch.setenv("COLUMNS", "80")
    commands = [c.name or c.callback.__name__ for c in app.registered_commands]
    for args in ([], *([name] for name in commands)):
        result = cli(*args, "--help")
        assert result.code == 0 and "Usage: bertcli" in result.out, args
        assert (
            "…" not in result.out
            and "<bool>" not in result.out
            and "<list[str]>" not in result.out.split("Arguments")[0]
        )
        assert all(len(line) <= 80 and not line.endswith("...") for line in result.out.splitlines()[1:]), result.out
        if not args:
            assert all(name in result.out for name in commands)


def test_a_stop_under_torchrun_is_said_by_rank_0_only(cli, monkeypatch, tmp_path):
    """Every process of a job stops on a signal; the other ranks printed their own stop line too."""
    import bertcli.trainer
    from bertcli import console
    from bertcli.errors import Interrupted

    def stopped(*args, **kwargs):
        raise Interrupted("stopped by SIGTERM at step 3; checkpoint None; run the same command again to resume", 15)

    monkeypatch.setattr(bertcli.trainer, "pretrain", stopped)
    config = write_config(tmp_path)
    try:
        console.speak(False)  # as runtime.setup leaves a rank other than 0
        other = cli("pretrain", "--config", config)
    finally:
        console.speak(True)
    assert other.code == 143 and other.err == ""
    main = cli("pretrain", "--config", config)
    assert main.code == 143 and main.err_lines == [
        "bertcli: stopped by SIGTERM at step 3; checkpoint None; run the same command again to resume"
    ]


def test_a_model_too_large_is_refused_from_its_numbers_at_once(cli, tmp_path):
    """The refusal is worked out from the config's numbers (a model of 10 million layers built on the meta
    device takes minutes and gigabytes), and names the key to lower."""
    import time

    from bertcli.config_load import preset_config
    from bertcli.model import BertForPreTraining
    from bertcli.sizes import parameter_count

    for overrides in (
        [],
        ["model.vocab_size=1001", "model.pad_vocab_multiple=1"],
        ["model.type_vocab_size=5", "model.num_hidden_layers=3"],
    ):
        model = preset_config("tiny", ["model.vocab_size=8000", *overrides]).model
        assert parameter_count(model) == sum(p.numel() for p in BertForPreTraining(model).parameters())
    config = write_config(tmp_path, "model.num_hidden_layers=10000000")
    start = time.perf_counter()
    result = cli("pretrain", "--config", config)
    assert time.perf_counter() - start < 1.0
    assert result.code == 2 and len(result.err_lines) == 1
    assert "85,440,008,642 parameters need 1,273.2 GiB" in result.err and "model.num_hidden_layers" in result.err, (
        result.err
    )
    unsized = write_config(
        tmp_path / "text", "data.corpus=sample", "model.vocab_size=null", "model.num_hidden_layers=10000000"
    )
    result = cli("pretrain", "--config", unsized)  # no tokenizer yet: refused before preparing the corpus
    assert result.code == 2 and "too large" in result.err and not (tmp_path / "text" / "data").exists()


def test_init_takes_the_keyword_corpora_and_says_warnings(tmp_path, cli):
    """README: --corpus sets data.corpus; sample and synthetic were looked up as paths ("corpus not found")."""
    from bertcli.resolve import load_run

    for corpus in ("sample", "synthetic"):
        result = cli("init", tmp_path / corpus, "--corpus", corpus)
        assert result.code == 0, result.err
        cfg = load_run(tmp_path / corpus / "config.yaml")
        assert cfg.data.corpus == corpus and (cfg.model.vocab_size is None) == (corpus == "sample")
    result = cli("init", tmp_path / "warm", "--set", "optimizer.warmup_steps=1000")
    assert result.code == 0 and result.err_lines[1].startswith(
        "warning: optimizer.warmup_steps=1,000 is past train.max_steps=500"
    ), result.err


def test_encode_export_and_init_say_a_checkpoint_was_set_aside(tmp_path, cli, trained):
    """A run's abandoned-step-N (a history left behind) encoded, exported or started from as any
    checkpoint is noted as such; a step folder is not noted."""
    import shutil

    run = Path(shutil.copytree(trained, tmp_path / "run", ignore=shutil.ignore_patterns("tensorboard")))
    step = run / "checkpoints" / "step-0000004"
    aside = Path(shutil.copytree(step, step.with_name("abandoned-step-0000004")))

    def noted(lines: list[str]) -> list[str]:  # the notes that name the folder set aside
        return [line for line in lines if "note:" in line and str(aside) in line and "set aside" in line]

    (tmp_path / "in.txt").write_text("a line of text\n")
    encoded = cli("encode", "--model", aside, tmp_path / "in.txt")
    assert encoded.code == 0 and len(noted(encoded.err_lines)) == 1, encoded.err
    exported = cli("export", aside, tmp_path / "hf")
    assert exported.code == 0 and len(noted(exported.err_lines)) == 1, exported.err
    init = cli("init", tmp_path / "next", "--init-from", aside)
    assert init.code == 0 and len(noted(init.err_lines)) == 1, init.err
    inspected = cli("inspect", aside)  # (not shown with the run's best and step folders, as one of them)
    assert inspected.code == 0 and noted(inspected.out.splitlines()[1:2]), inspected.out
    assert "best checkpoint" not in inspected.out and "step-0000004" not in inspected.out.replace(str(aside), "")
    assert noted(["note: " + json.loads(cli("inspect", aside, "--json").out)["note"]])
    kept = cli("export", run, tmp_path / "hf2")
    assert kept.code == 0 and "set aside" not in kept.err, kept.err


def test_inspect_says_where_its_last_figures_are_from_and_sums_what_it_shows(tmp_path, cli, trained):
    """A run killed past its last log step: that step's figures are not shown as the run's ("step 28",
    "last mlm_loss" of step 20); five folders of 16.0 MiB each sum to 80.0 MiB, not "79.9 MiB"."""
    import shutil

    run = Path(shutil.copytree(trained, tmp_path / "run", ignore=shutil.ignore_patterns("tensorboard")))
    records = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 4, records
    earlier = 2  # as if the run logged at step 2, then saved step 4 and was killed
    (run / "metrics.jsonl").write_text("".join(json.dumps({**r, "step": earlier}) + "\n" for r in records))
    root = run / "checkpoints"
    for n in range(5):  # 5 x 0.04 MiB: each shows 0.0, as their sum does
        (root / f"abandoned-step-000000{n}").mkdir()
        (root / f"abandoned-step-000000{n}" / "model.safetensors").write_bytes(b"\0" * 45_000)
    text = cli("inspect", run).out
    assert re.search(rf"\n  last logged +at step {earlier}\n", text) and re.search(r"\n  step +4 / 4\n", text), text
    assert "set aside (5, 0.0 MiB: yours to delete" in text, text
    shutil.copytree(trained, tmp_path / "again", ignore=shutil.ignore_patterns("tensorboard"))
    assert "last logged" not in cli("inspect", tmp_path / "again").out  # the run's own step: nothing to add


def test_preparing_another_runs_data_for_other_settings_says_what_differs(tmp_path, cli, trained, small_corpus):
    """A second run pointed at a trained run's data/ with another vocabulary size prepares it again for
    itself, naming the folder and the setting that differs; the first run's next prepare makes it its own
    again."""
    import shutil

    from conftest import text_run

    run = Path(shutil.copytree(trained, tmp_path / "run", ignore=shutil.ignore_patterns("tensorboard")))
    other = text_run(
        tmp_path / "other", small_corpus, f"data.prepared_dir={run / 'data'}", "data.tokenizer.vocab_size=900"
    )

    def vocab() -> int:
        return json.loads((run / "data" / "manifest.json").read_text())["tokenizer"]["vocab_size"]

    result = cli("prepare", "--config", other, "--quiet")
    said = [line for line in result.err_lines if str(run / "data") in line and "preparing it again" in line]
    assert result.code == 0 and len(said) == 1 and "data.tokenizer.vocab_size 1000 -> 900" in said[0], result.err
    assert vocab() == 900
    again = cli("prepare", "--config", run / "config.yaml", "--quiet")
    assert again.code == 0 and "data.tokenizer.vocab_size 900 -> 1000" in again.err and vocab() == 1000, again.err


def test_resuming_another_runs_checkpoint_of_another_architecture_says_that_first(tmp_path, cli, trained, small_corpus):
    """Not a refusal of its tokenizer first, whose advice (prepare with the checkpoint's) would lead to the
    refusal of its sizes: no tokenizer makes another architecture resumable, so that is said first."""
    import shutil

    from conftest import text_run

    run = Path(shutil.copytree(trained, tmp_path / "run", ignore=shutil.ignore_patterns("tensorboard")))
    other = text_run(
        tmp_path / "other",
        small_corpus,
        "data.tokenizer.vocab_size=900",
        "model.hidden_size=64",
        "model.intermediate_size=128",
        "train.eval_every=0",
    )
    assert cli("pretrain", "--config", other, "--quiet", "--stop-at", "1").code == 0
    ckpt = tmp_path / "other" / "checkpoints" / "step-0000001"
    result = cli("pretrain", "--config", run / "config.yaml", "--resume", ckpt, "--stop-at", "6")
    assert result.code == 2 and result.err_lines[-1].startswith(
        f"bertcli: error: cannot resume from {ckpt}: model.hidden_size=64 in the checkpoint vs 32 in the config"
    ), result.err
    assert "tokenizer" not in result.err_lines[-1]


def test_prepare_says_tokenizer_settings_a_trained_run_ignores(tmp_path, cli, trained):
    """`prepare --set data.tokenizer.vocab_size=5000` on a run with checkpoints is said to be ignored: the
    run keeps its checkpoints' tokenizer, as a resume says."""
    import shutil

    run = Path(shutil.copytree(trained, tmp_path / "run", ignore=shutil.ignore_patterns("tensorboard")))
    result = cli("prepare", "--config", run / "config.yaml", "--set", "data.tokenizer.vocab_size=5000")
    assert result.code == 0, result.err
    ckpt = run / "checkpoints" / "step-0000004"

    def warned(lines: list[str]) -> list[str]:  # the warnings of the tokenizer setting
        return [line for line in lines if line.startswith("warning:") and "data.tokenizer.vocab_size" in line]

    said = warned(result.err_lines)
    assert len(said) == 1 and all(fact in said[0] for fact in ("1000", "5000", "ignored", str(ckpt))), result.err
    same = cli("prepare", "--config", run / "config.yaml")
    assert same.code == 0 and not warned(same.err_lines), same.err
