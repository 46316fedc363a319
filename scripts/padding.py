"""How much of a padded training batch is real tokens: the most that unpadding or packing could save.

    python scripts/padding.py --config runs/docs/config.yaml [--steps 20] [--shape 128x256 --shape 512x32]

Builds the batches of the first --steps steps exactly as `pretrain` would (Google-style pairs,
padded to the longest row, rounded up to 8) for each SEQxBATCH shape (max_predictions_per_seq
scaled with the sequence length), and reports the non-padding share of the padded batch and the
mean padded width. Length bucketing can only help when batches are narrower than their longest
possible row; unpadding (variable-length attention) or packing removes all the padding.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from bertcli.data import load_data
from bertcli.data.examples import ExampleBuilder
from bertcli.resolve import load_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--shape", action="append", help="SEQxBATCH (default: 128x256 and 512x32)")
    args = parser.parse_args()
    cfg = load_run(Path(args.config))
    data = load_data(cfg, quiet=True)
    for shape in args.shape or ["128x256", "512x32"]:
        T, B = map(int, shape.split("x"))
        P = max(1, round(cfg.data.max_predictions_per_seq * T / cfg.data.max_seq_length))
        builder = ExampleBuilder(
            data.train, dataclasses.replace(cfg.data, max_seq_length=T, max_predictions_per_seq=P), B
        )
        real = padded = 0
        for step in range(args.steps):
            batch = builder.batch(cfg.train.seed, step, range(B))
            real, padded = real + int(batch.valid_lens.sum()), padded + batch.input_ids.numel()
        print(
            f"seq {T}, batch {B} ({args.steps} steps of {cfg.data.corpus}): {real / padded:.1%} of the padded "
            f"tokens are real; mean padded width {padded / (args.steps * B):.1f} of {T}"
        )


if __name__ == "__main__":
    main()
