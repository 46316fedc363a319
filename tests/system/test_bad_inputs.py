"""A catalogue of bad inputs across every command. Each case expects its exit code (2 for usage,
config and input errors, 1 for run-time errors), exactly one `bertcli: error:` line on stderr that
names the problem and where it is, no traceback, and no partial output left behind."""

from __future__ import annotations

import gzip
import os
import re
import shutil
from pathlib import Path

import pytest
from conftest import text_run, without_file_hashes, write_config


@pytest.fixture(scope="module")
def base(tmp_path_factory, trained, small_corpus) -> dict[str, Path]:
    """A trained synthetic run, a trained text run (`trained`), and a small corpus to spoil."""
    from bertcli.resolve import load_run
    from bertcli.trainer import pretrain

    root = tmp_path_factory.mktemp("bad")
    config = write_config(root / "syn", "train.max_steps=4", "train.eval_every=0")
    pretrain(load_run(config), quiet=True)
    return {"root": root, "syn": root / "syn", "text": trained, "corpus": small_corpus}


def _write(folder: Path, name: str, content: str | bytes) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def _copy_ckpt(base, folder: Path) -> Path:
    """A copy of a checkpoint without the SHA-256 record of its files, so that the damage done to it
    meets the checks below that record (a checkpoint of an older bertcli, or one a person forged)."""
    src = base["syn"] / "checkpoints" / "step-0000004"
    dst = folder / "ckpt"
    shutil.copytree(src, dst)
    return without_file_hashes(dst)


def _bit_flipped(ckpt: Path) -> Path:
    """One bit of a weight flipped (the value stays finite): only the recorded SHA-256 tells."""
    data = bytearray((ckpt / "model.safetensors").read_bytes())
    data[-3] ^= 0x01
    (ckpt / "model.safetensors").write_bytes(bytes(data))
    return ckpt


def _text_ckpt(folder: Path, base) -> Path:
    """A copy of the text run's checkpoint (it holds a tokenizer), as folder/ck, to spoil."""
    return Path(shutil.copytree(base["text"] / "checkpoints" / "step-0000004", folder / "ck"))


def _config_edited(ckpt: Path) -> Path:
    """Another activation in the checkpoint's config.yaml: the weights still fit, the vectors differ."""
    text = (ckpt / "config.yaml").read_text()
    assert "hidden_act: gelu" in text
    (ckpt / "config.yaml").write_text(text.replace("hidden_act: gelu", "hidden_act: relu"))
    return ckpt


def _cut_in_half(ckpt: Path, name: str) -> Path:
    """`name` as a crash can leave it: its second half zeros (a file whose size was written, not its blocks)."""
    data = (ckpt / name).read_bytes()
    (ckpt / name).write_bytes(data[: len(data) // 2] + bytes(len(data) - len(data) // 2))
    return ckpt


VOCAB_SPECIAL_ONLY = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n"
VOCAB_UNK_FIRST = "".join(f"{t}\n" for t in ["[UNK]", "[PAD]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "of", "to"])
VOCAB_REPEATED = "".join(
    f"{t}\n" for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "of", "the", "to"]
)


def _fifo(path: Path) -> Path:
    import os

    os.mkfifo(path)
    return path


def _without(ckpt: Path, name: str) -> Path:
    (ckpt / name).unlink()
    return ckpt


def _emptied(ckpt: Path, name: str) -> Path:
    (ckpt / name).write_bytes(b"")
    return ckpt


def _hf_without(run: Path, folder: Path, *names: str) -> Path:
    """The run exported as a Hugging Face folder, less the named files (as users lay folders out)."""
    from bertcli.export import export

    out = export(run, folder / "hf")
    for name in names:
        (out / name).unlink()
    return out


def _hf_claiming(run: Path, folder: Path, key: str, value: int) -> Path:
    """The run exported as a Hugging Face folder whose config.json claims another size than its weights."""
    import json

    out = _hf_without(run, folder)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {key: value}))
    return out


def _hf_with_a_larger_tokenizer(run: Path, folder: Path) -> Path:
    """The run exported as a Hugging Face folder whose vocab.txt has more tokens than the model has rows."""
    out = _hf_without(run, folder, "tokenizer.json")
    (out / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(1100)])
    )
    return out


def _hf_padded_tokenizer(run: Path, folder: Path, name: str = "tokenizer.json") -> Path:
    """The run exported as a Hugging Face folder whose tokenizer file `name` is 3 MiB (read whole, a
    tokenizer of millions of tokens, or a vocab.txt of one 600 MB line, took gigabytes before the
    vocabulary-size refusal); a vocab.txt alone (no tokenizer.json)."""
    out = _hf_without(run, folder, *(["tokenizer.json"] if name == "vocab.txt" else []))
    text = (out / name).read_text()
    (out / name).write_text(text + " " * (3 * 2**20 - len(text.encode())))
    return out


def _hf_nested(run: Path, folder: Path, name: str) -> Path:
    """The run exported as a Hugging Face folder whose JSON file `name` nests 5,000 lists (10 KB)."""
    out = _hf_without(run, folder)
    (out / name).write_text("[" * 5000 + "]" * 5000)
    return out


def _ckpt_claiming(run: Path, folder: Path, line: str, value: str) -> Path:
    """A copy of a run's checkpoint whose config.yaml claims another size than its weights, without the
    SHA-256 record (which would name the edit first): the check of sizes against the weights meets it."""
    ckpt = Path(shutil.copytree(run / "checkpoints" / "step-0000004", folder / "ckpt"))
    text = (ckpt / "config.yaml").read_text()
    assert line in text
    (ckpt / "config.yaml").write_text(text.replace(line, value, 1))
    return without_file_hashes(ckpt)


def _with_checkpoint(base, folder: Path) -> Path:
    """A micro run config in `folder` whose output_dir already holds a checkpoint."""
    config = write_config(folder)
    shutil.copytree(_copy_ckpt(base, folder), folder / "checkpoints" / "step-0000004")
    return config


def _truncated(ckpt: Path) -> Path:
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    return ckpt


def _weights_of(ckpt: Path, other: Path) -> Path:
    shutil.copyfile(other / "model.safetensors", ckpt / "model.safetensors")
    return ckpt


def _with_extra_tensor(ckpt: Path) -> Path:
    """A checkpoint whose weights file holds one tensor the model has no place for (export would publish it)."""
    import safetensors.torch
    import torch

    weights = safetensors.torch.load_file(ckpt / "model.safetensors")
    safetensors.torch.save_file(weights | {"secret.payload": torch.zeros(3)}, ckpt / "model.safetensors")
    return ckpt


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _gzipped(path: Path) -> bytes:
    return gzip.compress(path.read_bytes())


def _flipped(data: bytes) -> bytes:
    """One byte of the compressed stream inverted: zlib or the CRC check notices."""
    return data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 0xFF]) + data[len(data) // 2 + 1 :]


def _corpus_folder(d: Path, b, name: str = "texts") -> Path:
    (d / name).mkdir()
    shutil.copyfile(b["corpus"], d / name / "docs.txt")
    return d / name


def _pickle_only(run: Path, folder: Path) -> Path:
    """An exported folder whose weights are a pytorch_model.bin (never read: bertcli unpickles nothing)."""
    out = _hf_without(run, folder, "model.safetensors")
    (out / "pytorch_model.bin").write_bytes(b"not read")
    return out


CONFIG_OK = "data:\n  corpus: synthetic\nmodel:\n  vocab_size: 128\n"

# (id, make(folder, base) -> args, exit code, the key facts the error line must name: the paths the case
# made, the setting, flag or file at fault; {d} is the case's folder, {run}, {syn} and {corpus} the base's)
CASES = [
    (
        "malformed-yaml",
        lambda d, b: ["pretrain", "-c", _write(d, "c.yaml", "model:\n  hidden_size: [1, 2\n")],
        2,
        ("{d}/c.yaml", "malformed YAML"),
    ),
    (
        "yaml-not-a-mapping",
        lambda d, b: ["pretrain", "-c", _write(d, "c.yaml", "- a\n- b\n")],
        2,
        ("{d}/c.yaml", "mapping", "list"),
    ),
    (
        "unknown-section",
        lambda d, b: ["pretrain", "-c", _write(d, "c.yaml", "trian:\n  seed: 1\n")],
        2,
        ("{d}/c.yaml", "trian", "'train'"),
    ),
    (
        "unknown-model-key",
        lambda d, b: ["pretrain", "-c", _write(d, "c.yaml", "model:\n  hidden_sze: 64\n")],
        2,
        ("model.hidden_sze", "'hidden_size'"),
    ),
    (
        "unknown-nested-key",
        lambda d, b: ["pretrain", "-c", _write(d, "c.yaml", "data:\n  tokenizer:\n    vocab_sise: 9\n")],
        2,
        ("data.tokenizer.vocab_sise", "unknown key"),
    ),
    (
        "key-in-wrong-section",
        lambda d, b: ["pretrain", "-c", _write(d, "c.yaml", "train:\n  lr: 0.1\n")],
        2,
        ("train.lr", "unknown key"),
    ),
    (
        "wrong-type-int",
        lambda d, b: ["pretrain", "-c", _write(d, "c.yaml", "model:\n  hidden_size: big\n")],
        2,
        ("model.hidden_size", "integer", "'big'"),
    ),
    (
        "wrong-type-bool",
        lambda d, b: ["pretrain", "-c", _write(d, "c.yaml", "logging:\n  tensorboard: maybe\n")],
        2,
        ("logging.tensorboard", "true or false", "'maybe'"),
    ),
    (
        "wrong-choice",
        lambda d, b: ["pretrain", "-c", _write(d, "c.yaml", "precision:\n  mode: fp8\n")],
        2,
        ("precision.mode", "bf16", "'fp8'"),
    ),
    (
        "heads-do-not-divide",
        lambda d, b: [
            "pretrain",
            "-c",
            _write(d, "c.yaml", CONFIG_OK + "  hidden_size: 100\n  num_attention_heads: 3\n"),
        ],
        2,
        ("model.hidden_size", "100", "model.num_attention_heads=3"),
    ),
    (
        "sequence-too-long",
        lambda d, b: ["pretrain", "-c", _write(d, "c.yaml", CONFIG_OK + "  max_position_embeddings: 64\n")],
        2,
        ("data.max_seq_length", "128", "model.max_position_embeddings=64"),
    ),
    (
        "masking-probability",
        lambda d, b: ["pretrain", "-c", _write(d, "c.yaml", CONFIG_OK), "--set", "data.masked_lm_prob=1.5"],
        2,
        ("--set", "data.masked_lm_prob", "1.5"),
    ),
    (
        "negative-loss-weight",
        lambda d, b: ["pretrain", "-c", _write(d, "c.yaml", CONFIG_OK), "--set", "train.nsp_weight=-1"],
        2,
        ("--set", "train.nsp_weight", "negative"),
    ),
    (
        "set-bad-path",
        lambda d, b: ["pretrain", "-c", _write(d, "c.yaml", CONFIG_OK), "--set", "train.max_stepz=3"],
        2,
        ("--set", "train.max_stepz", "unknown key"),
    ),
    (
        "set-bad-value",
        lambda d, b: ["pretrain", "-c", _write(d, "c.yaml", CONFIG_OK), "--set", "train.max_steps=many"],
        2,
        ("--set", "train.max_steps", "'many'"),
    ),
    (
        "set-no-equals",
        lambda d, b: ["pretrain", "-c", _write(d, "c.yaml", CONFIG_OK), "--set", "train.max_steps"],
        2,
        ("--set", "'train.max_steps'", "section.key=value"),
    ),
    (
        "set-negative-seed",
        lambda d, b: ["pretrain", "-c", text_run(d, b["corpus"]), "--set", "train.seed=-1"],
        2,
        ("--set", "train.seed", "-1"),
    ),
    (
        "set-overflowing-steps",
        lambda d, b: ["pretrain", "-c", text_run(d, b["corpus"]), "--set", "train.max_steps=1e300"],
        2,
        ("--set", "train.max_steps", "'1e300'", "digits"),
    ),
    (
        "set-infinite-eps",
        lambda d, b: ["pretrain", "-c", _write(d, "c.yaml", CONFIG_OK), "--set", "optimizer.eps=inf"],
        2,
        ("--set", "optimizer.eps", "'inf'", "finite"),
    ),
    (
        "output-inside-the-corpus",
        lambda d, b: ["pretrain", "-c", text_run(d, _corpus_folder(d, b), f"output_dir={d / 'texts' / 'run'}")],
        2,
        ("output_dir {d}/texts/run", "corpus {d}/texts"),
    ),
    (
        "output-is-the-corpus",
        lambda d, b: ["prepare", "-c", text_run(d, _corpus_folder(d, b)), "--set", f"output_dir={d / 'texts'}"],
        2,
        ("output_dir {d}/texts", "corpus {d}/texts"),
    ),
    (
        "init-output-inside-the-corpus",
        lambda d, b: ["init", _corpus_folder(d, b) / "run", "--corpus", d / "texts"],
        2,
        ("output_dir {d}/texts/run", "corpus {d}/texts"),
    ),
    (
        "init-set-output-inside-the-corpus",
        lambda d, b: [
            "init",
            d / "run",
            "--corpus",
            _corpus_folder(d, b),
            "--set",
            f"output_dir={d / 'texts' / 'out'}",
        ],
        2,
        ("output_dir {d}/texts/out", "corpus {d}/texts"),
    ),
    (
        "corpus-inside-checkpoints",
        lambda d, b: ["pretrain", "-c", text_run(d, _corpus_folder(d, b, "checkpoints"))],
        2,
        ("corpus {d}/checkpoints", "output_dir"),
    ),
    (
        "init-from-pickle-only",
        lambda d, b: ["init", d / "run", "--init-from", _pickle_only(b["text"], d)],
        2,
        ("{d}/hf", "pytorch_model.bin", "model.safetensors"),
    ),
    ("config-is-a-folder", lambda d, b: ["pretrain", "-c", d], 2, ("{d}:", "is a folder")),
    ("config-missing", lambda d, b: ["pretrain", "-c", d / "none.yaml"], 2, ("{d}/none.yaml", "not found")),
    (
        "config-not-utf8",
        lambda d, b: ["pretrain", "-c", _write(d, "c.yaml", b"model:\n  \xff\xfe: 1\n")],
        2,
        ("{d}/c.yaml", "UTF-8"),
    ),
    ("unknown-preset", lambda d, b: ["init", d / "run", "--preset", "huge"], 2, ("--preset", "'huge'")),
    (
        "init-over-existing",
        lambda d, b: ["init", _write(d, "run/config.yaml", "train:\n  max_steps: 5\n").parent],
        2,
        ("{d}/run/config.yaml", "--force"),
    ),
    (
        "corpus-missing",
        lambda d, b: ["init", d / "run", "--corpus", d / "nowhere"],
        2,
        ("{d}/nowhere", "not found", "data.corpus"),
    ),
    (  # the same setting given by --set is checked as --corpus is
        "corpus-missing-by-set",
        lambda d, b: ["init", d / "run", "--set", f"data.corpus={d / 'nowhere'}"],
        2,
        ("{d}/nowhere", "not found", "data.corpus"),
    ),
    (  # read as plain text, its header, ids and commas would be trained on
        "corpus-csv",
        lambda d, b: ["init", d / "run", "--corpus", _write(d, "rows.csv", "id,title,text\n1,a,Some text.\n")],
        2,
        ("{d}/rows.csv", "CSV"),
    ),
    (
        "corpus-utf16",
        lambda d, b: [
            "prepare",
            "-c",
            write_config(
                d, "data.corpus=" + str(_write(d, "u.txt", "Some text.\n".encode("utf-16"))), "model.vocab_size=null"
            ),
        ],
        2,
        ("{d}/u.txt", "UTF-16"),
    ),
    (
        "corpus-fifo",
        lambda d, b: ["init", d / "run", "--corpus", _fifo(d / "pipe")],
        2,
        ("{d}/pipe", "not a regular file"),
    ),
    (
        "corpus-dev-null",
        lambda d, b: ["init", d / "run", "--corpus", "/dev/null"],
        2,
        ("/dev/null", "not a regular file"),
    ),
    (
        "corpus-empty",
        lambda d, b: [
            "prepare",
            "-c",
            write_config(d, f"data.corpus={_write(d, 'e.txt', chr(10) * 3)}", "model.vocab_size=null"),
        ],
        2,
        ("data.corpus", "{d}/e.txt", "empty"),
    ),
    (
        "corpus-binary",
        lambda d, b: [
            "prepare",
            "-c",
            write_config(d, f"data.corpus={_write(d, 'b.txt', b'ab' + bytes(range(256)))}", "model.vocab_size=null"),
        ],
        2,
        ("{d}/b.txt", "NUL"),
    ),
    (
        "corpus-not-utf8",
        lambda d, b: [
            "prepare",
            "-c",
            write_config(
                d,
                f"data.corpus={_write(d, 'l.txt', b'ok' + bytes([10, 99, 97, 102, 233, 10]))}",
                "model.vocab_size=null",
            ),
        ],
        2,
        ("{d}/l.txt", "byte 6", "line 2", "UTF-8"),
    ),
    (
        "corpus-gzip-truncated",
        lambda d, b: [
            "prepare",
            "-c",
            write_config(
                d, f"data.corpus={_write(d, 'cut.txt.gz', _gzipped(b['corpus'])[:3000])}", "model.vocab_size=null"
            ),
        ],
        2,
        ("{d}/cut.txt.gz", "line ", "gzip"),
    ),
    (  # a failed download, 0 bytes, is no empty text: gzip -t calls it damaged
        "corpus-gzip-empty",
        lambda d, b: [
            "prepare",
            "-c",
            write_config(
                d,
                f"data.corpus={_write(d, 'c/docs.txt', b['corpus'].read_bytes()).parent}",
                "model.vocab_size=null",
                f"data.prepared_dir={_write(d, 'c/empty.txt.gz', b'').parent.parent / 'data'}",
            ),
        ],
        2,
        ("{d}/c/empty.txt.gz", "line 1", "0 bytes"),
    ),
    (
        "corpus-gzip-corrupt",
        lambda d, b: [
            "prepare",
            "-c",
            write_config(
                d, f"data.corpus={_write(d, 'bad.txt.gz', _flipped(_gzipped(b['corpus'])))}", "model.vocab_size=null"
            ),
        ],
        2,
        ("{d}/bad.txt.gz", "line ", "gzip"),
    ),
    (
        "corpus-not-gzip",
        lambda d, b: [
            "prepare",
            "-c",
            write_config(
                d, f"data.corpus={_write(d, 'plain.txt.gz', 'plain text' + chr(10))}", "model.vocab_size=null"
            ),
        ],
        2,
        ("{d}/plain.txt.gz", "line 1", "compressed byte"),
    ),
    (
        "corpus-one-document",
        lambda d, b: [
            "prepare",
            "-c",
            write_config(
                d,
                f"data.corpus={_write(d, 'one.txt', 'Only one document here. It has two sentences.' + chr(10))}",
                "model.vocab_size=null",
            ),
        ],
        2,
        ("{d}/one.txt", "held-out"),
    ),
    (
        "corpus-one-enormous-line",
        lambda d, b: [
            "prepare",
            "-c",
            write_config(d, f"data.corpus={_write(d, 'big.txt', 'word ' * 400_000)}", "model.vocab_size=null"),
        ],
        2,
        ("{d}/big.txt", "held-out"),
    ),
    (
        "tokenizer-disagrees",
        lambda d, b: [
            "pretrain",
            "-c",
            text_run(d, b["corpus"], "model.vocab_size=5000", f"data.prepared_dir={b['text'] / 'data'}"),
        ],
        2,
        ("model.vocab_size=5000", "{corpus}", "1,000"),
    ),
    (
        "pad-token-is-mask",  # the padding row never learns: [MASK] there would stay at zero
        lambda d, b: [
            "pretrain",
            "-c",
            text_run(d, b["corpus"], "model.pad_token_id=4", f"data.prepared_dir={b['text'] / 'data'}"),
        ],
        2,
        ("model.pad_token_id=4", "[PAD]", "token 0", "{corpus}"),
    ),
    (
        "pad-token-past-vocabulary",
        lambda d, b: [
            "pretrain",
            "-c",
            text_run(d, b["corpus"], "model.pad_token_id=99999", f"data.prepared_dir={b['text'] / 'data'}"),
        ],
        2,
        ("model.pad_token_id=99999", "[PAD]", "token 0", "{corpus}"),
    ),
    (
        "vocab-of-special-tokens-only",  # MLM's random replacements had no ids to draw from: ValueError, exit 1
        lambda d, b: [
            "prepare",
            "-c",
            text_run(d, b["corpus"], f"data.tokenizer.path={_write(d, 'vocab.txt', VOCAB_SPECIAL_ONLY)}"),
        ],
        2,
        ("{d}/vocab.txt", "special tokens"),
    ),
    (
        "vocab-with-a-repeated-token",  # 'the tokenizer's ids are not 0..N-1; cannot write vocab.txt': no file, no fix
        lambda d, b: [
            "prepare",
            "-c",
            text_run(d, b["corpus"], f"data.tokenizer.path={_write(d, 'vocab.txt', VOCAB_REPEATED)}"),
        ],
        2,
        ("{d}/vocab.txt", "'the'", "lines 6 and 9"),
    ),
    (
        "vocab-with-pad-not-first",  # the model's pad_token_id 0 was [UNK]: its embedding never learned
        lambda d, b: [
            "pretrain",
            "-c",
            text_run(d, b["corpus"], f"data.tokenizer.path={_write(d, 'vocab.txt', VOCAB_UNK_FIRST)}"),
        ],
        2,
        ("model.pad_token_id=0", "[PAD]", "token 1", "{d}/vocab.txt"),
    ),
    (
        "tokenizer-path-missing",
        lambda d, b: [
            "prepare",
            "-c",
            write_config(d, "data.corpus=sample", "model.vocab_size=null", f"data.tokenizer.path={d / 'none.json'}"),
        ],
        2,
        ("{d}/none.json", "data.tokenizer.path"),
    ),
    (
        "model-too-large",
        lambda d, b: ["pretrain", "-c", write_config(d, "model.vocab_size=1000000000")],
        2,
        ("too large", "33,000,021,506 parameters", "model.vocab_size"),
    ),
    (
        "checkpoint-other-architecture",
        lambda d, b: [
            "pretrain",
            "-c",
            write_config(d, "model.hidden_size=64"),
            "--resume",
            b["syn"] / "checkpoints" / "step-0000004",
        ],
        2,
        ("{syn}/checkpoints/step-0000004", "model.hidden_size=32", "64"),
    ),
    (
        "checkpoint-missing-file",
        lambda d, b: ["pretrain", "-c", write_config(d), "--resume", _without(_copy_ckpt(b, d), "training_state.pt")],
        2,
        ("--resume", "{d}/ckpt", "missing", "training_state.pt"),
    ),
    (  # a run folder given to --resume is answered with its newest checkpoint
        "resume-a-run-folder",
        lambda d, b: ["pretrain", "-c", write_config(d), "--resume", b["text"]],
        2,
        ("--resume", "{run}:", "run folder", "{run}/checkpoints/step-0000004"),
    ),
    (  # and its checkpoints/ folder the same
        "resume-a-runs-checkpoints-folder",
        lambda d, b: ["pretrain", "-c", write_config(d), "--resume", b["text"] / "checkpoints"],
        2,
        ("--resume", "{run}/checkpoints:", "run folder", "{run}/checkpoints/step-0000004"),
    ),
    (  # and a model folder with model.init_from
        "resume-a-model-folder",
        lambda d, b: ["pretrain", "-c", write_config(d), "--resume", _write(d / "hf", "config.json", "{}").parent],
        2,
        ("--resume", "{d}/hf", "Hugging Face", "model.init_from"),
    ),
    (
        "safetensors-truncated",
        lambda d, b: ["pretrain", "-c", write_config(d), "--resume", _truncated(_copy_ckpt(b, d))],
        1,
        ("{d}/ckpt", "damaged", "model.safetensors:"),
    ),
    (
        "safetensors-tampered-shape",
        lambda d, b: [
            "pretrain",
            "-c",
            write_config(d, "model.intermediate_size=64"),
            "--resume",
            _weights_of(_copy_ckpt(b, d), b["text"] / "checkpoints" / "step-0000004"),
        ],
        2,
        ("{d}/ckpt/model.safetensors", "shape"),
    ),
    (
        "encode-missing-model",
        lambda d, b: ["encode", "--model", d / "nothing", _write(d, "in.txt", "a\n")],
        2,
        ("{d}/nothing", "no such"),
    ),
    (
        "encode-missing-input",
        lambda d, b: ["encode", "--model", b["text"], d / "none.txt"],
        2,
        ("{d}/none.txt", "not found"),
    ),
    (  # zstd (and zip) is known by its first bytes, before the model loads, not read as text
        "encode-a-zstd-file",
        lambda d, b: ["encode", "--model", b["text"], _write(d, "in.txt.zst", b"\x28\xb5\x2f\xfd" + bytes(20))],
        2,
        ("{d}/in.txt.zst", "zstd"),
    ),
    (  # UTF-16 is known by its first bytes, before the model loads (seconds, hundreds of MB)
        "encode-a-utf16-file",
        lambda d, b: ["encode", "--model", b["text"], _write(d, "in.txt", "a line\n".encode("utf-16"))],
        2,
        ("{d}/in.txt", "UTF-16"),
    ),
    (  # replacing the link by a file of this run's records would be unsaid
        "pretrain-metrics-a-link",
        lambda d, b: [
            "pretrain",
            "-c",
            write_config(d),
            "--quiet",
            (d / "metrics.jsonl").symlink_to(_write(d, "other/metrics.jsonl", '{"step": 1, "split": "train"}\n'))
            or "--stop-at",
            "1",
        ],
        2,
        ("{d}/metrics.jsonl", "symbolic link"),
    ),
    (  # a file of the user's where the run records its settings is neither read as the run's nor replaced
        "pretrain-settings-not-bertcli-s",
        lambda d, b: ["pretrain", "-c", write_config(d), _write(d, "resolved-config.yaml", "my notes\n") and "--quiet"],
        2,
        ("{d}/resolved-config.yaml", "not the file of settings bertcli writes"),
    ),
    (  # through the link, the records a resume leaves out would be dropped, unsaid
        "pretrain-metrics-left-behind-a-link",
        lambda d, b: [
            "pretrain",
            "-c",
            write_config(d),
            "--quiet",
            (d / "metrics.left-behind.jsonl").symlink_to(_write(d, "other/notes.jsonl", "mine\n")) or "--stop-at",
            "1",
        ],
        2,
        ("{d}/metrics.left-behind.jsonl", "symbolic link"),
    ),
    (  # JSON Lines under v.npz would make np.load fail on "pickled data"
        "encode-output-named-for-another-format",
        lambda d, b: ["encode", "--model", b["text"], _write(d, "in.txt", "a\n"), "--output", d / "v.npz"],
        2,
        ("--output", "{d}/v.npz", ".jsonl"),
    ),
    (  # plain rows under a .gz name are no gzip file
        "encode-output-with-a-compression-suffix",
        lambda d, b: ["encode", "--model", b["text"], _write(d, "in.txt", "a\n"), "--output", d / "v.tsv.gz"],
        2,
        ("--output", "{d}/v.tsv.gz", ".jsonl"),
    ),
    (  # a pooling with --tokens would be ignored
        "encode-tokens-with-a-pooling",
        lambda d, b: ["encode", "--model", b["text"], _write(d, "in.txt", "a\n"), "--tokens", "--pooling", "max"],
        2,
        ("--tokens", "--pooling max"),
    ),
    (  # gzip is known by its first bytes, before the model loads, not as "line 1 is not valid UTF-8"
        "encode-a-gzip-file",
        lambda d, b: ["encode", "--model", b["text"], _write(d, "in.txt.gz", gzip.compress(b"a line\n"))],
        2,
        ("{d}/in.txt.gz", "gzip"),
    ),
    (
        "encode-synthetic-run",
        lambda d, b: ["encode", "--model", b["syn"], _write(d, "in.txt", "a\n")],
        2,
        ("{syn}/checkpoints/step-0000004", "tokenizer.json"),
    ),
    (
        "encode-pairs-shorter-than-their-special-tokens",
        lambda d, b: [
            "encode",
            "--model",
            b["text"],
            "--pairs",
            "--max-length",
            "2",
            _write(d, "in.txt", "a b\t" + "word " * 600 + "\n"),
        ],
        2,
        ("--max-length 2", "--pairs"),
    ),
    (
        "encode-run-not-trained-yet",
        lambda d, b: ["encode", "--model", text_run(d / "run", b["corpus"]).parent, _write(d, "in.txt", "a\n")],
        2,
        ("{d}/run:", "no checkpoint"),
    ),
    (
        "init-from-a-run-folder",
        lambda d, b: ["init", d / "run", "--init-from", b["text"]],
        2,
        ("model.init_from", "{run}", "{run}/checkpoints/step-0000004"),
    ),
    (
        "encode-bad-layer",
        lambda d, b: ["encode", "--model", b["text"], "--layer", "9", _write(d, "in.txt", "a\n")],
        2,
        ("--layer 9", "to 2"),
    ),
    (
        "encode-pooler-of-a-middle-layer",
        lambda d, b: [
            "encode",
            "--model",
            b["text"],
            "--pooling",
            "pooler",
            "--layer",
            "1",
            _write(d, "in.txt", "a\n"),
        ],
        2,
        ("--pooling pooler", "last layer"),
    ),
    (
        "encode-output-in-a-missing-folder",
        lambda d, b: ["encode", "--model", b["text"], _write(d, "in.txt", "a\n"), "-o", d / "nowhere" / "v.npy"],
        2,
        ("--output", "{d}/nowhere/v.npy", "does not exist"),
    ),
    (
        "encode-tokens-into-npy",
        lambda d, b: ["encode", "--model", b["text"], _write(d, "in.txt", "a\n"), "--tokens", "-o", d / "t.npy"],
        2,
        ("--tokens", "JSONL", ".jsonl"),
    ),
    (
        "encode-incomplete-checkpoint",
        lambda d, b: [
            "encode",
            "--model",
            _without(_copy_ckpt(b, d), "trainer_state.json"),
            _write(d, "in.txt", "a\n"),
        ],
        2,
        ("{d}/ckpt", "trainer_state.json"),
    ),
    (
        "encode-not-a-model",
        lambda d, b: ["encode", "--model", _write(d, "in.txt", "a\n").parent, d / "in.txt"],
        2,
        ("{d}:", "not a model"),
    ),
    (
        "encode-hf-without-tokenizer",
        lambda d, b: [
            "encode",
            "--model",
            _hf_without(b["text"], d, "tokenizer.json", "vocab.txt"),
            _write(d, "in.txt", "a\n"),
        ],
        2,
        ("{d}/hf", "tokenizer.json", "vocab.txt"),
    ),
    (
        "encode-hf-without-weights",
        lambda d, b: ["encode", "--model", _hf_without(b["text"], d, "model.safetensors"), _write(d, "in.txt", "a\n")],
        2,
        ("{d}/hf:", "no model.safetensors"),
    ),
    (
        "encode-hf-config-claims-other-sizes",
        lambda d, b: [
            "encode",
            "--model",
            _hf_claiming(b["text"], d, "hidden_size", 4_000_000),
            _write(d, "in.txt", "a\n"),
        ],
        2,
        ("{d}/hf/config.json", "hidden_size 4,000,000", "(1000, 32)"),
    ),
    (
        "inspect-hf-config-claims-other-sizes",
        lambda d, b: ["inspect", _hf_claiming(b["text"], d, "max_position_embeddings", 10**10)],
        2,
        ("{d}/hf/config.json", "max_position_embeddings 10,000,000,000", "model.safetensors"),
    ),
    (
        "init-from-hf-config-claims-other-layers",
        lambda d, b: ["init", d / "run", "--init-from", _hf_claiming(b["text"], d, "num_hidden_layers", 100_000)],
        2,
        ("{d}/hf/config.json", "num_hidden_layers 100,000", "2 layers"),
    ),
    (
        "encode-hf-tokenizer-past-the-vocabulary",
        lambda d, b: ["encode", "--model", _hf_with_a_larger_tokenizer(b["text"], d), _write(d, "in.txt", "w1090\n")],
        2,
        ("{d}/hf/vocab.txt", "past vocab_size 1,000"),
    ),
    (
        "inspect-hf-tokenizer-json-past-any-vocabulary-of-the-model",
        lambda d, b: ["inspect", _hf_padded_tokenizer(b["text"], d)],
        2,
        ("{d}/hf/tokenizer.json", "3.0 MiB", "vocab_size 1,000"),
    ),
    (
        "encode-hf-vocab-txt-of-a-line-past-any-vocabulary-of-the-model",
        lambda d, b: ["encode", "--model", _hf_padded_tokenizer(b["text"], d, "vocab.txt"), _write(d, "in.txt", "a\n")],
        2,
        ("{d}/hf/vocab.txt", "3.0 MiB", "vocab_size 1,000"),
    ),
    (
        "inspect-hf-config-nested-too-deeply",
        lambda d, b: ["inspect", _hf_nested(b["text"], d, "config.json")],
        2,
        ("{d}/hf/config.json", "recursion"),
    ),
    (
        "encode-hf-tokenizer-config-nested-too-deeply",
        lambda d, b: [
            "encode",
            "--model",
            _hf_nested(b["text"], d, "tokenizer_config.json"),
            _write(d, "in.txt", "a\n"),
        ],
        2,
        ("{d}/hf/tokenizer_config.json", "recursion"),
    ),
    (
        "prepare-jsonl-record-nested-too-deeply",
        lambda d, b: [
            "prepare",
            "-c",
            text_run(d, _write(d, "c/a.jsonl", '{"text": "a b."}\n' + "[" * 5000 + "]" * 5000 + "\n")),
        ],
        2,
        ("{d}/c/a.jsonl", "line 2", "nested"),
    ),
    (
        "prepare-jsonl-record-with-two-texts",  # json keeps the last: 'dup key 1' would be dropped
        lambda d, b: [
            "prepare",
            "-c",
            text_run(d, _write(d, "c/a.jsonl", '{"text": "a b."}\n{"text": "dup key 1", "text": "dup key 2"}\n')),
        ],
        2,
        ("{d}/c/a.jsonl", "line 2", 'two "text"'),
    ),
    (
        "error-line-of-a-path-with-a-line-break",  # its line break escaped: one error line
        lambda d, b: ["init", d / "run", "--corpus", d / "a\nb.txt"],
        2,
        ("{d}/a\\nb.txt", "not found"),
    ),
    (
        "export-checkpoint-config-claims-other-sizes",
        lambda d, b: [
            "export",
            _ckpt_claiming(b["text"], d, "intermediate_size: 64", "intermediate_size: 64000000000"),
            d / "out",
        ],
        2,
        ("{d}/ckpt/config.yaml", "intermediate_size 64,000,000,000", "model.safetensors"),
    ),
    (
        "export-into-prepared-data",
        lambda d, b: ["export", b["text"], b["text"] / "data" / "hf"],
        2,
        ("{run}/data/hf", "prepared data"),
    ),
    (
        "export-into-checkpoints",
        lambda d, b: ["export", b["text"], b["text"] / "checkpoints" / "hf"],
        2,
        ("{run}/checkpoints/hf", "checkpoints folder"),
    ),
    (
        "export-extra-tensor",
        lambda d, b: ["export", _with_extra_tensor(_copy_ckpt(b, d)), d / "out"],
        2,
        ("{d}/ckpt/model.safetensors", "secret.payload"),
    ),
    (  # (an empty folder is used as a new one)
        "export-existing-folder",
        lambda d, b: ["export", b["text"], _write(d, "out/notes.txt", "mine").parent],
        2,
        # (no "pass --force": --force refuses it too)
        ("{d}/out", "notes.txt"),
    ),
    ("export-no-checkpoint", lambda d, b: ["export", d, d / "out"], 2, ("{d}:", "no checkpoint")),
    ("inspect-missing", lambda d, b: ["inspect", d / "nothing"], 2, ("{d}/nothing", "no such file")),
    ("device-unknown", lambda d, b: ["pretrain", "-c", write_config(d), "--device", "tpu"], 2, ("--device", "'tpu'")),
    (
        "resume-missing",
        lambda d, b: ["pretrain", "-c", write_config(d), "--resume", d / "nowhere"],
        2,
        ("--resume", "{d}/nowhere", "no such"),
    ),
    (
        "resume-never-over-checkpoints",
        lambda d, b: ["pretrain", "-c", _with_checkpoint(b, d), "--resume", "never"],
        2,
        ("{d}/checkpoints", "1 checkpoint", "--resume never", "--resume auto"),
    ),
    (
        "batch-size-past-memory",
        lambda d, b: ["pretrain", "-c", write_config(d, "train.batch_size=1000000000")],
        2,
        ("train.batch_size=1,000,000,000", "memory"),
    ),
    (
        "micro-batch-past-memory",
        lambda d, b: [
            "pretrain",
            "-c",
            write_config(d, "train.batch_size=1000000000", "train.micro_batch_size=1000000000"),
        ],
        2,
        ("train.micro_batch_size", "1,000,000,000", "memory"),
    ),
    (
        "eval-examples-a-million",
        lambda d, b: ["pretrain", "-c", write_config(d), "--set", "train.eval_examples=1000000"],
        2,
        ("--set", "train.eval_examples", "100,000", "1,000,000"),
    ),
    (
        "max-predictions-past-length",
        lambda d, b: ["pretrain", "-c", write_config(d), "--set", "data.max_predictions_per_seq=1000000000"],
        2,
        ("--set", "data.max_predictions_per_seq", "data.max_seq_length", "1,000,000,000"),
    ),
    (
        "data-workers-thousands",
        lambda d, b: ["pretrain", "-c", write_config(d), "--set", "train.data_workers=5000"],
        2,
        ("--set", "train.data_workers", "64", "5,000"),
    ),
    (
        "weight-decay-past-one-over-lr",
        lambda d, b: ["pretrain", "-c", write_config(d), "--set", "optimizer.weight_decay=1e10"],
        2,
        ("--set", "optimizer.weight_decay", "optimizer.lr", "1e+10"),
    ),
    (
        "output-dir-unusable-path",
        lambda d, b: ["pretrain", "-c", _write(d, "c.yaml", CONFIG_OK + "output_dir: " + "o" * 100_000 + "\n")],
        2,
        ("{d}/c.yaml", "output_dir", "100,000 bytes"),
    ),
    ("config-dev-zero", lambda d, b: ["pretrain", "-c", "/dev/zero"], 2, ("/dev/zero", "256 KiB")),
    ("config-dev-null", lambda d, b: ["pretrain", "-c", "/dev/null"], 2, ("/dev/null", "no settings")),
    (
        "config-a-fifo",  # without a writer, opening it blocked for ever
        lambda d, b: ["prepare", "-c", _fifo(d / "c.yaml")],
        2,
        ("{d}/c.yaml", "pipe"),
    ),
    (
        "prepared-dir-inside-checkpoints",  # prepare wrote data/ into best/: the run could not resume
        lambda d, b: [
            "prepare",
            "-c",
            write_config(d, "data.corpus=sample", f"data.prepared_dir={d / 'checkpoints' / 'best' / 'data'}"),
        ],
        2,
        ("data.prepared_dir", "{d}/checkpoints/best/data", "inside {d}/checkpoints"),
    ),
    (
        "prepared-dir-is-tensorboard",
        lambda d, b: [
            "pretrain",
            "-c",
            write_config(d, "data.corpus=sample", f"data.prepared_dir={d / 'tensorboard'}"),
        ],
        2,
        ("data.prepared_dir", "{d}/tensorboard", "pretrain"),
    ),
    (
        "config-comments-only",
        lambda d, b: ["pretrain", "-c", _write(d, "c.yaml", "# nothing\n")],
        2,
        ("{d}/c.yaml", "no settings"),
    ),
    (
        "config-thousands-of-values",
        lambda d, b: ["inspect", _write(d, "c.yaml", CONFIG_OK + "extra:\n" + "- 1\n" * 50_000)],
        2,
        ("{d}/c.yaml", "10,000 values"),
    ),
    (
        "weights-bit-flipped-encode",
        lambda d, b: [
            "encode",
            "--model",
            _bit_flipped(_text_ckpt(d, b)),
            _write(d, "in.txt", "a line\n"),
        ],
        2,
        ("{d}/ck/model.safetensors", "SHA-256"),
    ),
    (
        "checkpoint-config-edited-encode",
        lambda d, b: [
            "encode",
            "--model",
            _config_edited(_text_ckpt(d, b)),
            _write(d, "in.txt", "a line\n"),
        ],
        2,
        ("{d}/ck/config.yaml", "SHA-256"),
    ),
    (
        "checkpoint-config-edited-export",
        lambda d, b: [
            "export",
            _config_edited(_text_ckpt(d, b)),
            d / "out",
        ],
        2,
        ("{d}/ck/config.yaml", "SHA-256"),
    ),
    (
        "checkpoint-trainer-state-cut-encode",
        lambda d, b: [
            "encode",
            "--model",
            _cut_in_half(_text_ckpt(d, b), "trainer_state.json"),
            _write(d, "in.txt", "a line\n"),
        ],
        2,
        ("{d}/ck/trainer_state.json:",),
    ),
    (
        "checkpoint-config-cut-export",  # (below the SHA-256 record, which names any edit first)
        lambda d, b: [
            "export",
            _cut_in_half(
                without_file_hashes(_text_ckpt(d, b)),
                "config.yaml",
            ),
            d / "out",
        ],
        2,
        ("{d}/ck/config.yaml", "damaged"),
    ),
    (
        "weights-bit-flipped-resume",
        lambda d, b: [
            "pretrain",
            "-c",
            write_config(d),
            "--resume",
            _bit_flipped(Path(shutil.copytree(b["syn"] / "checkpoints" / "step-0000004", d / "ck"))),
        ],
        1,
        ("{d}/ck", "damaged", "model.safetensors:", "SHA-256"),
    ),
    (
        "training-state-empty",
        lambda d, b: ["pretrain", "-c", write_config(d), "--resume", _emptied(_copy_ckpt(b, d), "training_state.pt")],
        1,
        ("{d}/ckpt", "damaged", "training_state.pt:"),
    ),
    (
        "eval-probe-one-class",
        lambda d, b: [
            "eval",
            b["text"],
            "--probe",
            _write(d, "p.tsv", "".join(f"text {i}\tsame\n" for i in range(12))),
        ],
        2,
        ("{d}/p.tsv", "one class"),
    ),
    (
        "eval-probe-bad-jsonl-line",
        lambda d, b: ["eval", b["text"], "--probe", _write(d, "p.jsonl", '{"text": "a", "label": "x"}\n{"text": 3}\n')],
        2,
        ("{d}/p.jsonl", "line 2"),
    ),
    (
        "eval-text-utf16",
        lambda d, b: ["eval", b["text"], _write(d, "t.txt", "a line\n".encode("utf-16"))],
        2,
        ("{d}/t.txt", "UTF-16"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input(case, base, tmp_path, cli):
    name, make, code, facts = case
    args = make(tmp_path, base)
    where = {"{d}": tmp_path, "{run}": base["text"], "{syn}": base["syn"], "{corpus}": base["corpus"]}
    before = {p for p in tmp_path.rglob("*")}
    result = cli(*args)
    errors = [line for line in result.err_lines if line.startswith("bertcli: error:")]
    assert result.code == code, f"{name}: exit {result.code}\n{result.err[-800:]}"
    assert len(errors) == 1, f"{name}: {errors or result.err[-800:]}"
    for fact in facts:
        for mark, path in where.items():
            fact = fact.replace(mark, str(path))
        # A fact ending in a name or a number is whole there: {d}/texts is not {d}/texts/run, 64 not 640.
        whole = r"(?![\w./-])" if re.match(r"[\w./-]", fact[-1]) else ""
        assert re.search(re.escape(fact) + whole, errors[0]), f"{name}: {fact!r} not in {errors[0]}"
    assert "Traceback" not in result.err and result.out == ""
    # No partial output: nothing temporary, no new checkpoint or prepared-data folder.
    created = {p for p in tmp_path.rglob("*")} - before
    assert not [p for p in created if p.name.startswith(".tmp-")], created
    assert args[0] != "init" or not created, created  # a refused init writes nothing
    assert not [p for p in created if p.name.startswith("step-") or p.name in ("data", "manifest.json")], created


def test_encode_on_empty_input_is_zero_rows(base, tmp_path, cli):
    (tmp_path / "empty.txt").write_text("")
    result = cli("encode", "--model", base["text"], tmp_path / "empty.txt")
    assert result.code == 0 and result.out == "" and result.err == ""


def test_init_over_existing_leaves_the_config_alone(tmp_path, cli):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("keep: me\n")
    assert cli("init", tmp_path / "run").code == 2
    assert (tmp_path / "run" / "config.yaml").read_text() == "keep: me\n"


def test_the_catalogue_covers_every_command(base, tmp_path):
    """Every command of the CLI has bad-input cases (a new command without any fails here), and the
    case names are unique (a copied row would test one case twice under two names)."""
    from bertcli.cli import app

    commands = {c.name or c.callback.__name__ for c in app.registered_commands}
    covered = set()
    for name, make, _, _ in CASES:
        (tmp_path / name).mkdir()
        covered.add(str(make(tmp_path / name, base)[0]))
    assert commands <= covered, f"no bad-input case for {sorted(commands - covered)}"
    assert len({c[0] for c in CASES}) == len(CASES)
