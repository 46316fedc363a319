"""`bertcli encode`: rows in input order, pooling, formats, streaming, pipeline manners."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO, run_process, without_file_hashes

from bertcli import checkpoint, layout
from bertcli.encode import Writer, encode, load_encoder, resolve
from bertcli.errors import UsageError
from bertcli.export import export

LINES = [
    "the python tutorial",
    "",
    "modules and packages are explained here in some detail .",
    "a",
    "naïve café 東京",
    "x" * 50,
]


def run_encode(model, lines, fmt="jsonl", **kwargs):
    import io

    enc = load_encoder(model, torch.device("cpu"))
    stream = io.StringIO()
    writer = Writer(fmt, stream, None, kwargs.pop("with_text", False))
    counts = encode(enc, iter(lines), writer, resolve(enc, **kwargs))
    return [
        json.loads(line) for line in stream.getvalue().splitlines()
    ] if fmt == "jsonl" else stream.getvalue(), counts


def reference(trained, text, layer=None):
    """The encoder run by hand on one text: (T, H) hidden states of the last layer."""
    ckpt = layout.list_checkpoints(trained)[-1][1]
    from tokenizers import Tokenizer

    from bertcli.model import BertForPreTraining

    model = BertForPreTraining(checkpoint.read_config(ckpt).model).eval()
    checkpoint.load_weights(model, ckpt)
    ids = Tokenizer.from_file(str(ckpt / "tokenizer.json")).encode(text).ids
    with torch.no_grad():
        return model(torch.tensor([ids]), torch.zeros(1, len(ids), dtype=torch.long), torch.tensor([len(ids)])).encoded[
            0
        ], model


def pretraining_layers(ckpt, encodings, packed: bool) -> list[list[torch.Tensor]]:
    """What BertForPreTraining.forward computes inside, as the trainer calls it, for a batch of
    tokenizer encodings: for each row, the (T_row, H) output of the embeddings (layer 0) and of
    each block, captured by forward hooks; padded, or packed (train.unpad) and unpacked again."""
    from bertcli.model import BertForPreTraining, packing

    model = BertForPreTraining(checkpoint.read_config(ckpt).model).eval()  # eval: no dropout, as in encode
    checkpoint.load_weights(model, ckpt)
    lengths = [len(e.ids) for e in encodings]
    input_ids = torch.zeros(len(encodings), max(lengths), dtype=torch.long)
    token_type_ids = torch.zeros_like(input_ids)
    for row, e in enumerate(encodings):
        input_ids[row, : len(e.ids)], token_type_ids[row, : len(e.ids)] = torch.tensor(e.ids), torch.tensor(e.type_ids)
    valid_lens = torch.tensor(lengths)
    pk = packing(valid_lens, input_ids.shape[1]) if packed else None
    seen = []
    hooks = [
        m.register_forward_hook(lambda module, args, out: seen.append(pk.unpack(out) if packed else out))
        for m in [model.bert.embeddings, *model.blocks]
    ]
    with torch.no_grad():
        out = model(input_ids, token_type_ids, valid_lens, torch.zeros(len(lengths), 2, dtype=torch.long), packed=pk)
    for hook in hooks:
        hook.remove()
    assert torch.equal(pk.unpack(out.encoded) if packed else out.encoded, seen[-1]), "the last block's is the output"
    return [[layer[row, :n] for layer in seen] for row, n in enumerate(lengths)]


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_encode_reads_the_hidden_states_pretraining_computes(trained, packed):
    """encode's vectors at every layer, per token, are those the pretraining forward computes for
    the same token ids (sentence pairs included): a change to the encoder reaches both, and encode
    cannot drift into a path of its own."""
    from tokenizers import Tokenizer

    from bertcli.export import find_checkpoint

    lines = ["the python tutorial\tmodules and packages", "a", LINES[2], LINES[4]]
    ckpt = find_checkpoint(trained)
    tokenizer = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    encodings = tokenizer.encode_batch([tuple(x.split("\t")) if "\t" in x else x for x in lines])
    assert any(1 in e.type_ids for e in encodings) and len({len(e.ids) for e in encodings}) == len(lines)
    expected = pretraining_layers(ckpt, encodings, packed)
    L = checkpoint.read_config(ckpt).model.num_hidden_layers
    for layer in range(L + 1):
        rows, _ = run_encode(trained, lines, layer=layer, per_token=True, pairs=True, batch_size=3)
        for row, want in zip(rows, expected):
            assert row["tokens"] == encodings[row["line"] - 1].tokens
            np.testing.assert_allclose(
                row["vectors"], want[layer].numpy(), rtol=2e-5, atol=2e-5, err_msg=f"layer {layer}, line {row['line']}"
            )


def test_rows_in_input_order_including_empty_lines(trained):
    rows, counts = run_encode(trained, LINES, with_text=True, batch_size=2)
    assert [r["line"] for r in rows] == list(range(1, len(LINES) + 1)) and counts["lines"] == len(LINES)
    assert [r["text"] for r in rows] == LINES
    hidden, _ = reference(trained, LINES[2])  # pooled by default as sentence-transformers pools a plain BERT
    np.testing.assert_allclose(rows[2]["vector"], hidden.mean(0).numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pooling", ["cls", "mean", "max", "pooler"])
def test_pooling_matches_a_hand_computation(trained, pooling):
    rows, _ = run_encode(trained, LINES, pooling=pooling, batch_size=4)
    hidden, model = reference(trained, LINES[2])
    expected = {
        "cls": hidden[0],
        "mean": hidden.mean(0),
        "max": hidden.max(0).values,
        "pooler": model.bert.pooler(hidden[None])[0].detach(),
    }[pooling]
    np.testing.assert_allclose(rows[2]["vector"], expected.numpy(), rtol=1e-4, atol=1e-4)


def test_batching_and_length_sorting_do_not_change_vectors(trained):
    one, _ = run_encode(trained, LINES, batch_size=1, pooling="mean")
    many, _ = run_encode(trained, LINES, batch_size=6, pooling="mean")
    for a, b in zip(one, many):
        np.testing.assert_allclose(a["vector"], b["vector"], rtol=1e-4, atol=1e-4)


def test_cpu_batches_are_capped_in_token_slots(trained, monkeypatch):
    """On a CPU long texts come fewer per batch (encode.CPU_BATCH_BYTES): at most the rows asked for
    and the token slots allowed (texts x the longest; one text alone may pass it), every text once
    in the sorted order; and the vectors stay those of batches of one."""
    import bertcli.encode as encode_mod

    lengths = [3, 3, 5, 8, 8, 9, 20, 40]
    assert list(encode_mod._batches(list(range(8)), lengths, 4, 24)) == [[0, 1, 2], [3, 4], [5], [6], [7]]
    assert list(encode_mod._batches(list(range(8)), lengths, 2, None)) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    width = load_encoder(trained, torch.device("cpu")).model.config.intermediate_size
    monkeypatch.setattr(encode_mod, "CPU_BATCH_BYTES", 4 * width * 12)  # 12 token slots
    shapes = []
    forward = encode_mod._forward
    monkeypatch.setattr(
        encode_mod,
        "_forward",
        lambda enc, ids, *a: shapes.append((len(ids), max(map(len, ids)))) or forward(enc, ids, *a),
    )
    capped, _ = run_encode(trained, LINES, batch_size=6, pooling="mean")
    assert all(rows * longest <= 12 or rows == 1 for rows, longest in shapes) and len(shapes) > 2, shapes
    one, _ = run_encode(trained, LINES, batch_size=1, pooling="mean")
    for a, b in zip(one, capped):
        np.testing.assert_allclose(a["vector"], b["vector"], rtol=1e-4, atol=1e-4)


def _without_cutting(monkeypatch):
    """encode as before texts were cut: every line tokenized whole."""
    import bertcli.encode as encode_mod

    monkeypatch.setattr(encode_mod.Prefixes, "cut", lambda self, item: (item, False))


def test_a_very_long_line_is_tokenized_from_a_prefix(trained, monkeypatch):
    """Only a prefix of a line far longer than the limit is tokenized (an 18.8 MB line took 19 s and
    3.1 GB), with the vector of the whole line; a prefix that proves nothing (blanks) up to PREFIX_CAP
    characters per token is compacted (its runs of blanks shortened), and its words kept."""
    import io

    import bertcli.encode as encode_mod

    seen: list = []

    class Spy:  # the tokenizer, recording what it is given
        def __init__(self, tok) -> None:
            self.tok = tok

        def __getattr__(self, name):
            return getattr(self.tok, name)

        def encode_batch(self, inputs, **kwargs):
            seen.extend(inputs)
            return self.tok.encode_batch(inputs, **kwargs)

    enc = load_encoder(trained, torch.device("cpu"))
    enc.tokenizer = Spy(enc.tokenizer)
    lines = ["modules and packages are explained here . " * 5_000, " " * 100_000 + "words past the cap"]
    stream = io.StringIO()
    counts = encode(enc, iter(lines), Writer("jsonl", stream, None, False), resolve(enc))
    budget = resolve(enc).max_length - 2  # (the length the run was trained at)
    assert [len(x) for x in seen] == [budget * encode_mod.PREFIX_START, len(" words past the cap")]
    assert counts == {"lines": 2, "truncated": 1, "unpaired": 0, "inner_cr": 0}
    _without_cutting(monkeypatch)
    whole, _ = run_encode(trained, lines)
    assert [json.loads(row) for row in stream.getvalue().splitlines()] == whole


def test_cutting_long_texts_keeps_every_vector(trained, monkeypatch):
    """Texts about as long as cutting starts at, and far longer, of short words, words longer than a
    word piece (100 characters: [UNK]), blanks, [MASK] across the cut, removed characters, CJK,
    accents, pairs with one side long (the other even past the budget): tokens, vectors and the
    count of truncated lines are those of the whole texts."""
    import random

    from bertcli import encode as encode_module

    monkeypatch.setattr(encode_module, "PAIR_WHOLE_CHARS", 0)  # pairs' sides cut as soon as single texts are
    rng = random.Random(0)
    pieces = [
        "a",
        "the",
        "word",
        "[MASK]",
        "東京",
        "café",
        "e\u0301",
        "x" * 99,
        "y" * 100,
        "z" * 101,
        "q" * 150,
        ",",
        "foo\x00bar",
        "\u3000",
        "  ",
        "[SEP]",
        "MASK",
        "[",
    ]

    def text(size: int) -> str:
        out = ""
        while len(out) < size:
            out += rng.choice(pieces) + (" " if rng.random() < 0.6 else "")
        return out

    start = 14 * 8  # --max-length 16: 14 tokens besides [CLS] and [SEP], PREFIX_START characters each
    lines = ["a " * (n // 2) for n in range(start - 6, start + 8)] + ["a " * 3_000]
    lines += [f"{'b ' * (n // 2)}[MASK] c d e f g h i j k l m n o p" for n in range(start - 10, start + 2)]
    lines += [(w + " ") * 40 for w in ("x" * 99, "y" * 100, "z" * 101, "q" * 150)]
    lines += [" " * 500 + "the python tutorial " * 5, "foo\x00bar " * 40, "東京" * 100, "café " * 40, "e\u0301" * 300]
    lines += [text(rng.choice([start - 3, start + 3, 3 * start, 20 * start])) for _ in range(24)]
    lines += [
        "a " * 200 + "\tb c d",
        "short\t" + "x y " * 300,
        "a b c d e f g h i j k l m n o p q r\t" + "w " * 100,
        "a b c d e f g h i j k l m n o p q r\t" + "w " * 9 + "v" * 150,
        " " * 300 + "a b\t" + "c " * 200,
    ]
    cut, cut_counts = run_encode(trained, lines, max_length=16, per_token=True, pairs=True)
    _without_cutting(monkeypatch)
    whole, whole_counts = run_encode(trained, lines, max_length=16, per_token=True, pairs=True)
    assert cut_counts == whole_counts and cut_counts["truncated"] > 30
    for line, a, b in zip(lines, cut, whole):
        assert a == b, line


def test_pairs_of_ordinary_sides_are_truncated_as_the_tokenizer_truncates_them(trained, monkeypatch):
    """An odd budget's odd token goes to the longer side (longest first): with both sides cut to
    prefixes it went by the prefixes' lengths, to the other side on ordinary lines (a 28-token A with a
    46-token B at --max-length 16). Sides of up to PAIR_WHOLE_CHARS are tokenized whole."""
    import random

    rng = random.Random(0)
    words = ["the", "a", "function", "returns", "of", "python", "module", "x", "tutorial", "import", "q" * 9]

    def side() -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(20, 120)))

    lines = [f"{side()}\t{side()}" for _ in range(40)]
    cut, _ = run_encode(trained, lines, max_length=16, per_token=True, pairs=True)
    _without_cutting(monkeypatch)
    whole, _ = run_encode(trained, lines, max_length=16, per_token=True, pairs=True)
    assert [r["tokens"] for r in cut] == [r["tokens"] for r in whole]


def test_a_line_cut_at_the_cap_is_truncated_only_where_it_lost_tokens(trained, monkeypatch):
    """A line past the cap whose prefix proves nothing is counted as truncated only where what follows the prefix
    could add a token: a 30,000-character line of blanks, or of one word ([UNK], as long as it grows), gives the
    whole line's tokens, and lost nothing; a second word past the cap is lost, and said."""
    import bertcli.encode as encode_mod

    n = 16 * encode_mod.PREFIX_CAP * 2  # --max-length 16: past the cap of 14 x PREFIX_CAP characters
    exact = [
        " " * n,
        "x" * n,
        "x" * n + " " * n,
        "MASK" * (n // 4),
        "foo\x00bar" * (n // 7),
        "e\u0301" * (n // 2),
        "x" * n + "\t" + "y" * n + " " * n,
    ]  # the last: a pair, each side one word
    cut, cut_counts = run_encode(trained, exact, max_length=16, per_token=True, pairs=True)
    assert cut_counts["truncated"] == 0 and [len(row["tokens"]) for row in cut] == [2, 3, 3, 3, 3, 3, 5]
    # Runs of characters that give no token, then words: the runs are shortened (Prefixes._compact), the
    # words kept (uncompacted, `' ' * 100000 + 'x'` gives [CLS] [SEP], said truncated).
    quiet = [
        " " * n + "word",
        "\u200b" * n + "the python tutorial",
        "\x01" * n + " a b\x01c",
        "\ufeff" * n + "x" * 120,
        "\u0301" * n + "e\u0301 done",
        " \u200b\u3000\x00" * n + "[MASK] a" + " " * n + "b",
        "a" + "\u200b" * n + "b " + "\t" * 3 + "c d\t" + " " * n + "e",
        # A word far past WordPiece's 100 characters is one [UNK] however long: in
        # `'hello ' + 'a' * 70000 + ' world'` "world" is kept; after a base64 blob, words likewise.
        "hello " + "a" * n + " world",
        "QUJD" * (n // 4) + "== then some words",
        "x" * n + " " + "x" * n,
        "x" * n + "!",
        "x" * n + " z\ty",
        "é" * n + " e\u0301" * 3,
        "x\u0301" * n + " [MASK] word",  # one word of n letters, an accent after each (stripped)
        # Letters that the normaliser decomposes into several (Hangul syllables: three jamo each): in
        # `'\ud7a3' * 70000 + '. ok'`, ". ok" is kept and the line is not truncated.
        "\u2460\u2460" + "\ud7a3" * n + ". \u0e01\u0e32" + "\u00bd" * 700,
        "\ud7a3\uac00" * (n // 2) + " then words",
    ]
    compacted, compacted_counts = run_encode(trained, quiet, max_length=16, per_token=True, pairs=True)
    assert compacted_counts["truncated"] == 0
    lossy = ["w " * n + "x", "w\u200bq " * n + "x", "a " * 20 + "x" * n + " b" * 20]
    _, lossy_counts = run_encode(trained, lossy, max_length=16, pairs=True)
    assert lossy_counts["truncated"] == len(lossy)
    _without_cutting(monkeypatch)
    whole, whole_counts = run_encode(trained, exact, max_length=16, per_token=True, pairs=True)
    assert whole_counts == cut_counts and whole == cut
    whole, whole_counts = run_encode(trained, quiet, max_length=16, per_token=True, pairs=True)
    assert whole_counts == compacted_counts and whole == compacted
    assert all(len(row["tokens"]) > 2 for row in compacted), "the words after the runs are there"


def test_a_line_past_line_bytes_is_read_in_bounded_memory_and_said_truncated(trained, tmp_path, monkeypatch):
    """read_lines keeps the first LINE_BYTES of a line (here 4,096) and checks the rest without keeping
    it: the vector is the whole line's (its first tokens), and the line counts as truncated only when
    the dropped part held more than blanks; a character cut by the limit is not an error."""
    from bertcli import encode_io
    from bertcli.encode_io import NotUtf8, read_lines

    monkeypatch.setattr(encode_io, "LINE_BYTES", 4096)
    lines = ["a b c " * 2000, "word " + " " * 20_000, "東京 " * 3000, "short"]
    path = tmp_path / "in.txt"
    path.write_text("\n".join(lines) + "\n")
    read = list(read_lines([str(path)], "strict"))
    assert [len(x.encode()) <= 4096 for x in read] == [True] * 4 and read[3] == "short"
    assert [x.lost for x in read] == [True, False, True, False]
    got, counts = run_encode(trained, iter(read), max_length=16, per_token=True)
    want, _ = run_encode(trained, lines, max_length=16, per_token=True)
    assert got == want and counts["truncated"] == 2
    path.write_bytes(b"x " * 3000 + b"\tsecond half\n")
    with pytest.raises(UsageError) as late_tab:
        run_encode(trained, read_lines([str(path)], "strict"), pairs=True)
    assert all(fact in str(late_tab.value) for fact in (str(path), "line 1", "TAB")), late_tab.value
    path.write_bytes(b"x" * 5000 + b"\xff" + b"y" * 10 + b"\n")
    with pytest.raises(NotUtf8) as not_utf8:
        list(read_lines([str(path)], "strict"))
    assert all(fact in str(not_utf8.value) for fact in (str(path), "line 1", "UTF-8", "byte 5000")), not_utf8.value


def test_encoding_a_40_mb_line_takes_bounded_memory(trained, tmp_path):
    """A line is kept up to LINE_BYTES (8 MiB): kept whole, a 100 MB line takes 919 MB (9 bytes a byte)."""
    script = (
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )

    def peak_mib(text_file):
        command = [sys.executable, "-c", script, sys.executable, "-m", "bertcli", "encode", "--model", str(trained)]
        out = subprocess.run([*command, str(text_file)], capture_output=True, text=True, check=True, cwd=REPO)
        return int(out.stdout) / 1024

    (tmp_path / "short.txt").write_text("a short line\n")
    with open(tmp_path / "long.txt", "w") as fh:
        for _ in range(40):
            fh.write("the python tutorial " * 50_000)  # 1 MB at a time: the test itself stays small
        fh.write("\n")
    base, long = peak_mib(tmp_path / "short.txt"), peak_mib(tmp_path / "long.txt")
    assert long - base < 150, f"{long:.0f} MiB for a 40 MB line, {base:.0f} MiB for a short one"


def test_normalize_layer_tokens_and_pairs(trained):
    rows, _ = run_encode(trained, LINES, normalize=True)
    assert all(abs(np.linalg.norm(r["vector"]) - 1) < 1e-4 for r in rows)
    layer0, _ = run_encode(trained, LINES[:1], layer=0)
    last, _ = run_encode(trained, LINES[:1])
    assert not np.allclose(layer0[0]["vector"], last[0]["vector"])
    per_token, _ = run_encode(trained, LINES[:1], per_token=True)
    assert per_token[0]["tokens"][0] == "[CLS]" and len(per_token[0]["vectors"]) == len(per_token[0]["tokens"])
    pair, _ = run_encode(trained, ["the tutorial\tmodules"], pairs=True)
    single, _ = run_encode(trained, ["the tutorial modules"])
    assert not np.allclose(pair[0]["vector"], single[0]["vector"]), "segment ids are used"


def test_npy_tsv_and_empty_input(trained, tmp_path, cli):
    (tmp_path / "in.txt").write_text("\n".join(LINES) + "\n")
    result = cli("encode", "--model", trained, tmp_path / "in.txt", "-f", "npy", "-o", tmp_path / "v.npy")
    assert result.code == 0 and result.out == ""
    array = np.load(tmp_path / "v.npy")
    assert array.shape == (len(LINES), 32) and array.dtype == np.float32
    tsv = cli("encode", "--model", trained, tmp_path / "in.txt", "-f", "tsv")
    assert np.allclose(np.loadtxt(tsv.out.splitlines(), delimiter="\t"), array, atol=1e-4)
    (tmp_path / "empty.txt").write_text("")
    empty = cli("encode", "--model", trained, tmp_path / "empty.txt")
    assert empty.code == 0 and empty.out == "" and empty.err == ""
    assert cli("encode", "--model", trained, tmp_path / "empty.txt", "-f", "npy", "-o", tmp_path / "e.npy").code == 0
    assert np.load(tmp_path / "e.npy").shape == (0, 32)


def test_npy_goes_to_stdout_where_it_is_no_terminal(trained, tmp_path, cli, monkeypatch):
    """`encode -f npy > FILE.npy` (refusing it would leave the shell's empty file) gives the
    bytes `--output FILE.npy` writes, through a pipe too; a terminal is refused in one line."""
    (tmp_path / "in.txt").write_text("\n".join(LINES[:5]) + "\n")
    assert cli("encode", "--model", trained, tmp_path / "in.txt", "-f", "npy", "-o", tmp_path / "v.npy").code == 0
    command = [
        sys.executable,
        "-m",
        "bertcli",
        "encode",
        "--model",
        str(trained),
        str(tmp_path / "in.txt"),
        "-f",
        "npy",
    ]
    with open(tmp_path / "out.npy", "wb") as fh:
        done = subprocess.run(command, stdout=fh, stderr=subprocess.PIPE, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.npy").read_bytes() == (tmp_path / "v.npy").read_bytes()
    piped = subprocess.run(command, capture_output=True, cwd=REPO, timeout=120)
    assert piped.returncode == 0 and piped.stdout == (tmp_path / "v.npy").read_bytes()
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    refused = cli("encode", "--model", trained, tmp_path / "in.txt", "-f", "npy")
    assert refused.code == 2 and refused.out == "" and len(refused.err_lines) == 1, refused.err
    assert all(fact in refused.err_lines[0] for fact in ("bertcli: error:", "--format npy", "terminal", "--output"))


def test_an_output_that_is_a_device_or_a_pipe_is_written_in_place(trained, tmp_path, cli):
    """`-o` a character device, a named pipe or /dev/stdout is written as the shell's `>` writes it: the
    node stays what it was (a rename put a regular file of vectors where /dev/null or a FIFO was, and
    the pipe's reader got nothing); a regular file replaced keeps its mode (0600 stays private)."""
    import io
    import os
    import stat
    import threading

    (tmp_path / "in.txt").write_text("\n".join(LINES[:3]) + "\n")
    fifo = tmp_path / "fifo"
    for fmt, parse in (
        ("jsonl", lambda b: len(b.decode().splitlines())),
        ("npy", lambda b: len(np.load(io.BytesIO(b)))),
    ):
        os.mkfifo(fifo)
        got: list[bytes] = []
        reader = threading.Thread(target=lambda got=got: got.append(fifo.read_bytes()), daemon=True)
        reader.start()
        result = cli("encode", "--model", trained, tmp_path / "in.txt", "-f", fmt, "-o", fifo)
        reader.join(timeout=60)
        assert result.code == 0, result.err
        assert stat.S_ISFIFO(fifo.stat().st_mode) and got and parse(got[0]) == 3, (fmt, got)
        fifo.unlink()
    os.mkfifo(fifo)  # read and written: its rows would come back as input, for ever
    refused = cli("encode", "--model", trained, fifo, "-o", fifo)
    assert refused.code == 2 and len(refused.err_lines) == 1 and refused.out == "", refused.err
    assert all(fact in refused.err for fact in ("--output", str(fifo), "pipe", "reads")), refused.err
    fifo.unlink()
    try:  # a character device of our own (that of /dev/null): never the system's, should this fail
        os.mknod(tmp_path / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except OSError:
        pass  # not root: the FIFO and /dev/stdout below are the same path through the code
    else:
        assert cli("encode", "--model", trained, tmp_path / "in.txt", "-o", tmp_path / "null").code == 0
        assert stat.S_ISCHR((tmp_path / "null").stat().st_mode)
    proc = run_process("encode", "--model", trained, tmp_path / "in.txt", "-o", "/dev/stdout")
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 3, proc.stderr[-500:]
    private = tmp_path / "private.jsonl"
    private.write_text("")
    private.chmod(0o600)
    assert cli("encode", "--model", trained, tmp_path / "in.txt", "-o", private).code == 0
    assert stat.S_IMODE(private.stat().st_mode) == 0o600 and len(private.read_text().splitlines()) == 3


def test_leftovers_of_a_killed_encode_are_removed_at_the_next_start(trained, tmp_path, cli):
    """A SIGKILL leaves `.tmp-OUT.PID` beside the output (npy rows wait in an unnamed file: nothing
    more); the next `encode -o OUT` removes those of processes that are gone, holding rows; nothing
    else (a live writer's, a link, another name, a file of the name that holds other text, such as a
    user's own `.tmp-OUT.PID` notes)."""
    import os

    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / "in.txt").write_text("a line\n")
    rows = {"v.jsonl": b'{"line": 1, "vector": [0.25, -1', "v.npy": b"\x93NUMPY\x01\x00v\x00", "v.tsv": b"0.5\t-2e-3\n"}
    all_kept: list = []
    for name, written in rows.items():
        gone = [layout.tmp_name(tmp_path / name, pid=dead.pid)]
        gone[0].write_bytes(written)
        kept = [
            layout.tmp_name(tmp_path / name, pid=os.getppid()),  # a live writer's
            layout.tmp_name(tmp_path / name, pid=dead.pid + 1_000_000),  # a link
            tmp_path / f".tmp-{name}.{dead.pid}.bak",  # not bertcli's name
            layout.tmp_name(tmp_path / name, pid=dead.pid + 2_000_000),  # bertcli's name, the user's notes
        ]
        all_kept += kept
        kept[0].write_bytes(b"")
        kept[1].symlink_to(tmp_path / "in.txt")
        kept[2].write_bytes(written)
        kept[3].write_text("my own notes\n")
        result = cli("encode", "--model", trained, tmp_path / "in.txt", "-o", tmp_path / name)
        assert result.code == 0 and not any(p.exists() for p in gone), result.err
        assert all(p.is_symlink() or p.exists() for p in kept) and kept[3].read_text() == "my own notes\n"
        # nothing else left behind: the temporary names there are those kept
        assert {p.name for p in tmp_path.glob(".tmp-*")} == {p.name for p in all_kept}


def test_a_hugging_face_folder_gives_the_same_vectors(trained, tmp_path):
    folder = export(trained, tmp_path / "hf")
    a, _ = run_encode(trained, LINES, pooling="mean")
    b, _ = run_encode(folder, LINES, pooling="mean")
    for x, y in zip(a, b):
        np.testing.assert_allclose(x["vector"], y["vector"], rtol=1e-5, atol=1e-5)


def test_pooler_pooling_is_refused_when_the_folder_has_no_pooler(trained, tmp_path, cli):
    """A folder without pooler weights (a BertForMaskedLM, say) gets a random pooler: vectors of nothing
    learnt, so --pooling pooler is refused; other poolings read the folder's encoder as before."""
    import safetensors.torch

    folder = export(trained, tmp_path / "hf")
    weights = safetensors.torch.load_file(folder / "model.safetensors")
    assert any("pooler" in k for k in weights)
    safetensors.torch.save_file({k: v for k, v in weights.items() if "pooler" not in k}, folder / "model.safetensors")
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in LINES))
    refused = cli("encode", "--model", folder, tmp_path / "in.txt", "--pooling", "pooler")
    assert refused.code == 2 and len(refused.err_lines) == 1 and "has no pooler weights" in refused.err, refused.err
    assert str(folder) in refused.err and refused.out == ""
    assert cli("encode", "--model", folder, tmp_path / "in.txt", "--pooling", "mean").code == 0
    assert (
        cli("encode", "--model", export(trained, tmp_path / "whole"), tmp_path / "in.txt", "--pooling", "pooler").code
        == 0
    )


def test_errors_truncation_and_missing_model(trained, tmp_path, cli):
    (tmp_path / "bad.txt").write_bytes(b"fine\nbad \xff line\n")
    bad = cli("encode", "--model", trained, tmp_path / "bad.txt")
    assert bad.code == 2 and "line 2 is not valid UTF-8" in bad.err and len(bad.err_lines) == 1
    replaced = cli("encode", "--model", trained, tmp_path / "bad.txt", "--errors", "replace")
    assert replaced.code == 0 and len(replaced.out.splitlines()) == 2
    (tmp_path / "long.txt").write_text("word " * 100 + "\nshort\n")
    long = cli("encode", "--model", trained, tmp_path / "long.txt", "--max-length", "16")
    assert long.code == 0 and "1 of 2 lines were truncated" in long.err
    limit = load_encoder(trained, torch.device("cpu")).max_length
    past = cli("encode", "--model", trained, tmp_path / "long.txt", "--max-length", str(limit + 100))
    at_limit = cli("encode", "--model", trained, tmp_path / "long.txt", "--max-length", str(limit))
    assert past.code == 0 and past.out == at_limit.out, "texts stop at the model's positions"
    assert f"1 of 2 lines were truncated to {limit} tokens" in past.err
    missing = cli("encode", "--model", tmp_path / "nothing", tmp_path / "long.txt")
    assert missing.code == 2 and "no such folder" in missing.err


def test_a_run_encodes_up_to_the_length_it_was_trained_at_as_its_export_does(trained, tmp_path, cli):
    """A run trained at data.max_seq_length never trained the positions past it (their random
    initialisation), so long lines stop there. Its export says the length (model_max_length, what
    transformers truncates at), and encode of either stops there; --max-length chooses otherwise."""
    from bertcli.resolve import load_run

    trained_at = load_run(trained / "config.yaml").data.max_seq_length
    assert trained_at < load_encoder(trained, torch.device("cpu")).max_length
    (tmp_path / "long.txt").write_text("word " * 300 + "\nshort\n")
    folder = export(trained, tmp_path / "hf")
    assert json.loads((folder / "tokenizer_config.json").read_text())["model_max_length"] == trained_at
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    assert len(tokenizer("word " * 300, truncation=True)["input_ids"]) == trained_at
    rows = {}
    for model in (trained, folder):
        result = cli("encode", "--model", model, tmp_path / "long.txt", "-f", "tsv")
        truncated = [line for line in result.err_lines if "truncated" in line]
        assert result.code == 0 and len(truncated) == 1, result.err
        # (the export's limit is its sentence_bert_config.json's max_seq_length: said with no reason)
        facts = ("1 of 2 lines", f"{trained_at} tokens", *(["trained"] if model == trained else []))
        assert all(fact in truncated[0] for fact in facts), result.err
        rows[model] = np.loadtxt(result.out.splitlines(), delimiter="\t")
    np.testing.assert_allclose(rows[trained], rows[folder], atol=1e-5)
    exact = cli("encode", "--model", trained, tmp_path / "long.txt", "-f", "tsv", "--max-length", str(trained_at))
    np.testing.assert_allclose(np.loadtxt(exact.out.splitlines(), delimiter="\t"), rows[trained], atol=1e-6)
    longer = cli("encode", "--model", trained, tmp_path / "long.txt", "-f", "tsv", "--max-length", "200")
    assert not np.allclose(np.loadtxt(longer.out.splitlines(), delimiter="\t")[0], rows[trained][0], atol=1e-3)
    # (said with a --max-length past that length, as the truncation without one says it)
    positions = load_encoder(trained, torch.device("cpu")).max_length
    warned = [line for line in longer.err_lines if line.startswith("warning:")]
    assert len(warned) == 1, longer.err
    assert all(fact in warned[0] for fact in (f"{positions} tokens", "--max-length", f"trained at, {trained_at}"))
    assert not [line for line in exact.err_lines if line.startswith("warning:")], exact.err

    # A run continued from it (its export, or its checkpoint) at that length or less has trained no other
    # position (not all of them); a longer one, or a source gone, counts.
    import dataclasses

    from bertcli import checkpoint

    cfg = load_run(trained / "config.yaml")
    for source in (folder, trained / "checkpoints" / "step-0000004"):
        continued = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, init_from=str(source)))
        assert checkpoint.trained_length(continued) == trained_at
        longer_run = dataclasses.replace(continued, data=dataclasses.replace(cfg.data, max_seq_length=trained_at + 8))
        assert checkpoint.trained_length(longer_run) == trained_at + 8
    gone = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, init_from=str(tmp_path / "gone")))
    assert checkpoint.trained_length(gone) is None


def test_an_output_folder_that_takes_no_file_is_said_first_naming_the_output(trained, tmp_path, cli, monkeypatch):
    """A read-only --output folder is found before torch and the model load (seconds, hundreds of MB),
    and the error names --output, not encode's hidden temporary file; a read-only output_dir of pretrain
    before torch too. Both are said first, naming what was asked for, and nothing is made there."""
    import errno
    import tempfile

    real = tempfile.mkstemp
    readonly = tmp_path / "ro"
    readonly.mkdir()

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and str(dir) == str(readonly):
            raise OSError(errno.EROFS, "Read-only file system", f"{dir}/probe")
        return real(*args, dir=dir, **kwargs)

    from bertcli import encode as encode_module

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(encode_module, "load_encoder", lambda *a, **k: pytest.fail("the model was loaded first"))
    (tmp_path / "in.txt").write_text("hello world\n")
    result = cli("encode", "--model", trained, tmp_path / "in.txt", "-o", readonly / "v.npy")
    assert result.code == 1 and len(result.err_lines) == 1 and result.out == "", result.err
    said = result.err_lines[0]
    assert said.startswith(f"bertcli: error: {readonly / 'v.npy'}:") and "Read-only" in said and "--output" in said
    assert list(readonly.iterdir()) == []
    from bertcli import trainer

    monkeypatch.setattr(trainer, "pretrain", lambda *a, **k: pytest.fail("training started first"))
    run = readonly / "run"  # not there yet: its nearest folder is probed
    trained_again = cli("pretrain", "--config", trained / "config.yaml", "--set", f"output_dir={run}", "--quiet")
    assert trained_again.code == 1 and len(trained_again.err_lines) == 1, trained_again.err
    said = trained_again.err_lines[0]
    assert said.startswith(f"bertcli: error: {run}:") and "Read-only" in said and "output_dir" in said
    assert list(readonly.iterdir()) == []


def test_dtype_bf16_on_a_cpu_without_its_instructions_encodes(trained, tmp_path, cli, monkeypatch):
    """encode --dtype bf16 there is emulated (about twice as slow as fp32): its row, as asked."""
    from bertcli import runtime

    for probe in runtime.NATIVE_ON_CPU["bf16"]:
        monkeypatch.setattr(torch.cpu, probe, lambda: False)
    (tmp_path / "in.txt").write_text("hello world\n")
    done = cli("encode", "--model", trained, tmp_path / "in.txt", "--dtype", "bf16")
    assert done.code == 0 and len(done.out.splitlines()) == 1, done.err


@pytest.mark.parametrize("per_token", [False, True], ids=["pooled", "per-token"])
def test_a_model_whose_output_overflows_is_refused_with_no_vector_written(trained, tmp_path, cli, per_token):
    # Finite weights (they load) so large that attention overflows: optimizer.lr=1e8 makes such models.
    import shutil

    import safetensors.torch

    ckpt = shutil.copytree(layout.list_checkpoints(trained)[-1][1], tmp_path / "step-0000004")
    weights = safetensors.torch.load_file(ckpt / "model.safetensors")
    for name in weights:
        if name.endswith(("query.weight", "key.weight")):
            weights[name] = weights[name] * 1e30
    safetensors.torch.save_file(weights, ckpt / "model.safetensors")
    without_file_hashes(ckpt)  # weights that were so when saved (the record would tell an edit)
    (tmp_path / "in.txt").write_text("fine text\nmore text here\n")
    out = tmp_path / "vectors.jsonl"
    result = cli("encode", "--model", ckpt, tmp_path / "in.txt", "-o", out, *(["--tokens"] if per_token else []))
    assert result.code == 1 and "Traceback" not in result.err, result.err
    assert result.err_lines == [
        f"bertcli: error: {ckpt}: its output is NaN or inf for {tmp_path / 'in.txt'}: line 1; use another checkpoint "
        "or model"
    ]
    assert not out.exists() and result.out == ""


def test_closed_pipe_and_streaming(trained):
    command = f"set -o pipefail; seq 1 5000 | {sys.executable} -m bertcli encode --model {trained} | head -3"
    proc = subprocess.run(command, shell=True, cwd=REPO, capture_output=True, text=True, executable="/bin/bash")
    assert len(proc.stdout.splitlines()) == 3 and proc.stderr == "" and proc.returncode == 0  # pipefail: bertcli's code
    # Rows come out while the input is still open, a window far from full: a slow producer (tail -f)
    # sees the rows of the lines it has written once its input stalls.
    import os
    import select
    import time

    p = subprocess.Popen(
        [sys.executable, "-m", "bertcli", "encode", "--model", str(trained)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    p.stdin.write(b"line 1\nline 2\nline 3\n")
    p.stdin.flush()
    rows, deadline = b"", time.monotonic() + 30  # start-up (imports, model) included
    while rows.count(b"\n") < 3 and select.select([p.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
        chunk = os.read(p.stdout.fileno(), 1 << 16)
        if not chunk:
            break
        rows += chunk
    assert [json.loads(row)["line"] for row in rows.splitlines()] == [1, 2, 3], p.poll()
    p.stdin.write(b"".join(f"line {i}\n".encode() for i in range(4, 65)))
    p.stdin.close()
    rest = p.stdout.read().splitlines()
    assert p.wait(timeout=60) == 0 and [json.loads(row)["line"] for row in rest] == list(range(4, 65))


@pytest.mark.slow
def test_a_terminated_encode_leaves_no_half_written_output(trained, tmp_path):
    """SIGTERM (a scheduler, `kill`) mid-run: the temporary output is removed, as for Ctrl-C, and the
    exit code says which signal (128 + 15)."""
    import signal
    import time

    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bertcli",
            "encode",
            "--model",
            str(trained),
            "--batch-size",
            "2",
            "-o",
            str(tmp_path / "v.npy"),
        ],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    p.stdin.write("".join(f"line {i}\n" for i in range(100)))  # a window and a half; stdin stays open
    p.stdin.flush()
    deadline = time.monotonic() + 60
    while not any(tmp_path.iterdir()) and time.monotonic() < deadline:  # the temporary output exists: writing began
        time.sleep(0.05)
    time.sleep(0.3)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143, err
    last = err.strip().splitlines()[-1]  # the stop's line names the signal and the output not written
    assert "SIGTERM" in last and f"{tmp_path / 'v.npy'} was not written" in last, err
    assert list(tmp_path.iterdir()) == []
    # Started to ignore SIGHUP (nohup): a hang-up does not stop it.
    p = subprocess.Popen(
        [sys.executable, "-m", "bertcli", "encode", "--model", str(trained), "-o", str(tmp_path / "v.npy")],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
    )
    p.stdin.write("one line\n")
    p.stdin.flush()
    while not any(tmp_path.iterdir()) and time.monotonic() < deadline + 60:
        time.sleep(0.05)
    p.send_signal(signal.SIGHUP)
    _, err = p.communicate("another line\n", timeout=60)
    assert p.returncode == 0 and np.load(tmp_path / "v.npy").shape[0] == 2, err


def test_a_signal_while_the_output_is_put_in_place_waits_until_it_is_there(trained, tmp_path, cli, monkeypatch):
    """From the rename on, SIGTERM is held: the output is complete, nothing temporary is left, and the
    signal then reaches the handler that was there before encode (restored on the way out)."""
    import os
    import signal

    got: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        real_close = Writer.close
        monkeypatch.setattr(
            Writer, "close", lambda self, h: (os.kill(os.getpid(), signal.SIGTERM), real_close(self, h))
        )
        (tmp_path / "in.txt").write_text("".join(line + "\n" for line in LINES))
        result = cli("encode", "--model", trained, tmp_path / "in.txt", "-o", tmp_path / "v.npy")
        assert result.code == 0, result.err
        assert np.load(tmp_path / "v.npy").shape[0] == len(LINES) and sorted(p.name for p in tmp_path.iterdir()) == [
            "in.txt",
            "v.npy",
        ]
        assert got == [signal.SIGTERM] and signal.getsignal(signal.SIGTERM) is not None
        assert signal.getsignal(signal.SIGTERM).__name__ == "<lambda>"  # the handler from before, restored
    finally:
        signal.signal(signal.SIGTERM, before)


def test_output_file_text_column_pairs_and_layer_errors(trained, tmp_path, cli):
    lines = LINES + ["a\tTAB and a back\\slash"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    for fmt in ("jsonl", "tsv"):
        shown = cli("encode", "--model", trained, tmp_path / "in.txt", "-f", fmt, "--with-text")
        written = cli(
            "encode", "--model", trained, tmp_path / "in.txt", "-f", fmt, "--with-text", "-o", tmp_path / f"v.{fmt}"
        )
        assert written.code == 0 and written.out == "" and (tmp_path / f"v.{fmt}").read_text() == shown.out
    cells = [row.split("\t") for row in (tmp_path / "v.tsv").read_text().splitlines()]
    assert [c[0] for c in cells] == lines[:-1] + ["a\\tTAB and a back\\\\slash"] and {len(c) for c in cells} == {33}
    assert cli("encode", "--model", trained, tmp_path / "in.txt", "-o", tmp_path / "by-suffix.npy").code == 0
    assert np.load(tmp_path / "by-suffix.npy").shape == (len(lines), 32)
    (tmp_path / "bom.txt").write_bytes(
        "\ufeff".encode() + (tmp_path / "in.txt").read_bytes()
    )  # a Windows editor's file
    assert cli("encode", "--model", trained, tmp_path / "bom.txt", "-f", "tsv", "--with-text").out == shown.out
    (tmp_path / "bom.txt").unlink()
    no_text = cli("encode", "--model", trained, tmp_path / "in.txt", "-o", tmp_path / "t.npy", "--with-text")
    assert no_text.code == 2 and "npy holds numbers only" in no_text.err
    # A failed run leaves no output file and no temporary file.
    (tmp_path / "bad.txt").write_bytes(b"fine\n" * 100 + b"bad \xff\n")
    assert cli("encode", "--model", trained, tmp_path / "bad.txt", "-o", tmp_path / "bad.jsonl").code == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "by-suffix.npy", "in.txt", "v.jsonl", "v.tsv"]

    (tmp_path / "pairs.txt").write_text("the tutorial\tmodules\nthe tutorial modules\n")
    pairs = cli("encode", "--model", trained, tmp_path / "pairs.txt", "--pairs")
    assert pairs.code == 0 and "1 of 2 lines had no TAB" in pairs.err
    alone, _ = run_encode(trained, ["the tutorial modules"])
    assert json.loads(pairs.out.splitlines()[1])["vector"] == alone[0]["vector"], "a line without a TAB is one sentence"
    (tmp_path / "first.txt").write_text("a\tb\n")
    strict = cli(
        "encode", "--model", trained, tmp_path / "first.txt", tmp_path / "pairs.txt", "--pairs", "--strict-pairs"
    )
    assert strict.code == 2 and f"{tmp_path / 'pairs.txt'}: line 2: no TAB" in strict.err and len(strict.err_lines) == 1

    layer = cli("encode", "--model", trained, tmp_path / "pairs.txt", "--layer", "-4")
    assert layer.code == 2 and "--layer -4:" in layer.err and "layers 0 (embeddings) to 2" in layer.err


def test_a_checkpoint_pruned_while_it_is_read_gives_way_to_the_newest(trained, tmp_path, monkeypatch):
    """encode --model RUN while the run trains: the newest step, pruned under it, was an error
    ("step-0000036/config.yaml: No such file or directory", exit 1); the run's newest is taken again."""
    import shutil

    from bertcli import encode as enc

    run = shutil.copytree(trained, tmp_path / "run", ignore=shutil.ignore_patterns("tensorboard"))
    shutil.copytree(run / "checkpoints" / "step-0000004", run / "checkpoints" / "step-0000003")
    real, read = enc._load_checkpoint, []

    def pruned_first(ckpt):
        read.append(ckpt.name)
        if len(read) == 1:
            shutil.rmtree(ckpt)  # the run's next save prunes it while it is read
        return real(ckpt)

    monkeypatch.setattr(enc, "_load_checkpoint", pruned_first)
    encoder = load_encoder(run, torch.device("cpu"))
    assert read == ["step-0000004", "step-0000003"] and encoder.source == run / "checkpoints" / "step-0000003"
    monkeypatch.setattr(enc, "_load_checkpoint", lambda ckpt: shutil.rmtree(ckpt) or real(ckpt))
    with pytest.raises(FileNotFoundError):  # a checkpoint named by the user is not swapped for another
        load_encoder(run / "checkpoints" / "step-0000003", torch.device("cpu"))


def test_a_step_pruned_while_the_checkpoint_is_chosen_gives_way_too(trained, tmp_path, monkeypatch):
    """Choosing reads the newest step's config (is `best` of its model?): pruned right then, that read
    fails ("step-0000447/config.yaml: No such file or directory"), and the choice gives way to another."""
    import shutil

    from bertcli import export

    run = shutil.copytree(trained, tmp_path / "run", ignore=shutil.ignore_patterns("tensorboard"))
    checkpoints = run / "checkpoints"
    shutil.copytree(checkpoints / "step-0000004", checkpoints / "step-0000003")
    shutil.copytree(checkpoints / "step-0000004", checkpoints / "best")
    real, read = export.checkpoint.read_config, []

    def pruned_first(ckpt):
        read.append(ckpt.name)
        if ckpt.name == "step-0000004" and (ckpt / "config.yaml").exists():
            shutil.rmtree(ckpt)  # the run's next save prunes it while best is weighed against it
        return real(ckpt)

    monkeypatch.setattr(export.checkpoint, "read_config", pruned_first)
    encoder = load_encoder(run, torch.device("cpu"))
    assert "step-0000004" in read and encoder.source == checkpoints / "best"


def test_a_window_is_bounded_in_characters_whatever_the_batch_size(trained, monkeypatch):
    """--batch-size 100000000 made one window of 3.2 billion lines: the whole input read before a row
    was written (a 10 MB input: 2.9 GB, growing with the input). A window also ends at WINDOW_CHARS."""
    from bertcli import encode as enc_mod

    monkeypatch.setattr(enc_mod, "WINDOW_CHARS", 100)
    enc = load_encoder(trained, torch.device("cpu"))
    windows = []
    real = enc.tokenizer.encode_batch

    class Counting:  # the tokenizer, with its calls counted: one per window
        def __getattr__(self, name):
            return getattr(real.__self__, name)

        def encode_batch(self, texts, **kwargs):
            windows.append(len(texts))
            return real(texts, **kwargs)

    enc.tokenizer = Counting()
    lines = [f"line number {i} of the input" for i in range(30)]  # 26 or 27 characters each
    counts = encode(enc, iter(lines), Writer("jsonl", io.StringIO(), None, False), resolve(enc, batch_size=10**8))
    assert counts["lines"] == 30 and windows == [4] * 7 + [2], windows


def test_compressed_stdin_is_refused_before_the_model_loads_and_never_read_as_text(trained, tmp_path):
    """gzip on stdin is no UTF-8 text to refuse after the model loaded (2-4 s, 300 MB), nor text to
    encode with --errors replace. Its first bytes are peeked before the model loads; a producer too slow for the peek is refused at its first line, --errors replace or not."""
    import gzip

    from conftest import refuse_in_fresh_interpreter

    packed = tmp_path / "in.txt.gz"
    packed.write_bytes(gzip.compress(b"a line\nanother\n"))
    with open(packed, "rb") as stdin:
        (code, imported), err = refuse_in_fresh_interpreter("encode", "--model", trained, cwd=tmp_path, stdin=stdin)
    assert (code, imported) == ("2", "False"), err
    assert len(err.splitlines()) == 1 and err.startswith("bertcli: error: stdin:") and "gzip" in err, err
    slow = subprocess.Popen(  # its bytes come after the peek gave up waiting
        [
            sys.executable,
            "-c",
            f"import sys, time; time.sleep(1.5); sys.stdout.buffer.write(open({str(packed)!r}, 'rb').read())",
        ],
        stdout=subprocess.PIPE,
    )
    result = run_process("encode", "--model", trained, "--errors", "replace", "-", stdin=slow.stdout)
    slow.wait()
    assert result.returncode == 2 and result.stdout == "", result.stderr
    said = result.stderr.splitlines()[-1]
    assert said.startswith("bertcli: error: stdin") and "gzip" in said, result.stderr
    wide = subprocess.run(  # with --errors replace, UTF-16 would be encoded as garbage rows, one more than lines
        [sys.executable, "-m", "bertcli", "encode", "--model", str(trained), "--errors", "replace"],
        input="a line\nanother\n".encode("utf-16-le"),
        capture_output=True,
        cwd=REPO,
        timeout=120,
    )
    assert wide.returncode == 2 and wide.stdout == b"" and wide.stderr.startswith(b"bertcli: error: stdin"), wide.stderr
    assert b"UTF-16" in wide.stderr and len(wide.stderr.splitlines()) == 1, wide.stderr
    plain = run_process("encode", "--model", trained, "-f", "tsv", input="a line\nanother\n")
    assert plain.returncode == 0 and len(plain.stdout.splitlines()) == 2, plain.stderr


def test_an_output_that_is_the_file_on_stdin_is_refused(trained, tmp_path):
    """`encode --output F < F` would replace the user's text with vectors (F as an argument is refused
    too); a hard link to it as well."""
    import os

    text = tmp_path / "in.txt"
    text.write_text("a line\nanother\n")
    os.link(text, tmp_path / "linked.txt")
    for output, args in ((text, []), (text, ["-"]), (tmp_path / "linked.txt", [])):
        with open(text, "rb") as stdin:
            result = run_process("encode", "--model", trained, "--output", output, *args, stdin=stdin)
        said = result.stderr.splitlines()
        assert result.returncode == 2 and result.stdout == "" and len(said) == 1, result.stderr
        assert said[0].startswith("bertcli: error:") and all(f in said[0] for f in ("--output", str(output), "input"))
    assert text.read_text() == "a line\nanother\n"
    with open(text, "rb") as stdin:  # another output: written
        result = run_process("encode", "--model", trained, "--output", tmp_path / "v.npy", stdin=stdin)
    assert result.returncode == 0 and np.load(tmp_path / "v.npy").shape[0] == 2, result.stderr


def test_the_format_asked_is_written_whatever_the_output_name(trained, tmp_path, cli):
    """--format jsonl --output v.npy writes JSON Lines under an npy name; --format tsv into v.csv, TSV."""
    (tmp_path / "in.txt").write_text("a line\n")
    result = cli("encode", "--model", trained, tmp_path / "in.txt", "--format", "jsonl", "-o", tmp_path / "v.npy")
    assert result.code == 0 and json.loads((tmp_path / "v.npy").read_text())["line"] == 1, result.err
    chosen = cli("encode", "--model", trained, tmp_path / "in.txt", "--format", "tsv", "-o", tmp_path / "v.csv")
    assert chosen.code == 0 and len((tmp_path / "v.csv").read_text().split("\t")) > 2, chosen.err


def test_lines_with_a_carriage_return_inside_are_encoded_as_one_text_and_said(trained, tmp_path, cli):
    """A file of classic Mac OS line ends (CR alone) gives one row for its three texts, and says so
    (prepare warns of such a file too); CRLF line ends are line ends."""
    (tmp_path / "cr.txt").write_bytes(b"one\rtwo\rthree\r\nfour\n")
    result = cli("encode", "--model", trained, tmp_path / "cr.txt", "-f", "tsv")
    assert result.code == 0 and len(result.out.splitlines()) == 2, result.err
    warned = [line for line in result.err_lines if line.startswith("warning:")]
    assert len(warned) == 1 and all(fact in warned[0] for fact in ("1 of 2 lines", "(CR)")), result.err
    (tmp_path / "crlf.txt").write_bytes(b"one\r\ntwo\r\n")
    plain = cli("encode", "--model", trained, tmp_path / "crlf.txt", "-f", "tsv")
    assert plain.code == 0 and len(plain.out.splitlines()) == 2 and "carriage return" not in plain.err
