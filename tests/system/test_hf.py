"""Hugging Face interoperability: export parity, import of HF folders, round trip, refusals."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import safetensors.torch
import torch
from conftest import SMALL_MODEL

from bertcli import checkpoint, layout
from bertcli.config import ModelConfig
from bertcli.errors import UsageError
from bertcli.export import export
from bertcli.hf_import import load_hf_weights, read_hf_config
from bertcli.hf_import import load_into as init_from
from bertcli.model import BertForPreTraining

transformers = pytest.importorskip("transformers")

TEXTS = [
    "Hello world, this is a test.",
    "Naïve café — crème brûlée!",
    "東京 and 北京 are cities.",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "x = f(a[1], b={'k': 2}) # ok?",
    "ÀÉÎÕÜ àéîõü ñ ç ø å",
    "",
    "tabs\tand  spaces",
    "unknownwordzzqqxx",
    "3.14159 is π; e ≈ 2.718",
]


def hf_inputs(tokenizer, texts):
    return tokenizer(texts[:4], texts[4:8], return_tensors="pt", padding=True)


def test_export_loads_in_transformers_with_equal_logits_and_tokens(trained, tmp_path):
    out = export(trained, tmp_path / "hf")
    ckpt = layout.list_checkpoints(trained)[-1][1]
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertForPreTraining"] and config["vocab_size"] <= 1000
    theirs = transformers.BertForPreTraining.from_pretrained(out).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    from tokenizers import Tokenizer

    ours_tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    for text in TEXTS:
        assert tokenizer(text)["input_ids"] == ours_tok.encode(text).ids, text
    cfg = checkpoint.read_config(ckpt)
    ours = BertForPreTraining(cfg.model).eval()
    checkpoint.load_weights(ours, ckpt)
    batch = hf_inputs(tokenizer, TEXTS)
    valid = batch["attention_mask"].sum(1)
    with torch.no_grad():
        ref = theirs(**batch)
        out_ = ours(batch["input_ids"], batch["token_type_ids"], valid)
    for row, n in enumerate(valid.tolist()):
        torch.testing.assert_close(out_.mlm_logits[row, :n], ref.prediction_logits[row, :n], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out_.nsp_logits, ref.seq_relationship_logits, rtol=1e-5, atol=1e-5)


def test_export_leaves_torch_dynamo_unimported(trained, tmp_path):
    """The weights' shapes come from the config's numbers: a model built on the meta device to ask
    them imports torch._dynamo, 5 s of a 10 s export of a tiny run. A fresh process:
    this one may have it."""
    import subprocess
    import sys

    code = (
        "import sys; from bertcli.export import export; "
        f"export({str(trained)!r}, {str(tmp_path / 'hf')!r}); print('torch._dynamo' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stdout + done.stderr
    assert (tmp_path / "hf" / "model.safetensors").is_file()


def test_export_refuses_an_existing_folder_and_uses_an_empty_one(trained, tmp_path, cli):
    """An empty folder is used as a new one, without --force, as the docs say; one holding an export
    is replaced with --force only."""
    (tmp_path / "hf").mkdir()
    assert cli("export", trained, tmp_path / "hf").code == 0
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    result = cli("export", trained, tmp_path / "hf")
    assert result.code == 2 and "--force" in result.err and len(result.err_lines) == 1
    assert cli("export", trained, tmp_path / "hf", "--force").code == 0
    assert (tmp_path / "hf" / "model.safetensors").is_file()


def test_an_exports_sentence_transformers_files_are_its_own_and_replaced_as_such(trained, tmp_path, cli):
    """modules.json, sentence_bert_config.json and 1_Pooling/config.json are written with the rest (one rename);
    a re-export replaces them, and a file of the user's in 1_Pooling keeps the whole export as it is."""
    out = export(trained, tmp_path / "hf")
    modules = json.loads((out / "modules.json").read_text())
    assert [(m["path"], m["type"].rsplit(".", 1)[-1]) for m in modules] == [
        ("", "Transformer"),
        ("1_Pooling", "Pooling"),
    ]
    assert json.loads((out / "1_Pooling" / "config.json").read_text())["pooling_mode_mean_tokens"] is True
    trained_at = json.loads((out / "tokenizer_config.json").read_text())["model_max_length"]
    assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == trained_at
    (out / "1_Pooling" / "config.json").write_text("{}")  # bertcli's name: replaced
    assert cli("export", trained, out, "--force").code == 0
    assert json.loads((out / "1_Pooling" / "config.json").read_text())["pooling_mode_mean_tokens"] is True
    (out / "1_Pooling" / "notes.txt").write_text("mine\n")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    refused = cli("export", trained, out, "--force")
    assert refused.code == 2 and "1_Pooling/notes.txt" in refused.err and len(refused.err_lines) == 1, refused.err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_export_and_encode_of_a_run_say_which_checkpoint_and_the_export_records_its_step(trained, tmp_path, cli):
    """Given a run folder, export and encode say which checkpoint they read (its best, or newest), and
    the export records its step (the best at the time may be pruned since, and match none of the run's)."""
    found = layout.identify(trained)
    chosen = found.best or found.checkpoints[-1][1]
    state = checkpoint.read_trainer_state(chosen)
    loss = (state.get("eval_metrics") or {}).get("mlm_loss")
    held_out = f", held-out MLM loss {loss:.4f}" if loss is not None else ""
    said = f"{chosen} (step {state['step']}{held_out})"
    exported = cli("export", trained, tmp_path / "hf")
    assert exported.code == 0 and exported.err_lines == [
        f"wrote {tmp_path / 'hf'} from {said}; load it with "
        f"transformers.BertForPreTraining.from_pretrained({str(tmp_path / 'hf')!r})"
    ], exported.err
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["bertcli_step"] == state["step"]
    report = json.loads(cli("inspect", tmp_path / "hf", "--json").out)
    assert report["bertcli_export"]["step"] == state["step"]
    (tmp_path / "in.txt").write_text("hello world\n")
    encoded = cli("encode", "--model", trained, tmp_path / "in.txt")
    assert encoded.code == 0 and encoded.err_lines == [
        f"bertcli encode: the vectors of {said}: mean pooling (--pooling chooses)"
    ], encoded.err
    named = cli("encode", "--model", chosen, tmp_path / "in.txt")  # a checkpoint named: nothing chosen, nothing said
    assert named.code == 0 and named.err_lines == [], named.err


def random_hf(kind: str, cfg: ModelConfig, folder: Path) -> torch.nn.Module:
    config = transformers.BertConfig(
        **{k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("pad_vocab_multiple", "init_from")}
    )
    torch.manual_seed(1)
    model = getattr(transformers, kind)(config).eval()
    model.save_pretrained(folder)
    return model


SMALL = SMALL_MODEL


def test_import_bert_for_pretraining_gives_equal_outputs(tmp_path):
    theirs = random_hf("BertForPreTraining", SMALL, tmp_path / "hf")
    cfg = read_hf_config(tmp_path / "hf")
    assert dataclasses.replace(cfg, pad_vocab_multiple=64) == dataclasses.replace(SMALL, pad_vocab_multiple=64)
    ours = BertForPreTraining(cfg).eval()
    assert init_from(ours, tmp_path / "hf") == []
    tokens = torch.randint(5, 99, (3, 12))
    segments = torch.zeros_like(tokens)
    with torch.no_grad():
        ref = theirs(input_ids=tokens, token_type_ids=segments)
        out = ours(tokens, segments, torch.full((3,), 12))
    torch.testing.assert_close(out.mlm_logits, ref.prediction_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.nsp_logits, ref.seq_relationship_logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "kind, fresh", [("BertForMaskedLM", ["NSP head", "pooler"]), ("BertModel", ["MLM head", "NSP head"])]
)
def test_import_other_architectures_reports_fresh_heads(tmp_path, kind, fresh):
    theirs = random_hf(kind, SMALL, tmp_path / "hf")
    cfg = read_hf_config(tmp_path / "hf")
    ours = BertForPreTraining(cfg).eval()
    assert init_from(ours, tmp_path / "hf") == fresh
    encoder = theirs.bert if kind == "BertForMaskedLM" else theirs
    tokens = torch.randint(5, 99, (2, 9))
    with torch.no_grad():
        ref = encoder(input_ids=tokens, token_type_ids=torch.zeros_like(tokens)).last_hidden_state
        out = ours(tokens, torch.zeros_like(tokens), torch.full((2,), 9)).encoded
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["BertForMaskedLM", "BertModel"])
def test_a_model_built_uninitialised_gets_what_the_folder_lacks_initialised(tmp_path, kind):
    """encode builds its model without drawing the random weights it loads next; the weights the
    folder lacks are then initialised as a new model's, and the others are the folder's."""
    from bertcli.encode import _uninitialised
    from bertcli.hf_names import TIED_ALIASES

    random_hf(kind, SMALL, tmp_path / "hf")
    cfg = read_hf_config(tmp_path / "hf")
    ours = _uninitialised(cfg)
    fresh = init_from(ours, tmp_path / "hf", uninitialised=True)
    regular = BertForPreTraining(cfg)
    assert init_from(regular, tmp_path / "hf") == fresh
    prefixes = {"pooler": "bert.pooler.", "MLM head": "cls.predictions.", "NSP head": "cls.seq_relationship."}
    lacking = tuple(prefixes[part] for part in fresh)
    new = regular.state_dict()
    for key, value in ours.state_dict().items():
        if key.startswith(lacking) and key not in TIED_ALIASES:  # drawn afresh: as a new model's
            if new[key].eq(new[key].flatten()[0]).all():  # zeros or ones (biases, LayerNorm)
                assert torch.equal(value, new[key]), key
            else:  # normal(0, initializer_range): a sample std within 6 of its standard errors (sigma / sqrt(2n))
                assert abs(value.std() / cfg.initializer_range - 1) < 6 / (2 * value.numel()) ** 0.5, key
        else:
            assert torch.equal(value, new[key]), key
    assert ours.cls.predictions.decoder.weight is ours.bert.embeddings.word_embeddings.weight  # still tied


@pytest.mark.parametrize(
    "key, value", [("is_decoder", True), ("add_cross_attention", True), ("position_embedding_type", "relative_key")]
)
def test_settings_the_encoder_does_not_implement_are_refused(tmp_path, key, value):
    """is_decoder: true (causal attention in transformers) was encoded bidirectionally, exit 0, up to 1.05 away."""
    random_hf("BertModel", SMALL, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config | {key: value}))
    with pytest.raises(UsageError, match=f"config.json: {key} {value!r} is not supported"):
        read_hf_config(tmp_path / "hf")


def test_continuing_from_an_untied_decoder_is_refused_encoding_is_not(tmp_path, small_corpus, cli):
    """A decoder of its own (tie_word_embeddings false) was dropped for the word embeddings, unsaid."""
    hf = tmp_path / "hf"
    model = random_hf("BertForPreTraining", dataclasses.replace(SMALL, vocab_size=99), hf)
    model.config.tie_word_embeddings = False
    untied = transformers.BertForPreTraining(model.config)
    untied.save_pretrained(hf)
    assert "cls.predictions.decoder.weight" in safetensors.torch.load_file(hf / "model.safetensors")
    result = cli("init", tmp_path / "run", "--init-from", hf, "--corpus", small_corpus)
    assert result.code == 2 and "tie_word_embeddings is false" in result.err and len(result.err_lines) == 1
    assert not (tmp_path / "run").exists()
    ours = BertForPreTraining(read_hf_config(hf))
    assert init_from(ours, hf) == []  # encode reads its encoder as it is


def test_legacy_gamma_beta_names(tmp_path):
    random_hf("BertForPreTraining", SMALL, tmp_path / "hf")
    weights = safetensors.torch.load_file(tmp_path / "hf" / "model.safetensors")
    legacy = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
        for k, v in weights.items()
    }
    assert any("gamma" in k for k in legacy)
    safetensors.torch.save_file(legacy, tmp_path / "hf" / "model.safetensors")
    renamed, fresh = load_hf_weights(tmp_path / "hf", read_hf_config(tmp_path / "hf"))
    assert fresh == [] and torch.equal(
        renamed["bert.embeddings.LayerNorm.weight"], weights["bert.embeddings.LayerNorm.weight"]
    )


def test_pickle_weights_are_refused_with_an_explanation(tmp_path):
    random_hf("BertForPreTraining", SMALL, tmp_path / "hf")
    (tmp_path / "hf" / "model.safetensors").rename(tmp_path / "hf" / "pytorch_model.bin")
    with pytest.raises(UsageError, match="safetensors only"):
        load_hf_weights(tmp_path / "hf", read_hf_config(tmp_path / "hf"))


def test_round_trip_export_import_export_is_byte_identical(trained, tmp_path):
    first = export(trained, tmp_path / "one")
    cfg = checkpoint.read_config(layout.list_checkpoints(trained)[-1][1])
    model = BertForPreTraining(cfg.model)
    assert init_from(model, first) == []
    # Save the imported model as a bertcli checkpoint (as training would), then export again.
    checkpoints = checkpoint.CheckpointManager(
        dataclasses.replace(cfg, output_dir=str(tmp_path / "run2")),
        is_main=True,
        tokenizer={name: (first / name).read_bytes() for name in layout.TOKENIZER_FILES},
        best=None,
        last=None,
    )
    checkpoints.restore(
        None,
        "cpu",
        model=model,
        optimizer=torch.optim.AdamW(model.parameters()),
        scaler=torch.amp.GradScaler("cpu", enabled=False),
    )
    checkpoints.save(4, {}, periodic=True)
    second = export(checkpoints.last_saved, tmp_path / "two")
    a = safetensors.torch.load_file(first / "model.safetensors")
    b = safetensors.torch.load_file(second / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape
        assert a[key].numpy().tobytes() == b[key].numpy().tobytes(), key


def test_continued_pretraining_from_an_exported_folder(tmp_path, small_corpus, capsys):
    from conftest import read_metrics, text_run

    from bertcli.resolve import load_run
    from bertcli.trainer import pretrain

    def first_mlm_loss(folder):
        return [r for r in read_metrics(folder / "metrics.jsonl") if r["split"] == "train"][0]["mlm_loss"]

    def run(folder, *overrides, quiet=True):
        config = text_run(folder, small_corpus, "train.eval_every=0", *overrides)
        pretrain(load_run(config), quiet=quiet)

    run(tmp_path / "teacher", "train.max_steps=60", "optimizer.lr=5e-3", "checkpoint.save_every=60")
    hf_dir = export(tmp_path / "teacher", tmp_path / "hf")
    capsys.readouterr()
    run(tmp_path / "continued", f"model.init_from={hf_dir}", "train.max_steps=4", quiet=False)
    assert f"initialised from {hf_dir}" in capsys.readouterr().err
    run(tmp_path / "fresh", f"data.tokenizer.path={hf_dir}", "train.max_steps=4")
    continued, fresh = first_mlm_loss(tmp_path / "continued"), first_mlm_loss(tmp_path / "fresh")
    assert continued < fresh - 0.5, (continued, fresh)
    with pytest.raises(UsageError, match="architecture comes from model.init_from"):
        run(tmp_path / "clash", f"model.init_from={hf_dir}", "model.hidden_size=64", "model.num_attention_heads=2")


def test_init_from_a_bare_bert_model_says_which_heads_are_fresh(tmp_path, small_corpus, cli):
    from conftest import text_run

    from bertcli.data.prepare import prepare
    from bertcli.data.prepared import load_prepared
    from bertcli.resolve import load_run

    config = text_run(tmp_path / "tok", small_corpus)
    prepared = load_prepared(prepare(load_run(config), quiet=True))
    cfg = dataclasses.replace(SMALL, vocab_size=prepared.vocab_size, max_position_embeddings=64)
    random_hf("BertModel", cfg, tmp_path / "hf")
    for name in ("tokenizer.json", "vocab.txt"):
        (tmp_path / "hf" / name).write_bytes((prepared.folder / name).read_bytes())
    assert (
        cli(
            "init",
            tmp_path / "run",
            "--init-from",
            tmp_path / "hf",
            "--corpus",
            small_corpus,
            *sum(
                (
                    ["--set", o]
                    for o in (
                        "train.max_steps=2",
                        "train.batch_size=4",
                        "data.max_seq_length=32",
                        "train.eval_every=0",
                        "data.tokenizer.vocab_size=1000",
                    )
                ),
                [],
            ),
        ).code
        == 0
    )
    text = (tmp_path / "run" / "config.yaml").read_text()
    assert "hidden_size: 32" in text and f"init_from: {tmp_path / 'hf'}" in text
    result = cli("pretrain", "--config", tmp_path / "run" / "config.yaml", "--quiet")
    assert result.code == 0, result.err
    assert "not in it, so trained from scratch: MLM head, NSP head" in result.err


def test_a_phase_2_run_resumes_once_its_init_from_source_is_gone(tmp_path, trained, small_corpus, cli):
    """Phase 1 goes on and keep_last prunes the step phase 2 came from: phase 2 still resumes (its own
    checkpoints hold the architecture and the tokenizer); only a fresh start needs the source."""
    import shutil

    source = tmp_path / "phase-1-step"
    shutil.copytree(layout.list_checkpoints(trained)[-1][1], source)
    corpus = tmp_path / "domain.txt"  # a few documents: little to prepare
    corpus.write_text("\n\n".join(small_corpus.read_text().split("\n\n")[:8]))
    sets = sum(
        (
            ["--set", o]
            for o in (
                "train.max_steps=2",
                "train.batch_size=4",
                "data.max_seq_length=32",
                "train.eval_every=0",
                "data.validation_fraction=0",
                "checkpoint.save_every=1",
                "logging.tensorboard=false",
            )
        ),
        [],
    )
    assert cli("init", tmp_path / "run", "--init-from", source, "--corpus", corpus, *sets).code == 0
    config = tmp_path / "run" / "config.yaml"
    assert cli("pretrain", "--config", config, "--quiet", "--stop-at", "1").code == 0
    shutil.rmtree(source)
    result = cli("pretrain", "--config", config)  # not --quiet: where the architecture comes from is said
    assert result.code == 0, result.err
    own = tmp_path / "run" / "checkpoints" / "step-0000001"
    assert (
        f"model.init_from {source} is gone" in result.err
        and f"the architecture and the tokenizer come from {own}" in result.err
    )
    assert "is up to date" in result.err, "the same tokenizer: the prepared data is reused, not prepared again"
    assert f"resuming from {own} (step 1)" in result.err
    shutil.rmtree(tmp_path / "run" / "checkpoints")  # starting fresh needs the source
    fresh = cli("pretrain", "--config", config, "--quiet")
    assert fresh.code == 2 and "not a Hugging Face BERT folder" in fresh.err_lines[-1]


def test_an_export_of_a_run_whose_step_is_pruned_while_read_takes_the_newest_again(trained, tmp_path, monkeypatch):
    """export RUN while the run trains: the step it read, pruned under it, was an error (exit 1)."""
    import shutil

    from bertcli import export as export_module

    run = shutil.copytree(trained, tmp_path / "run", ignore=shutil.ignore_patterns("tensorboard"))
    shutil.copytree(run / "checkpoints" / "step-0000004", run / "checkpoints" / "step-0000003")
    real, read = export_module._export, []

    def pruned_first(ckpt, out_dir, force):
        read.append(ckpt.name)
        if len(read) == 1:
            shutil.rmtree(ckpt)  # the run's next save prunes it while it is read
        return real(ckpt, out_dir, force)

    monkeypatch.setattr(export_module, "_export", pruned_first)
    export(run, tmp_path / "hf")
    assert read == ["step-0000004", "step-0000003"] and (tmp_path / "hf" / "model.safetensors").is_file()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_a_casing_the_loaded_tokenizer_does_not_follow_is_refused_at_init_and_said_after(trained, tmp_path, cli):
    """A casing setting the loaded tokenizer does not follow (it keeps its own: its vocabulary was made
    with it) is refused by init --init-from, and warned of by prepare where the config says it."""
    folder = export(trained, tmp_path / "hf")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"Sentence {i} of the Corpus. Another One here.\n\n" for i in range(60)))
    refused = cli(
        "init", tmp_path / "run", "--init-from", folder, "--corpus", corpus, "--set", "data.tokenizer.lowercase=false"
    )
    assert refused.code == 2 and len(refused.err_lines) == 1, refused.err
    assert "data.tokenizer.lowercase=false" in refused.err and str(folder) in refused.err
    assert not (tmp_path / "run").exists()
    assert cli("init", tmp_path / "run", "--init-from", folder, "--corpus", corpus).code == 0
    config = tmp_path / "run" / "config.yaml"
    agreeing = cli("prepare", "--config", config)
    assert agreeing.code == 0 and "warning: data.tokenizer" not in agreeing.err, agreeing.err
    config.write_text(config.read_text().replace("    strip_accents: true", "    strip_accents: false"))
    said = cli("prepare", "--config", config)
    [warning] = [line for line in said.err_lines if "warning: data.tokenizer" in line]
    assert (
        said.code == 0 and "data.tokenizer.strip_accents=false" in warning and str(folder / "tokenizer.json") in warning
    )


def test_starting_from_a_runs_best_names_its_step(tmp_path, small_corpus, cli):
    """init --init-from RUN is refused (the run's best moves as it trains), naming a step folder to pass;
    init from best itself, and pretrain from it, name best's step."""
    from conftest import text_run

    from bertcli.resolve import load_run
    from bertcli.trainer import pretrain

    source = tmp_path / "src"
    pretrain(load_run(text_run(source, small_corpus, "train.max_steps=4", "train.eval_every=2")), quiet=True)
    best, pinned = source / "checkpoints" / "best", source / "checkpoints" / "step-0000004"
    assert checkpoint.read_trainer_state(best)["step"] == 4 and pinned.is_dir()
    refused = cli("init", tmp_path / "run", "--init-from", source)
    assert refused.code == 2 and str(source) in refused.err_lines[-1] and str(pinned) in refused.err_lines[-1], (
        refused.err
    )
    sets = ["--set=train.max_steps=1", "--set=train.eval_every=0", "--set=logging.tensorboard=false"]
    made = cli("init", tmp_path / "run", "--init-from", best, *sets)
    assert made.code == 0 and f"{best} (step 4, held-out MLM loss " in made.err_lines[0], made.err
    started = cli("pretrain", "--config", tmp_path / "run" / "config.yaml")
    assert started.code == 0, started.err
    assert any(line.startswith(f"initialised from {best} (step 4") for line in started.err_lines), started.err
    pinned_run = cli("init", tmp_path / "pinned", "--init-from", pinned, *sets)
    assert pinned_run.code == 0 and not any(line.startswith("note:") for line in pinned_run.err_lines), pinned_run.err


def test_a_tokenizer_with_an_id_past_the_vocabulary_is_refused_with_both_figures_meant(trained, tmp_path, cli):
    """A token added at id vocab_size is past the ids 0 to vocab_size - 1: the refusal gives both, not
    two equal numbers ("token ids go up to 30,522 but the model has vocab_size 30,522")."""
    folder = export(trained, tmp_path / "hf")
    size = json.loads((folder / "config.json").read_text())["vocab_size"]
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    tokenizer["added_tokens"].append(
        {
            "id": size,
            "content": "[NEW]",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
    )
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    (tmp_path / "in.txt").write_text("hello\n")
    result = cli("encode", "--model", folder, tmp_path / "in.txt")
    assert result.code == 2 and len(result.err_lines) == 1, result.err
    assert f"{folder / 'tokenizer.json'}: token id {size:,} past vocab_size {size:,}" in result.err, result.err


def test_inspect_of_an_export_shows_the_length_its_run_trained_at(trained, tmp_path, cli):
    """inspect of an export trained at data.max_seq_length shows that length, not its positions (512),
    as its tokenizer_config.json, encode and transformers take the trained length."""
    from bertcli.resolve import load_run

    trained_at = load_run(trained / "config.yaml").data.max_seq_length
    folder = export(trained, tmp_path / "hf")
    assert json.loads((folder / "config.json").read_text())["max_position_embeddings"] > trained_at
    report = json.loads(cli("inspect", folder, "--json").out)
    assert report["architecture"]["max_seq_length"] == trained_at, report["architecture"]
