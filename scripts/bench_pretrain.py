"""Training-step speed of bertcli against transformers' BertForPreTraining, side by side in one process.

    python scripts/bench_pretrain.py                                   # tiny preset on CPU
    python scripts/bench_pretrain.py --preset base --seq 128 --batch 256 --device cuda
    python scripts/bench_pretrain.py --preset large --seq 512 --batch 32 --device cuda
    add --compile to run both models' encoder layers under torch.compile (what train.compile does)
    add --profile to print, for each model, the operators that take the time over one window
    add --lengths real to give rows the lengths of real pretraining pairs instead of full rows
    add --unpad to time bertcli's unpadded encoder too (train.unpad), beside the padded one
    add --ablate to time bertcli with each lever of issue 21 undone too (bf16 norms, one QKV product)

Both get the same sizes, batch, sequence length, masking rate (15% of positions, at most
max_predictions) and the same synthetic batches (random tokens, full rows), torch's fused AdamW
(what `pretrain` takes on CPUs and GPUs, and what transformers' Trainer takes by default with
torch >= 2.8), bf16 autocast on CUDA and fp32 on CPU, and transformers uses
attn_implementation="sdpa". bertcli runs its MLM head only at the masked positions; transformers
computes logits everywhere and ignores the unmasked ones (-100 labels). Warm-up steps are excluded;
the timed windows alternate between the models (window 1 of each, then window 2 of each, ...), so
a change in the machine's load falls on all of them alike; the figure is the median of --windows
windows of --steps steps each. Reports tokens/s (non-padding tokens), model TFLOP/s, MFU (on GPUs
with a known peak), peak memory, and the ratio.

--lengths real takes each row's length from the examples `pretrain` builds at this sequence length
on the bundled sample (Google-style pairs: most rows full, some short); padding then costs the
padded models work that the unpadded one skips. --unpad sets attention dropout to 0 for every model
(the unpadded kernel has none), so all rows of that run compare alike.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import time
from functools import partial

import torch
import torch.nn.functional as F
import transformers

from bertcli.config_load import preset_config
from bertcli.data.examples import IGNORE
from bertcli.metrics import peak_tflops
from bertcli.model import BertForPreTraining, BertSelfAttention, LayerNorm, packing
from bertcli.optim import fused_adamw, param_groups
from bertcli.sizes import flops_per_token


def real_lengths(rows: int, T: int) -> torch.Tensor:
    """(rows,) lengths of the pairs `pretrain` builds at sequence length T from the bundled sample."""
    import tempfile

    from bertcli.data import load_data
    from bertcli.data.examples import ExampleBuilder

    with tempfile.TemporaryDirectory() as tmp:
        cfg = preset_config(
            "tiny",
            [
                f"data.max_seq_length={T}",
                f"model.max_position_embeddings={max(T, 512)}",
                f"data.prepared_dir={tmp}",
                f"data.max_predictions_per_seq={max(1, T // 6)}",
            ],
        )
        data = load_data(cfg, quiet=True)
        return ExampleBuilder(data.train, cfg.data, rows).batch(cfg.train.seed, 0, range(rows)).valid_lens


def make_batches(
    n: int, B: int, T: int, V: int, P: int, device: torch.device, lengths: torch.Tensor | None = None, seed: int = 0
):
    """n batches of B rows of width T: random tokens, row b real up to its length (T, or lengths[i*B + b])."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for i in range(n):
        valid = torch.full((B,), T) if lengths is None else lengths[i * B : (i + 1) * B].clone()
        width = -(-int(valid.max()) // 8) * 8  # padded to the longest row, rounded up to 8, as collate does
        tokens = torch.randint(5, V, (B, width), generator=g)
        tokens[:, 0] = 2
        keep = torch.arange(width)[None, :] < valid[:, None]
        tokens[~keep] = 0
        # P distinct positions per row among 1..len-1 (a row too short repeats position 1: a duplicate prediction)
        positions = torch.stack(
            [
                torch.randperm(int(n) - 1, generator=g)[:P].sort().values + 1
                if n - 1 >= P
                else torch.cat([torch.arange(1, int(n)), torch.ones(P - int(n) + 1, dtype=torch.long)])
                for n in valid
            ]
        )  # (B, P)
        labels = tokens.gather(1, positions)
        masked = tokens.scatter(1, positions, 4)
        segments = ((torch.arange(width)[None, :] >= valid[:, None] // 2) & keep).long()
        nsp = torch.randint(0, 2, (B,), generator=g)
        full_labels = torch.full((B, width), IGNORE).scatter(1, positions, labels)  # transformers' form
        batch = dict(
            tokens=masked,
            segments=segments,
            positions=positions,
            labels=labels,
            full_labels=full_labels,
            nsp=nsp,
            valid=valid,
            attention_mask=keep.long(),
        )
        packed = packing(valid, width)  # made on the host, as the trainer makes it
        batches.append(
            {
                **{k: v.to(device) for k, v in batch.items()},
                "packed": packed.to(device),
                "padded": bool((valid < width).any()),
            }
        )  # decided on the host, as the trainer does
    return batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument(
        "--vocab", type=int, default=None, help="vocabulary size (default: the preset's tokenizer size)"
    )
    parser.add_argument("--seq", type=int, default=None, help="sequence length (default: the preset's)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compile", action="store_true", help="torch.compile each encoder layer, in both models")
    parser.add_argument(
        "--compile-mode", default=None, help="torch.compile's mode with --compile (reduce-overhead: CUDA graphs)"
    )
    parser.add_argument(
        "--lengths",
        choices=["full", "real"],
        default="full",
        help="full rows, or the lengths of real pretraining pairs (from the bundled sample)",
    )
    parser.add_argument(
        "--unpad", action="store_true", help="also time bertcli's unpadded encoder (attention dropout 0 for all)"
    )
    parser.add_argument(
        "--ablate",
        action="store_true",
        help="also time bertcli with each lever of issue 21 undone (fp32 norms, three QKV products, both), "
        "and on GPUs with bf16 weights and no autocast (a bound: no fp32 master weights)",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after timing, profile one window and print the N operators with the most self time",
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    cfg = preset_config(args.preset)
    V = args.vocab or cfg.data.tokenizer.vocab_size
    T = args.seq or cfg.data.max_seq_length
    mcfg = dataclasses.replace(
        cfg.model,
        vocab_size=V,
        max_position_embeddings=max(T, cfg.model.max_position_embeddings),
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.0 if args.unpad else 0.1,
    )
    P = min(cfg.data.max_predictions_per_seq * T // cfg.data.max_seq_length, round(0.15 * T)) or 1
    cuda = device.type == "cuda"
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)
    n_batches = 4
    lengths = real_lengths(n_batches * args.batch, T) if args.lengths == "real" else None
    batches = make_batches(n_batches, args.batch, T, V, P, device, lengths)
    real_tokens = sum(int(b["valid"].sum()) for b in batches) / n_batches  # per step

    def bertcli_step(unpad: bool, fp32_norms: bool = False, three_qkv: bool = False, bf16_weights: bool = False):
        torch.manual_seed(0)
        model = BertForPreTraining(mcfg).to(device).train()
        for module in model.modules():  # the levers of issue 21 undone, one at a time (--ablate)
            if fp32_norms and isinstance(module, LayerNorm):
                module.forward = partial(torch.nn.LayerNorm.forward, module)  # autocast's fp32 norm, fp32 stream
            if three_qkv and isinstance(module, BertSelfAttention):
                module.fused_qkv = False
        if bf16_weights:  # a bound, not a mode: bf16 weights and optimizer, no autocast, no fp32 master
            model.to(torch.bfloat16)
        opt = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-4, fused=fused_adamw(device) or None)

        def step(b):
            with autocast if not bf16_weights else contextlib.nullcontext():
                out = model(
                    b["tokens"],
                    b["segments"],
                    b["valid"] if b["padded"] else None,
                    b["positions"],
                    packed=b["packed"] if unpad else None,
                )
            loss = F.cross_entropy(out.mlm_logits.float().flatten(0, 1), b["labels"].flatten()) + F.cross_entropy(
                out.nsp_logits.float(), b["nsp"]
            )
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step, model

    hf_cfg = transformers.BertConfig(
        **{k: v for k, v in dataclasses.asdict(mcfg).items() if k not in ("pad_vocab_multiple", "init_from")},
        attn_implementation="sdpa",
    )
    theirs = transformers.BertForPreTraining(hf_cfg).to(device).train()
    theirs_opt = torch.optim.AdamW(param_groups(theirs, 0.01), lr=1e-4, fused=fused_adamw(device) or None)

    def theirs_step(b):
        with autocast:
            out = theirs(
                input_ids=b["tokens"],
                token_type_ids=b["segments"],
                attention_mask=b["attention_mask"],
                labels=b["full_labels"],
                next_sentence_label=b["nsp"],
            )
        out.loss.backward()
        theirs_opt.step()
        theirs_opt.zero_grad(set_to_none=True)

    contenders = [("bertcli", *bertcli_step(False))]
    if args.ablate:
        contenders.append(("bertcli 3 qkv", *bertcli_step(False, three_qkv=True)))
        contenders.append(("bertcli fp32 norms", *bertcli_step(False, fp32_norms=True)))
        contenders.append(("before issue 21", *bertcli_step(False, fp32_norms=True, three_qkv=True)))
        if cuda:
            contenders.append(("bf16 weights", *bertcli_step(False, bf16_weights=True)))
    if args.unpad:
        contenders.append(("bertcli unpadded", *bertcli_step(True)))
    contenders.append(("transformers", theirs_step, theirs))
    if args.compile:  # the same scope for all: each encoder layer, as train.compile does
        for _, _, model in contenders:
            for layer in model.bert.encoder.layer:
                layer.compile(mode=args.compile_mode)

    mean_len = real_tokens / args.batch
    flops = flops_per_token(mcfg, mean_len, P / mean_len)
    peak = peak_tflops(device, 0.0)
    for _, step, _ in contenders:
        for i in range(args.warmup):
            step(batches[i % len(batches)])
    times: dict[str, list[float]] = {name: [] for name, _, _ in contenders}
    peaks: dict[str, float] = {}
    for w in range(args.windows):  # alternating: window w of every model before window w + 1 of any
        for name, step, _ in contenders:
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            for i in range(args.steps):
                step(batches[(w + i) % len(batches)])
            if cuda:
                torch.cuda.synchronize()
                peaks[name] = max(peaks.get(name, 0.0), torch.cuda.max_memory_allocated() / 2**30)
            times[name].append(time.perf_counter() - start)
    results = {}
    for name, step, _ in contenders:
        tokens_per_s = real_tokens * args.steps / statistics.median(times[name])
        results[name] = {
            "tokens_per_s": tokens_per_s,
            "tflops": tokens_per_s * flops / 1e12,
            "peak_gib": peaks.get(name),
        }
        if args.profile:
            results[name]["profile"] = profile(step, batches, args.steps, cuda, args.profile)
    where = torch.cuda.get_device_name(device) if cuda else f"CPU, {torch.get_num_threads()} threads"
    print(
        f"preset {args.preset} (L={mcfg.num_hidden_layers}, H={mcfg.hidden_size}), vocab {V}, seq {T}, batch {args.batch}, "
        f"{P} predictions per row, {'bf16 autocast' if cuda else 'fp32'}{', compiled' if args.compile else ''}, "
        f"rows {args.lengths} ({real_tokens / (args.batch * T):.1%} of batch x seq real), attention dropout "
        f"{mcfg.attention_probs_dropout_prob}; {where}; torch {torch.__version__}, "
        f"transformers {transformers.__version__}; median of {args.windows} windows x {args.steps} steps"
    )
    for name, r in results.items():
        extra = f", MFU {r['tflops'] / peak:.1%}" if peak else ""
        mem = f", peak {r['peak_gib']:.1f} GiB" if r["peak_gib"] is not None else ""
        print(f"{name:<17} {r['tokens_per_s']:>12,.0f} tokens/s, {r['tflops']:.3f} model TFLOP/s{extra}{mem}")
    for name in results:
        if name != "transformers":
            print(
                f"ratio {name}/transformers: {results[name]['tokens_per_s'] / results['transformers']['tokens_per_s']:.2f}"
            )
    for name, r in results.items():
        if "profile" in r:
            print(f"\n{name}: where one window of {args.steps} steps spends its time\n{r['profile']}")


def profile(step, batches, steps: int, cuda: bool, rows: int) -> str:
    """torch.profiler over one window: the operators with the most self time (on the GPU when there is one)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities) as prof:
        for i in range(steps):
            step(batches[i % len(batches)])
        if cuda:
            torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total", row_limit=rows)


if __name__ == "__main__":
    main()
