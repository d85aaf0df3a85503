"""`python -m pipeline adapt --config <finetune config>`: task-adaptive pretraining, then
fine-tuning, as one command (TAPT: Gururangan et al. 2020, "Don't Stop Pretraining").

    python -m pipeline adapt --config configs/finetune_brown.yaml finetune.init_from=<checkpoint>
        [--pretrain-config configs/continue_pretraining.yaml] [--pretrain train.max_seconds=600]
        [finetune.key=value ...] [--force]

1. The text of the task's own **training split** (the split the finetune stage makes from the
   same config: never validation or test text) is written as a corpus, one document per
   example (a pair's two texts, a tagged sentence's words, a question with its context):
   <run_dir>/tapt/<name>/task_text/train.jsonl.
2. Pretraining continues from `finetune.init_from` (a published checkpoint, a `.keras`, or a
   domain-adapted model: DAPT then TAPT) on that corpus: corpus → vocab (the checkpoint's) →
   data → pretrain with `--pretrain-config` (default configs/continue_pretraining.yaml: its
   time budget, learning rate and head warm-up) and the `--pretrain` overrides, in
   <run_dir>/tapt/<name>/.
3. The task is fine-tuned from that model with its own config, as `make finetune` would.

Each part runs through the CLI's runner (`cli._run`: lock, caching, checksums, resume, MLflow
runs), so a second invocation reuses what is done. Why here, beside cli.py: like the cycle,
this command runs stages, and the libraries may not (import-linter, pyproject.toml); cli.py
names it by string in TOOLS.

Exit codes as `python -m pipeline`: 0 done, 2 bad input (one line), 4 already running.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from pipeline import cli

log = logging.getLogger(__name__)

DEFAULT_PRETRAIN_CONFIG = "configs/continue_pretraining.yaml"


def build_parser() -> argparse.ArgumentParser:
    """adapt's parser (docs/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(
        prog="python -m pipeline adapt", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1].split("\n\nWhy")[0])
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="overrides of the finetune config (finetune.init_from=...)")
    parser.add_argument("--config", default="configs/finetune_brown.yaml",
                        help="the task's finetune config")
    parser.add_argument("--pretrain-config", default=DEFAULT_PRETRAIN_CONFIG,
                        help="the recipe of the continued pretraining")
    parser.add_argument("--pretrain", action="append", default=[], metavar="key=value",
                        help="an override of the pretraining config (repeat it)")
    parser.add_argument("--force", action="store_true", help="re-run stages even if up to date")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show everything on the console, as `python -m pipeline -v`")
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_intermixed_args(argv[1:])

    from pipeline import artifacts, logs
    from pipeline import config as config_lib
    from pipeline.finetuning import data as finetune_data
    from pipeline.finetuning.readers import FinetuneDataError
    from pipeline.finetuning.task_model import output_name

    try:
        config = config_lib.load(args.config, args.overrides)
        fc = config.finetune
        if not fc.init_from:
            raise config_lib.ConfigError(
                f"{args.config}: key finetune.init_from is empty; adapt continues pretraining "
                f"a model: give the checkpoint, e.g. finetune.init_from=<checkpoint dir>")
        folder = artifacts.Artifacts(config.run_dir).root / "tapt" / output_name(fc)
        texts = finetune_data.training_text(finetune_data.load_task(fc))
        if not texts:
            raise FinetuneDataError(f"{args.config}: the training split of finetune.train_file "
                                    f"has no text to continue pretraining on; check "
                                    f"finetune.text_column")
        corpus = corpus_of(folder)
        artifacts.write_text_atomic(corpus, "".join(json.dumps({"text": t}) + "\n"
                                                    for t in texts))
        pretrain = config_lib.load(args.pretrain_config, [
            f"model.init_from={fc.init_from}", *args.pretrain, f"run_dir={folder}",
            "corpus.source=files", f"corpus.path={corpus}", "corpus.format=jsonl",
            "corpus.text_key=text", f"tracking.experiment={config.tracking.experiment}",
            *([f"tracking.tracking_uri={config.tracking.tracking_uri}"]
              if config.tracking.tracking_uri else [])])
    except (config_lib.ConfigError, FinetuneDataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return cli.EXIT_BAD_INPUT

    paths = artifacts.Artifacts(pretrain.run_dir)
    paths.logs_dir.mkdir(parents=True, exist_ok=True)
    logs.setup(paths.logs_dir / "adapt.log", verbose=args.verbose)
    log.info(f"adapt: {len(texts):,} training examples of {args.config} "
             f"({corpus.stat().st_size:,} bytes) -> continued pretraining of {fc.init_from} "
             f"in {folder}")
    code = cli._run(pretrain, args.pretrain_config, list(cli.STAGES), args.force, paths)
    if code not in (cli.EXIT_OK, cli.EXIT_NOTHING_TO_DO):
        return code
    adapted = artifacts.Artifacts(folder)
    finetune = config_lib.load(args.config, [
        *args.overrides, f"finetune.init_from={adapted.model_keras}",
        f"finetune.vocab_file={adapted.vocab_file}"])
    log.info(f"adapt: fine-tuning {output_name(fc)} from {adapted.model_keras}")
    return cli._run(finetune, args.config, ["finetune"], args.force,
                    artifacts.Artifacts(finetune.run_dir))


def corpus_of(folder: Path) -> Path:
    """Where `adapt` writes the task's training text for a task folder <run_dir>/tapt/<name>."""
    return Path(folder) / "task_text" / "train.jsonl"
