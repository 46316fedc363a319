"""Config: presets vs configs/, docs on every field, strict loading, --set, validation."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from conftest import REPO, refuse_in_fresh_interpreter, write_config

from bertcli.config import PRESETS, Config, field_docs, to_dict
from bertcli.config_load import load_config, model_config_from_dict, parse_overrides, preset_config
from bertcli.config_write import to_yaml
from bertcli.errors import UsageError


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_configs_folder_equals_what_init_writes(preset, tmp_path, cli):
    result = cli("init", tmp_path / preset, "--preset", preset)
    assert result.code == 0, result.err
    written = (tmp_path / preset / "config.yaml").read_text()
    assert written == (REPO / "configs" / f"{preset}.yaml").read_text(), (
        f"configs/{preset}.yaml drifted from `bertcli init --preset {preset}`; regenerate it with scripts/write_presets.py"
    )
    assert load_config(tmp_path / preset / "config.yaml") == preset_config(preset)


def test_preset_sizes_are_the_documented_ones():
    sizes = {name: preset_config(name).model for name in PRESETS}
    shape = lambda m: (m.num_hidden_layers, m.hidden_size, m.num_attention_heads, m.intermediate_size)  # noqa: E731
    assert shape(sizes["tiny"]) == (2, 128, 2, 256) and preset_config("tiny").data.max_seq_length == 64
    assert shape(sizes["small"]) == (4, 512, 8, 2048)
    assert shape(sizes["base"]) == (12, 768, 12, 3072) and preset_config("base").data.tokenizer.vocab_size == 30522
    assert shape(sizes["large"]) == (24, 1024, 16, 4096) and preset_config("large").data.tokenizer.vocab_size == 30522
    assert all(m.vocab_size is None for m in sizes.values()), "text presets take vocab_size from the tokenizer"
    assert all(preset_config(name).data.max_seq_length == 128 for name in ("small", "base", "large"))


def _sections(obj=None):
    """Config and every nested section class."""
    obj = obj if obj is not None else Config()
    yield type(obj)
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from _sections(value)


def test_every_field_has_a_docstring_and_every_line_of_yaml_a_comment():
    for cls in set(_sections()):
        docs = field_docs(cls)
        missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
        assert not missing, f"{cls.__name__} fields without a docstring: {missing}"
    lines = to_yaml(preset_config("tiny")).splitlines()
    for i, line in enumerate(lines):
        if line.strip() and not line.lstrip().startswith("#"):
            assert lines[i - 1].lstrip().startswith("#"), f"no comment above {line!r}"
            if not line.rstrip().endswith(":"):  # a value line: its comment gives type and default
                assert "default" in lines[i - 1], lines[i - 1]


def test_precedence_defaults_then_yaml_then_set(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("train:\n  max_steps: 5\n  batch_size: 3\noptimizer:\n  lr: 1e-4\n")
    cfg = load_config(path, ["train.max_steps=7"])
    assert cfg.train.max_steps == 7  # --set beats YAML
    assert cfg.train.batch_size == 3  # YAML beats default
    assert cfg.train.seed == Config().train.seed  # default when absent
    assert cfg.optimizer.lr == pytest.approx(1e-4)  # YAML 1.1 reads 1e-4 as a string: still a number


def test_unknown_keys_name_section_and_closest_key(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("model:\n  hidden_sze: 64\ntrian:\n  seed: 1\ntrain:\n  lr: 0.1\n")
    with pytest.raises(UsageError) as info:
        load_config(path)
    problems = info.value.problems
    assert len(problems) == 3  # all reported at once
    assert any(
        "model.hidden_sze" in p and "section 'model'" in p and "did you mean 'hidden_size'" in p for p in problems
    )
    assert any("trian" in p and "did you mean 'train'" in p for p in problems)
    assert any("train.lr: unknown key in section 'train'" in p for p in problems)
    assert all(p.startswith(str(path)) for p in problems)


def test_wrong_types_are_reported(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("model:\n  hidden_size: big\n  hidden_act: swish\nlogging:\n  tensorboard: maybe\ntrain: 3\n")
    with pytest.raises(UsageError) as info:
        load_config(path)
    text = "\n".join(info.value.problems)
    assert "model.hidden_size: expected an integer, got 'big'" in text
    assert "model.hidden_act: must be one of gelu" in text
    assert "logging.tensorboard: expected true or false" in text
    assert "train: expected a mapping" in text
    assert len(info.value.problems) == 4


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["model.hidden_size=100", "model.num_attention_heads=3"], "not divisible by model.num_attention_heads=3"),
        (["data.max_seq_length=600"], "above model.max_position_embeddings=512"),
        (["data.masked_lm_prob=0"], "data.masked_lm_prob: must be in (0, 1)"),
        (["data.masked_lm_prob=1.0"], "data.masked_lm_prob: must be in (0, 1)"),
        (["train.mlm_weight=-1"], "train.mlm_weight: must not be negative"),
        (
            ["train.mlm_weight=0", "train.nsp_weight=0"],
            "train.mlm_weight: is 0 as is train.nsp_weight: nothing to learn",
        ),
        (["data.mask_token_prob=0.9", "data.random_token_prob=0.2"], "at most 1"),
        (["checkpoint.keep_last=0"], "checkpoint.keep_last: must be at least 1"),
        (["train.device=gpu"], "train.device: must be auto, cpu, cuda or cuda:N"),
        (["train.device=cuda:-1"], "train.device: must be auto, cpu, cuda or cuda:N, got 'cuda:-1'"),
        (["train.device=cuda:x"], "train.device: must be auto, cpu, cuda or cuda:N, got 'cuda:x'"),
        (["train.parallel=tp"], "train.parallel: must be one of ddp, fsdp; got 'tp'"),
    ],
)
def test_impossible_values(overrides, needle):
    with pytest.raises(UsageError) as info:
        preset_config("tiny", overrides)
    assert any(needle in p for p in info.value.problems), info.value.problems


def test_device_takes_any_cuda_index():
    for device in ("auto", "cpu", "cuda", "cuda:0", "cuda:12"):
        assert preset_config("tiny", [f"train.device={device}"]).train.device == device


def test_valid_presets_have_no_problems():
    for name in PRESETS:
        assert preset_config(name).problems() == []


@pytest.mark.parametrize(
    "item, needle",
    [
        ("train.max_steps", "expected section.key=value"),
        ("=3", "expected section.key=value"),
        ("train..seed=1", "expected section.key=value"),
        ("train.seed=[1, 2", "malformed YAML"),
        # a whole section set at once would replace the preset's (train=null gives every global default)
        ("train=null", "train is a section: set its keys one at a time (train.KEY=VALUE)"),
        ("model={}", "model is a section"),
    ],
)
def test_bad_set_syntax(item, needle):
    with pytest.raises(UsageError, match=None) as info:
        parse_overrides([item])
    assert needle in str(info.value)


def test_set_values_are_yaml_scalars_and_bad_values_name_set():
    cfg = preset_config("tiny", ["logging.tensorboard=false", "train.max_steps=1e3", "optimizer.schedule=cosine"])
    assert cfg.logging.tensorboard is False and cfg.train.max_steps == 1000 and cfg.optimizer.schedule == "cosine"
    with pytest.raises(UsageError) as info:
        preset_config("tiny", ["train.max_steps=many"])
    assert info.value.problems == ["--set: train.max_steps: expected an integer, got 'many' (str)"]


def test_numbers_read_as_yaml_1_2_reads_them(tmp_path):
    """PyYAML's YAML 1.1 made `seed: 010` 8 (octal) and `max_steps: 1:30` 90 (base 60), silently."""
    path = tmp_path / "config.yaml"
    path.write_text("train:\n  seed: 010\n  max_steps: 0x10\n  eval_every: 1_000\n  eval_examples: 0o17\n")
    train = load_config(path).train
    assert (train.seed, train.max_steps, train.eval_every, train.eval_examples) == (10, 16, 1000, 15)
    assert preset_config("tiny", ["train.seed=010", "train.max_steps=+1_0"]).train.seed == 10
    path.write_text("train:\n  max_steps: 1:30\n  seed: 0b11\n")
    with pytest.raises(UsageError) as info:
        load_config(path)
    assert "train.max_steps: expected an integer, got '1:30' (str)" in str(info.value)
    assert "train.seed: expected an integer, got '0b11' (str)" in str(info.value)


def test_a_string_that_yaml_reads_as_a_number_is_refused_naming_the_key(tmp_path):
    with pytest.raises(UsageError) as info:
        preset_config("tiny", ["data.corpus=2024", "data.tokenizer.path=yes"])
    assert len(info.value.problems) == 2, info.value.problems
    assert any(p.startswith("--set: data.corpus: ") and "2024" in p for p in info.value.problems)
    assert any(p.startswith("--set: data.tokenizer.path: ") and "True" in p for p in info.value.problems)
    assert preset_config("tiny", ['data.corpus="2024"']).data.corpus == "2024"  # quoted, it is a string
    path = tmp_path / "config.yaml"
    path.write_text("data:\n  corpus: 2024\n")
    with pytest.raises(UsageError, match=f"{path}: data.corpus: "):
        load_config(path)


@pytest.mark.parametrize(
    "item, key",
    [
        ("model.tokenizer.path=x", "model.tokenizer"),
        ("train.synthetic.seed=3", "train.synthetic"),
        ("model.lr=0.1", "model.lr"),
    ],
)
def test_a_key_or_section_in_the_wrong_section_is_refused_naming_it(item, key):
    with pytest.raises(UsageError) as info:
        preset_config("tiny", [item])
    [problem] = info.value.problems
    assert problem.startswith(f"--set: {key}: unknown key"), problem


def test_malformed_yaml_names_line(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("model:\n  hidden_size: [1, 2\n")
    with pytest.raises(UsageError) as info:
        load_config(path)
    assert "malformed YAML at line" in str(info.value) and str(path) in str(info.value)


@pytest.mark.parametrize(
    "text, needle",
    [
        (
            "model:\n  hidden_size: 64\ntrain:\n  max_steps: 3\nmodel:\n  num_hidden_layers: 2\n",
            "line 5: key 'model' is given twice (first at line 1)",
        ),
        (
            "model:\n  hidden_size: 64\n  num_hidden_layers: 2\n  hidden_size: 32\n",
            "line 4: key 'hidden_size' is given twice (first at line 2)",
        ),
        (  # a flow mapping: both keys on one line (YAML keeps the last one, silently)
            "model: {hidden_size: 128, num_attention_heads: 2, hidden_size: 256}\n",
            "line 1: key 'hidden_size' is given twice (first at line 1)",
        ),
        ("train: {max_steps: 5,\n  max_steps: 6}\n", "line 2: key 'max_steps' is given twice (first at line 1)"),
    ],
)
def test_a_key_or_section_given_twice_names_both_lines(tmp_path, text, needle):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(UsageError) as info:
        load_config(path)
    (problem,) = info.value.problems
    assert problem.startswith(f"{path}: {needle}"), problem


def test_yaml_merge_keys_may_still_be_overridden(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("train:\n  <<: {max_steps: 5, batch_size: 4}\n  max_steps: 7\n")
    cfg = load_config(path)
    assert cfg.train.max_steps == 7 and cfg.train.batch_size == 4


def test_unknown_keys_wrong_types_and_impossible_values_are_reported_together(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(
        "model:\n  hidden_sze: 64\n  max_position_embeddings: big\ndata:\n  max_seq_length: 1000\n"
        "train:\n  max_steps: -3\n"
    )
    with pytest.raises(UsageError) as info:
        load_config(path)
    problems = [p.removeprefix(f"{path}: ") for p in info.value.problems]
    assert problems == [
        "model.hidden_sze: unknown key in section 'model'; did you mean 'hidden_size'?",
        "model.max_position_embeddings: expected an integer, got 'big' (str)",
        "train.max_steps: must be at least 1, got -3",
    ]  # not "1000 is above ... 512", the default


def test_round_trip_through_yaml(tmp_path):
    """A config as init and checkpoints write it, and as a run records its settings, reads back as it was: strings
    YAML 1.1 or 1.2 reads as numbers too (quoted)."""
    from bertcli import resume

    numeric = ["09", "-08", "+09", "0_9", "0o17", "0o_", "1:30", "0x1F", "010", "1e5", ".5", "yes"]
    path = write_config(tmp_path, "optimizer.lr=1.5e-3", "model.layer_norm_eps=1e-7", f"data.exclude={numeric}")
    cfg = load_config(path)
    assert cfg.optimizer.lr == 1.5e-3 and cfg.model.layer_norm_eps == 1e-7 and cfg.data.exclude == numeric
    assert to_dict(load_config(path)) == to_dict(cfg)
    run = dataclasses.replace(cfg, output_dir=str(tmp_path))
    resume.write_settings(run, resume.Overrides([], []))
    assert to_dict(resume.read_settings(tmp_path)[1]) == to_dict(run)


def test_a_model_config_alone_is_checked_alone_and_reports_every_problem():
    source = "hf/config.json"
    assert (
        model_config_from_dict(
            {"vocab_size": 99, "hidden_size": 32, "num_attention_heads": 4, "max_position_embeddings": 3}, source
        ).max_position_embeddings
        == 3
    )
    with pytest.raises(UsageError) as info:
        model_config_from_dict(
            {
                "vocab_size": 99,
                "hidden_size": 30,
                "num_attention_heads": 4,
                "hidden_act": "swish",
                "layer_norm_eps": 0,
                "hidden_sze": 1,
            },
            source,
        )
    assert info.value.problems == [
        f"{source}: model.hidden_act: must be one of gelu, gelu_new, gelu_pytorch_tanh, relu; got 'swish'",
        f"{source}: model.hidden_sze: unknown key in section 'model'; did you mean 'hidden_size'?",
        f"{source}: model.hidden_size: 30 is not divisible by model.num_attention_heads=4",
        f"{source}: model.layer_norm_eps: must be positive, got 0.0",
    ]
    with pytest.raises(UsageError, match="model.vocab_size: missing"):  # no tokenizer beside it to count
        model_config_from_dict({"hidden_size": 32}, source)


def _float_fields(cls=Config, prefix=""):
    from bertcli.config import field_types

    for f in dataclasses.fields(cls):
        tp = field_types(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            yield from _float_fields(tp, f"{prefix}{f.name}.")
        elif tp is float:
            yield f"{prefix}{f.name}"


def test_non_finite_numbers_are_refused_in_every_float_field():
    """optimizer.eps=inf trained with no updates at all; inf, nan and 1e400 are refused everywhere."""
    fields = list(_float_fields())
    assert "optimizer.eps" in fields and "model.hidden_dropout_prob" in fields and len(fields) >= 20
    for key in fields:
        for value in ("inf", ".inf", "-.inf", "nan", ".nan", "1e400"):
            with pytest.raises(UsageError) as info:
                preset_config("tiny", [f"{key}={value}"])
            assert info.value.problems == [
                f"--set: {key}: expected a finite number, got {info.value.problems[0].split('got ', 1)[1]}"
            ], (key, value)


@pytest.mark.parametrize(
    "item, needle",
    [
        ("train.seed=-1", "train.seed: must not be negative, got -1"),
        ("data.synthetic.seed=-1", "data.synthetic.seed: must not be negative, got -1"),
        (
            "data.synthetic.num_documents=1000000000",
            "data.synthetic: about 98,000,000,000 tokens (num_documents x the mean sentences x the mean length); the",
        ),
        ("data.synthetic.max_sentence_length=1e9", "--set: data.synthetic: about 7,000,000,028,000 tokens"),
        ("data.synthetic.max_sentences=1e9", "--set: data.synthetic: about 14,000,000,028,000 tokens"),
        ("data.synthetic.branching=1e9", "data.synthetic.branching: must be from 1 to 1,024, got 1,000,000,000"),
        ("train.seed=1e23", "train.seed: expected an integer, got '1e23' (str): write it out in digits"),
        ("train.max_steps=1e300", "train.max_steps: expected an integer, got '1e300' (str): write it out in digits"),
        ("train.max_steps=1.0e+300", "train.max_steps: expected an integer, got 1e+300 (float): write it out"),
        (f"train.seed={2**63}", "train.seed: must be at most 9,223,372,036,854,775,807 in size (a 64-bit integer)"),
        ("train.max_steps=" + "9" * 400, "train.max_steps: must be at most 9,223,372,036,854,775,807 in size"),
    ],
)
def test_integers_are_bounded_where_numpy_and_torch_take_them(item, needle):
    with pytest.raises(UsageError) as info:
        preset_config("tiny", [item])
    assert len(info.value.problems) == 1 and needle in info.value.problems[0], info.value.problems
    assert len(info.value.problems[0]) < 200  # a 400-digit number is not printed whole


def test_the_largest_accepted_seed_and_whole_floats_still_work():
    import numpy as np
    import torch

    cfg = preset_config("tiny", [f"train.seed={2**63 - 1}", f"data.synthetic.seed={2**63 - 1}", "train.max_steps=1e6"])
    assert cfg.train.max_steps == 1_000_000
    torch.manual_seed(cfg.train.seed)  # what the trainer does with them
    np.random.default_rng([cfg.train.seed, 0, 2**62]).integers(10)


def test_warmup_past_max_steps_is_a_warning_not_an_error():
    assert preset_config("tiny", ["optimizer.warmup_steps=500"]).warnings() == []  # max_steps 500: peak at the end
    [warning] = preset_config("tiny", ["optimizer.warmup_steps=1000"]).warnings()
    assert (
        warning.startswith(
            "optimizer.warmup_steps=1,000 is past train.max_steps=500: the learning rate rises to 50% of optimizer.lr"
        )
        and "\n" not in warning
    )


def _billion_laughs(levels: int = 9) -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        prev, name = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{name}: &{name} [{', '.join(['*' + prev] * 10)}]")
    return "\n".join(lines)


@pytest.mark.skipif(not yaml.__with_libyaml__, reason="PyYAML without libyaml reads with Python's parser alone")
def test_libyaml_reads_a_config_as_the_python_parser_does_and_a_deep_one_is_refused_in_a_line(tmp_path, monkeypatch):
    """libyaml reads every preset's config (Python's parser is not asked) to the same values; numbers as YAML 1.2 reads
    them and keys given twice as StrictLoader does; nesting that would overflow its C stack goes to Python's parser."""
    from bertcli import config_load

    texts = [to_yaml(preset_config(name)) for name in PRESETS]
    texts += ["a: [010, 0x1F, 0o17, 1:30, 1e5, 1.0e-05, -.inf, +12, 1_000, 0b101, yes, ~, 2026-01-01, 3.]"]
    python = [config_load.StrictLoader(text).get_single_data() for text in texts]
    monkeypatch.setattr(config_load.StrictLoader, "get_single_node", None)  # only libyaml reads below
    assert [config_load.load_yaml(text) for text in texts] == python
    monkeypatch.undo()
    with pytest.raises(config_load.DuplicateKey):
        config_load.load_yaml("train: {max_steps: 5,\n  max_steps: 6}\n")
    tab = "train:\n  seed:\t3\n"  # libyaml takes it, Python's parser does not: refused whatever the comments
    for text in (tab, "# " + "-" * 2_000 + "\n" + tab):
        with pytest.raises(yaml.scanner.ScannerError, match="cannot start any token"):
            config_load.load_yaml(text)
    assert config_load.load_yaml("output_dir: 2024-05-01") == {"output_dir": "2024-05-01"}  # YAML 1.2: no dates
    with pytest.raises(yaml.YAMLError, match="special characters"):  # what libyaml cannot encode: Python's words
        config_load.load_yaml("seed: \udcff")  # (an argument's undecodable byte)
    with pytest.raises(ValueError, match="over 256 KiB"):  # a checkpoint's config has no other cap
        config_load.load_yaml("a: [" + "1, " * 100_000 + "]")
    for deep in ("[" * 100_000 + "]" * 100_000, "- " * 100_000 + "x"):  # libyaml: a segmentation fault
        path = tmp_path / "config.yaml"
        path.write_text(deep)
        with pytest.raises(UsageError, match="nested too deeply"):
            load_config(path)


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path):
    """Nine nested aliases of ten stand for a billion strings: 30 s and 3 GB, then MemoryError, before."""
    import time

    path = tmp_path / "config.yaml"
    path.write_text("x:\n" + "".join(f"  {line}\n" for line in _billion_laughs().splitlines()) + "output_dir: *i\n")
    start = time.perf_counter()
    with pytest.raises(UsageError) as info:
        load_config(path)
    assert time.perf_counter() - start < 1.0
    (problem,) = info.value.problems
    assert problem.startswith(f"{path}: its aliases (*name)") and "10,000 values" in problem, problem
    flow = (
        "["
        + ", ".join(f"&{chr(97 + i)} [" + ", ".join([f"*{chr(96 + i)}" if i else "1"] * 10) + "]" for i in range(9))
        + "]"
    )
    start = time.perf_counter()
    with pytest.raises(UsageError, match="--set .*: its aliases"):
        parse_overrides([f"output_dir={flow}"])
    assert time.perf_counter() - start < 1.0
    path.write_text("output_dir: &a [*a]\n")
    with pytest.raises(UsageError, match="an alias refers to itself"):
        load_config(path)


def test_set_paths_are_relative_to_the_current_folder_yaml_paths_to_the_file(tmp_path, monkeypatch):
    from bertcli.resolve import load_run

    config = write_config(tmp_path / "run", "data.corpus=texts/a.txt", "output_dir=out")
    monkeypatch.chdir((tmp_path / "here").mkdir() or tmp_path / "here")
    cfg = load_run(config)
    assert (cfg.data.corpus, cfg.output_dir) == (str(tmp_path / "run" / "texts/a.txt"), str(tmp_path / "run" / "out"))
    cfg = load_run(
        config,
        [
            "data.corpus=mine.txt",
            "output_dir=o",
            "data.prepared_dir='p q'",
            "model.init_from=",
            f"data.tokenizer.path={tmp_path}/t.json",
        ],
    )
    here = tmp_path / "here"
    assert (cfg.data.corpus, cfg.output_dir, cfg.data.prepared_dir) == (
        str(here / "mine.txt"),
        str(here / "o"),
        str(here / "p q"),
    )
    assert cfg.model.init_from == "" and cfg.data.tokenizer.path == f"{tmp_path}/t.json"
    assert load_run(config, ["data.corpus=synthetic"]).data.corpus == "synthetic"


@pytest.mark.parametrize(
    "args",
    [
        ("pretrain", "--config", "bad.yaml"),
        ("pretrain", "--config", "good/config.yaml", "--set", "train.seed=-1"),
        ("pretrain", "--config", "good/config.yaml", "--device", "tpu"),
        ("prepare", "--config", "bad.yaml"),
        ("inspect", "bad.yaml"),
        ("init", "other", "--set", "train.seed=-1"),
        ("encode", "--model", "none", "--dtype", "int8"),
        ("encode", "--model", "none", "--errors", "ignore"),
        ("encode", "--model", "none", "--strict-pairs"),
        ("encode", "--model", "none", "--tokens", "--format", "npy", "-o", "x.npy"),
        ("encode", "--model", "none", "--device", "tpu"),
        ("encode", "--model", "none", "missing.txt"),
        ("encode", "--model", "none"),
        # what pretrain refuses from files alone (after torch, each refusal costs 4.2-4.8 s and 250 MB)
        ("pretrain", "--config", "good/config.yaml", "--resume", "nowhere"),
        ("pretrain", "--config", "good/config.yaml", "--resume", "."),
        ("pretrain", "--config", "ran/config.yaml", "--resume", "never"),
        ("pretrain", "--config", "nocorpus/config.yaml"),
    ],
)
def test_config_refusals_do_not_wait_for_torch(args, tmp_path):
    """A config error is refused (exit 2, one line) before torch is imported (3-4 s, 240 MB)."""
    (tmp_path / "bad.yaml").write_text("output_dir: run\nbogus_key: 1\n")
    write_config(tmp_path / "good")
    write_config(tmp_path / "ran")
    (tmp_path / "ran" / "checkpoints" / "step-0000001").mkdir(parents=True)
    for name in ("model.safetensors", "config.yaml", "training_state.pt", "trainer_state.json"):
        (tmp_path / "ran" / "checkpoints" / "step-0000001" / name).write_text("")
    write_config(tmp_path / "nocorpus", f"data.corpus={tmp_path / 'gone.txt'}")
    out, err = refuse_in_fresh_interpreter(*args, cwd=tmp_path)
    assert out == ["2", "False"], (out, err)
    assert len(err.strip().splitlines()) == 1, err


def test_a_run_in_use_is_refused_before_torch_loads(tmp_path):
    """A second pretrain of a run another command holds is refused before torch is imported (after it,
    the refusal cost 3.7 s and 249 MB)."""
    from bertcli import store

    write_config(tmp_path / "good")
    with store.run_lock(tmp_path / "good"):
        out, err = refuse_in_fresh_interpreter("pretrain", "--config", "good/config.yaml", cwd=tmp_path)
    assert out == ["1", "False"], (out, err)
    assert len(err.splitlines()) == 1 and f"{tmp_path / 'good'} is in use" in err, err


@pytest.mark.parametrize("name", ["checkpoints", "tensorboard", "metrics.jsonl"])
def test_a_file_of_the_users_where_a_run_writes_is_refused_before_torch_loads(tmp_path, name):
    """A file named checkpoints or tensorboard where the run keeps a folder, and a metrics.jsonl of the
    user's in a fresh output_dir (it would be rewritten without its lines), are refused before torch
    loads, the file left as it was. A line a crash cut (a record's start) is the run's own: kept working."""
    from bertcli.checkpoint import check_run_folder

    write_config(tmp_path / "run", "train.max_steps=2")
    mine = tmp_path / "run" / name
    mine.write_text('mine\n{"my": "own data"}\n')
    out, err = refuse_in_fresh_interpreter("pretrain", "--config", "run/config.yaml", cwd=tmp_path)
    assert out == ["2", "False"], (out, err)
    assert len(err.splitlines()) == 1 and err.startswith(f"bertcli: error: {mine}: ") and "output_dir" in err, err
    assert mine.read_text() == 'mine\n{"my": "own data"}\n'
    if name == "metrics.jsonl":
        mine.write_text('{"step": 4, "split": "tr')  # a run killed while it wrote its first record
        check_run_folder(tmp_path / "run", 2)


def test_what_the_data_would_refuse_is_refused_before_torch_loads(tmp_path):
    """A corpus too small for the held-out split, and a given tokenizer of another size than
    model.vocab_size, are seen in the files (prepare.check_before_training): refused before torch is
    imported, not after it and the data preparation (5.5-6.1 s and 250 MB)."""
    (tmp_path / "tiny.txt").write_text("One sentence here. And another one.\n\nA second document. More words.\n")
    write_config(tmp_path / "small", f"data.corpus={tmp_path / 'tiny.txt'}", "model.vocab_size=null")
    out, err = refuse_in_fresh_interpreter("pretrain", "--config", "small/config.yaml", cwd=tmp_path)
    assert out == ["2", "False"], (out, err)
    assert (
        len(err.splitlines()) == 1
        and (
            "2 document(s) is too small for the held-out split: validation_fraction=0.05 holds out 1, and held-out "
            "examples need at least 2 (random next sentences come from another document); set "
            "data.validation_fraction: 0 (no held-out evaluation), or add documents"
        )
        in err
    ), err  # (it says why: "2 documents ... at least 2 are needed" reads as a contradiction)

    (tmp_path / "mine").mkdir()  # a prepared_dir of the user's: refused before torch, not after it (5.5 s)
    (tmp_path / "mine" / "notes.md").write_text("my notes\n")
    write_config(tmp_path / "user", f"data.corpus={tmp_path / 'tiny.txt'}", f"data.prepared_dir={tmp_path / 'mine'}")
    out, err = refuse_in_fresh_interpreter("pretrain", "--config", "user/config.yaml", cwd=tmp_path)
    assert out == ["2", "False"], (out, err)
    assert err.startswith(f"bertcli: error: {tmp_path / 'mine'} holds notes.md, which is not a file bertcli writes"), (
        err
    )
    assert (tmp_path / "mine" / "notes.md").read_text() == "my notes\n"

    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz"]
    (tmp_path / "vocab.txt").write_text("".join(t + "\n" for t in tokens))
    (tmp_path / "docs.txt").write_text("".join(f"Document {i} has words. It has two sentences.\n\n" for i in range(60)))
    write_config(
        tmp_path / "given",
        f"data.corpus={tmp_path / 'docs.txt'}",
        f"data.tokenizer.path={tmp_path / 'vocab.txt'}",
        "model.vocab_size=99",
    )
    out, err = refuse_in_fresh_interpreter("pretrain", "--config", "given/config.yaml", cwd=tmp_path)
    assert out == ["2", "False"], (out, err)
    assert err.splitlines() == [
        f"bertcli: error: model.vocab_size=99 but the tokenizer of {tmp_path / 'vocab.txt'} has 31 tokens; "
        "set model.vocab_size: null to take the size from the tokenizer"
    ], err

    # a tokenizer to be trained has at most data.tokenizer.vocab_size tokens: refused before the data is prepared (12 s)
    larger = ("--set", "data.tokenizer.vocab_size=500", "--set", "model.vocab_size=600")
    line = (
        "bertcli: error: model.vocab_size=600 but the tokenizer to be trained has at most data.tokenizer.vocab_size="
        "500 tokens; set model.vocab_size: null to take the size from the tokenizer"
    )
    write_config(tmp_path / "trained", f"data.corpus={tmp_path / 'docs.txt'}")
    for args in (("pretrain", "--config", "trained/config.yaml"), ("init", "new", "--corpus", "docs.txt")):
        out, err = refuse_in_fresh_interpreter(*args, *larger, cwd=tmp_path)
        assert out == ["2", "False"] and err.splitlines() == [line], (args, out, err)
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("given", ["run/config.yaml", "run/checkpoints", "run", "notes.txt", "data"])
def test_a_model_path_that_is_no_model_is_refused_before_torch_loads(tmp_path, given):
    """encode --model given a run's config, a text file or a prepared-data folder is refused before
    torch loads (after it: 6.8-9 s, 249 MB); a run's config is answered with its run folder.
    (A run folder with no checkpoint is a model path: refused later, by find_checkpoint.)"""
    write_config(tmp_path / "run")
    (tmp_path / "run" / "checkpoints").mkdir()
    (tmp_path / "notes.txt").write_text("hello world\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text("{}")
    out, err = refuse_in_fresh_interpreter("encode", "--model", given, "notes.txt", cwd=tmp_path)
    if given == "run":
        assert out[0] == "2" and "no checkpoint" in err, (out, err)
        return
    assert out == ["2", "False"], (out, err)
    expected = {  # (each near miss names what to pass)
        "run/config.yaml": "run/config.yaml: a run's config, not a model: pass the run folder, run",
        "run/checkpoints": "run/checkpoints: a run's checkpoints folder, not a model: pass the run folder, run",
        "data": "data: prepared data, not a model: pass the run folder that trained on it",
    }.get(
        given,
        f"{given}: not a model; a model is a run folder, a checkpoint folder or a Hugging Face BERT folder "
        "(config.json, model.safetensors, and tokenizer.json or vocab.txt)",
    )
    assert err.splitlines() == [f"bertcli: error: {expected}"], err


@pytest.mark.parametrize(
    ("version", "refused"),
    [
        ("cuda: Optional[str] = None\nhip: Optional[str] = None\n", True),  # a CPU build
        ("cuda: Optional[str] = '12.8'\nhip: Optional[str] = None\n", False),
        ("cuda: Optional[str] = None\nhip: Optional[str] = '6.4'\n", False),  # ROCm: torch's "cuda" device
        ("this is not python(\n", False),  # not read as expected: the driver is asked later
        (None, False),  # no version.py
    ],
)
def test_a_cuda_device_is_refused_before_torch_loads_where_torch_is_a_cpu_build(
    tmp_path, monkeypatch, request, version, refused
):
    import importlib.machinery
    import importlib.util

    from bertcli.config import check_gpu_build, torch_build

    torch_build.cache_clear()  # (read once a process: the fake package's answer must not stay)
    request.addfinalizer(torch_build.cache_clear)
    package = tmp_path / "torch"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('imported')\n")
    if version is not None:
        (package / "version.py").write_text("from typing import Optional\n__version__ = '9.9'\n" + version)
    spec = importlib.machinery.ModuleSpec("torch", None, origin=str(package / "__init__.py"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    check_gpu_build("cpu", "--device")  # never refused
    check_gpu_build("auto", "--device")
    if refused:
        with pytest.raises(UsageError, match=r"--device 'cuda:1': the installed PyTorch \(9.9\) is a CPU build"):
            check_gpu_build("cuda:1", "--device")
    else:
        check_gpu_build("cuda:1", "--device")
