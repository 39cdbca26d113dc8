"""Capacity of tiny GPT models on uniform random tokens: see the memorization estimator work where the
truth is known (N x S x log2 V bits). Same as `llmaudit validate capacity`.

    python benchmarks/bench_capacity.py                       # defaults: a few minutes on 2 CPU cores
    python benchmarks/bench_capacity.py --sizes 8x1 16x1 --data-over-capacity 0.5 2 --max-steps 2500

Writes OUT.json and OUT.md (default llmaudit-out/capacity.*) and prints the markdown tables.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from llmaudit.validate.capacity import DEFAULT_DATA_OVER_CAPACITY, DEFAULT_SIZES, capacity_command, capacity_markdown


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("llmaudit-out/capacity.json"))
    parser.add_argument("--sizes", nargs="+", default=list(DEFAULT_SIZES), help="model sizes DxL[xH]")
    parser.add_argument(
        "--data-over-capacity",
        nargs="+",
        type=float,
        default=list(DEFAULT_DATA_OVER_CAPACITY),
        help="data set sizes as multiples of params x 3.6 bits",
    )
    parser.add_argument(
        "--n-sequences",
        nargs="+",
        type=int,
        default=None,
        help="explicit data set sizes (sequences), instead of --data-over-capacity",
    )
    parser.add_argument("--seq-len", type=int, default=16)
    parser.add_argument("--vocab-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the library's)")
    parser.add_argument("--max-steps", type=int, default=None, help="step cap (default: the library's)")
    parser.add_argument("--cooldown-steps", type=int, default=None, help="linear lr cooldown after saturation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--num-threads", type=int, default=1)
    args = parser.parse_args(argv)
    optional = {
        k: v
        for k, v in {"lr": args.lr, "max_steps": args.max_steps, "cooldown_steps": args.cooldown_steps}.items()
        if v is not None
    }
    result = capacity_command(
        args.out,
        sizes=args.sizes,
        data_over_capacity=args.data_over_capacity,
        n_sequences=args.n_sequences,
        seq_len=args.seq_len,
        vocab_size=args.vocab_size,
        seed=args.seed,
        device=args.device,
        num_threads=args.num_threads,
        markdown_out=args.out.with_suffix(".md"),
        **optional,
    )
    print(capacity_markdown(result))
    print(f"total wall time {result['wall_s']:.0f} s; written {args.out} and {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
