"""`bertcli inspect`: what a config, a run folder or a checkpoint folder holds, as a report dict
(printed as tables or as one JSON object). Parameter counts come from the real model built on
the meta device (no memory, no time), so they cannot drift from the architecture.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from bertcli import checkpoint
from bertcli.config import Config, ModelConfig, load_config, resolve_output_dir
from bertcli.errors import UsageError
from bertcli.metrics import read_metrics
from bertcli.model import BertForPreTraining, flops_per_token

PARTS = {"embeddings": "bert.embeddings.", "encoder": "bert.encoder.", "pooler": "bert.pooler.",
         "mlm_head": "cls.predictions.", "nsp_head": "cls.seq_relationship."}


def parameter_counts(cfg: ModelConfig) -> dict[str, int]:
    """Parameters per part and in total; the tied decoder weight is counted once (in embeddings)."""
    with torch.device("meta"):
        model = BertForPreTraining(cfg)
    counts = dict.fromkeys(PARTS, 0)
    for name, param in model.named_parameters():  # yields each tied parameter once, under its first name
        part = next(p for p, prefix in PARTS.items() if name.startswith(prefix))
        counts[part] += param.numel()
    counts["total"] = sum(counts.values())
    return counts


def architecture(cfg: Config) -> dict[str, Any]:
    m = cfg.model
    return {"vocab_size": m.vocab_size, "hidden_size": m.hidden_size, "num_hidden_layers": m.num_hidden_layers,
            "num_attention_heads": m.num_attention_heads, "head_size": m.hidden_size // m.num_attention_heads,
            "intermediate_size": m.intermediate_size, "hidden_act": m.hidden_act,
            "max_position_embeddings": m.max_position_embeddings, "max_seq_length": cfg.data.max_seq_length}


def flops(cfg: Config) -> dict[str, Any]:
    seq = cfg.data.max_seq_length
    share = min(cfg.data.masked_lm_prob, cfg.data.max_predictions_per_seq / seq)
    return {"training_flops_per_token": flops_per_token(cfg.model, seq, share), "seq_len": seq,
            "predicted_share": share,
            "note": "forward+backward matmul FLOPs per non-padding token at full sequence length"}


def _training(output_dir: Path, cfg: Config, only: Path | None = None) -> dict[str, Any]:
    ckpts = checkpoint.list_checkpoints(output_dir)
    records = read_metrics(output_dir / "metrics.jsonl")
    source = only or (ckpts[-1][1] if ckpts else None)
    state = checkpoint.read_trainer_state(source) if source else {}
    last = state.get("metrics") if only else (records[-1] if records else state.get("metrics"))
    return {
        "output_dir": str(output_dir),
        "step": state.get("step", 0) if only else max([state.get("step", 0)] + [r.get("step", 0) for r in records[-1:]]),
        # The resolved config of the newest checkpoint knows about --set overrides; the file does not.
        "max_steps": checkpoint.read_config(source).train.max_steps if source else cfg.train.max_steps,
        "tokens_seen": state.get("tokens_seen", 0),
        "train_time_s": state.get("train_time_s"),
        "last_metrics": last or {},
        "checkpoints": [{"step": s, "path": str(p)} for s, p in ckpts],
        "metrics_file": str(output_dir / "metrics.jsonl") if records else None,
    }


def inspect_path(path: Path) -> dict[str, Any]:
    """The report for a config file, a run folder (holding config.yaml) or a checkpoint folder."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path}: no such file or folder; pass a config file, a run folder or a checkpoint folder")
    training = None
    if path.is_file():
        kind, cfg = "config", load_config(path)
    elif checkpoint.is_checkpoint(path):
        kind, cfg = "checkpoint", checkpoint.read_config(path)
        training = _training(path.parent.parent, cfg, only=path)
    elif (path / "config.yaml").is_file():
        kind, cfg = "run", load_config(path / "config.yaml")
        training = _training(resolve_output_dir(cfg, path / "config.yaml"), cfg)
    elif checkpoint.list_checkpoints(path):
        kind = "run"
        cfg = checkpoint.read_config(checkpoint.list_checkpoints(path)[-1][1])
        training = _training(path, cfg)
    else:
        raise UsageError(f"{path}: not a config file, a run folder (with config.yaml) or a checkpoint folder "
                         f"(with {', '.join(checkpoint.FILES)})")
    report: dict[str, Any] = {"kind": kind, "path": str(path), "architecture": architecture(cfg),
                              "parameters": parameter_counts(cfg.model), "flops": flops(cfg)}
    if training is not None:
        report["training"] = training
    return report


def _table(rows: list[tuple[str, str]]) -> list[str]:
    width = max(len(k) for k, _ in rows)
    return [f"  {k:<{width}}  {v}" for k, v in rows]


def _num(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_report(report: dict[str, Any]) -> str:
    lines = [f"{report['kind']}: {report['path']}", "", "architecture"]
    lines += _table([(k, _num(v)) for k, v in report["architecture"].items()])
    lines += ["", "parameters (tied decoder counted once)"]
    p = report["parameters"]
    lines += _table([(k, f"{v:>13,}  {100 * v / p['total']:5.1f}%") for k, v in p.items()])
    f = report["flops"]
    lines += ["", f"training FLOPs per token  {f['training_flops_per_token'] / 1e6:,.1f} M "
                  f"(seq {f['seq_len']}, {100 * f['predicted_share']:.1f}% predicted)"]
    t = report.get("training")
    if t:
        lines += ["", "training"]
        rows = [("output_dir", t["output_dir"]), ("step", f"{t['step']:,} / {t['max_steps']:,}"),
                ("tokens seen", _num(t["tokens_seen"]))]
        if t.get("train_time_s") is not None:
            rows.append(("train time", f"{t['train_time_s']:.1f} s"))
        rows += [(f"last {k}", _num(v)) for k, v in t["last_metrics"].items() if k != "step"]
        lines += _table(rows)
        lines += ["", f"checkpoints ({len(t['checkpoints'])})"]
        lines += [f"  step {c['step']:>9,}  {c['path']}" for c in t["checkpoints"]] or ["  none yet"]
    return "\n".join(lines)
