"""The classical baselines of a fine-tuning config's split, without a model: what a fine-tuning
run of that config would report beside its model (the same task class, split and settings).

    make bench-baselines FINETUNE_CONFIG=configs/finetune_brown.yaml [ARGS="key=value ..."]
    python bench/bench_baselines.py --config configs/finetune_brown_pos.yaml

Prints each baseline's test value of the selection metric, what was chosen on the validation
split and its validation value; then the wall time and, last, `bench-baselines: <config>
<metric> best <name> <value>` (the row the model's margin is measured against).
"""

from __future__ import annotations

import argparse
import logging
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's parser (docs/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/finetune_brown.yaml")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the config")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("bm25s").setLevel(logging.WARNING)

    from bench import machine
    from pipeline.config import ConfigError, load
    from pipeline.finetuning import baselines, tasks
    from pipeline.finetuning import data as finetune_data
    from pipeline.finetuning.readers import FinetuneDataError

    model, flags = machine.cpu_facts()
    print(f"bench-baselines: CPU {model} ({platform.machine()}); flags: "
          + machine.flags_text(flags, ", "))
    try:
        fc = load(args.config, args.overrides).finetune
        data = finetune_data.load_task(fc)
    except (ConfigError, FinetuneDataError) as err:
        print(f"bench-baselines: error: {err}", file=sys.stderr)
        return 2
    print(f"{args.config}: {len(data.train):,} train / {len(data.validation):,} validation / "
          f"{len(data.test):,} test examples; metric {data.metric}")
    started = time.perf_counter()
    rows = tasks.get(fc.task, fc).baselines(data, fc.seed)
    seconds = time.perf_counter() - started
    for name, row in rows.items():
        validation = row.get("validation", {}).get(data.metric)
        print(f"  {name:16} test {row[data.metric]:.4f}   validation "
              f"{'-' if validation is None else f'{validation:.4f}'}   "
              f"{row.get('chosen', '')}")
    best, value = baselines.strongest(rows, data.metric)
    print(f"({seconds:.1f} s for every baseline, settings chosen on the validation split)")
    print(f"bench-baselines: {args.config} {data.metric} best {best} {value:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
