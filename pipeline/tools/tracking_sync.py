"""`python -m pipeline tracking-sync --config FILE [key=value ...]`: sends the MLflow calls a run
directory's outbox kept while the tracking store was down (pipeline/tracking/outbox.py).
Exit 0 when nothing is left, 2 while the store still does not answer (nothing is lost: run it
again later)."""

from __future__ import annotations

import argparse
import logging
import sys

from pipeline.tools import parse

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """tracking-sync's parser (docs/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(
        prog="python -m pipeline tracking-sync",
        description="Send the MLflow calls a run kept while the tracking store was down.")
    parser.add_argument("overrides", nargs="*", help="section.key=value (e.g. run_dir=runs/x)")
    parser.add_argument("--config", default="configs/pretrain_tiny.yaml",
                        help="the config of the run whose outbox is sent (its run_dir)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="every library's INFO lines too (MLflow)")
    return parser


def main(argv: list[str]) -> int:
    """Sends what a run directory's outbox holds. Exit 0 when it is empty afterwards, 2 when
    the store still does not answer (nothing lost: run it again later)."""
    import mlflow  # (here: the parser, for --help and docs/cli.md, needs none of these)

    from pipeline import artifacts
    from pipeline import config as config_lib
    from pipeline.tracking import runs
    from pipeline.tracking.outbox import configure, flush, set_http_patience

    args = parse(build_parser(), argv, "tracking-sync")
    try:
        config = config_lib.load(args.config, args.overrides)
    except config_lib.ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    set_http_patience()
    mlflow.set_tracking_uri(runs.tracking_uri(config))
    outbox_file = artifacts.Artifacts(config.run_dir).tracking_outbox
    waiting = configure(outbox_file)
    if not waiting:
        log.info(f"tracking-sync: nothing kept in {outbox_file}")
        return 0
    sent, left = flush()
    if left:
        print(f"error: the tracking store {mlflow.get_tracking_uri()} still does not answer: "
              f"sent {sent} of {waiting} kept calls, {left} stay in {outbox_file}; run "
              f"tracking-sync again when it is up", file=sys.stderr)
        return 2
    log.info(f"tracking-sync: sent {sent} kept calls from {outbox_file} to "
             f"{mlflow.get_tracking_uri()}")
    return 0
