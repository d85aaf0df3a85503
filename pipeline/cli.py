"""Command line: `python -m pipeline STAGE [STAGE ...] --config FILE [section.key=value ...]`.

Stages, in order: corpus → vocab → data → pretrain; `all` runs the four.
Each invocation is one MLflow parent run with a nested run per stage.

A stage whose inputs and settings are unchanged since it last completed is
reused (recorded on the parent run as `stage.<name> = reused`); `--force`
runs it again. Pretraining always runs: it resumes from its latest checkpoint
and finishes at once when `train.steps` is already reached.

Exit codes: 0 success; 2 bad input (config, corpus, missing artifact), with a
message naming the file or key and how to fix it; 1 anything unexpected.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import sys
import traceback
from pathlib import Path

STAGES = ("corpus", "vocab", "data", "pretrain")


def _stage_key(stage: str, config, paths) -> str:
    """A fingerprint of what a stage's output depends on (settings + upstream fingerprints)."""
    from pipeline import config as config_lib

    d = config_lib.to_dict(config)
    parts = {"stage": stage}
    if stage == "corpus":
        parts["corpus"] = d["corpus"]
        if config.corpus.source == "files":
            from pipeline.stages.corpus import expand_globs

            parts["files"] = [(str(p), p.stat().st_size, p.stat().st_mtime_ns)
                              for p in expand_globs(config.corpus.path)]
    elif stage == "vocab":
        parts["upstream"] = _stage_key("corpus", config, paths)
        parts["vocab"] = d["vocab"]
    elif stage == "data":
        parts["upstream"] = _stage_key("vocab", config, paths)
        parts["data"] = {k: v for k, v in d["data"].items() if k != "beam_args"}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _marker(stage: str, paths) -> Path:
    folder = {"corpus": paths.corpus_dir, "vocab": paths.vocab_dir, "data": paths.data_dir}[stage]
    return folder / ".stage.json"


def _is_current(stage: str, config, paths) -> bool:
    marker = _marker(stage, paths)
    if not marker.exists():
        return False
    try:
        return json.loads(marker.read_text()).get("key") == _stage_key(stage, config, paths)
    except (json.JSONDecodeError, OSError):
        return False


# Commands that are not pipeline stages: name -> "module:function" taking argv, returning an exit code.
TOOLS = {
    "fill-mask": "pipeline.inspect:main",
    "nsp": "pipeline.inspect:main",
    "attention": "pipeline.inspect:main",
    "embed": "pipeline.inspect:main",
}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in TOOLS:
        import importlib

        module, function = TOOLS[argv[0]].split(":")
        return getattr(importlib.import_module(module), function)(argv)
    parser = argparse.ArgumentParser(
        prog="python -m pipeline", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("stages", nargs="+", metavar="STAGE",
                        help=f"one or more of: {', '.join(STAGES)}, all; then key=value overrides")
    parser.add_argument("--config", default="configs/pretrain_tiny.yaml", help="YAML config file")
    parser.add_argument("--force", action="store_true", help="re-run stages even if up to date")
    args = parser.parse_intermixed_args(argv)
    overrides = [s for s in args.stages if "=" in s]
    names = [s for s in args.stages if "=" not in s]
    stages = list(STAGES) if "all" in names else names
    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages:
        parser.error(f"unknown stage {unknown[0] if unknown else ''!r}; choose from "
                     f"{', '.join(STAGES)} or all")
    stages = [s for s in STAGES if s in stages]  # always in pipeline order

    from pipeline import artifacts, config as config_lib

    try:
        config = config_lib.load(args.config, overrides)
    except config_lib.ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    paths = artifacts.Artifacts(config.run_dir)
    paths.logs_dir.mkdir(parents=True, exist_ok=True)
    log_file = paths.logs_dir / f"{datetime.datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}.log"

    def log(message: str) -> None:
        print(message, flush=True)
        with open(log_file, "a", encoding="utf-8") as handle:
            handle.write(f"{datetime.datetime.now():%H:%M:%S} {message}\n")

    return _run(config, args.config, stages, args.force, paths, log)


def _run(config, config_path, stages, force, paths, log) -> int:
    import mlflow

    from pipeline import tracking
    from pipeline.stages import corpus, data, pretrain, vocab

    modules = {"corpus": corpus, "vocab": vocab, "data": data, "pretrain": pretrain}
    descriptions = {
        "corpus": "Prepared the corpus: Google format, held-out documents split off.",
        "vocab": "Trained the WordPiece vocabulary (Beam word count + WordPiece learner).",
        "data": "Beam job: documents → NSP pairs → masked instances → TFRecords.",
        "pretrain": "Pretrained BERT (MLM + NSP), evaluated on held-out data, exported.",
    }
    results = {}
    try:
        with tracking.pipeline_run(config, stages, str(config_path)) as parent:
            log(f"MLflow run {parent.info.run_id} ({tracking.tracking_uri(config)})")
            for stage in stages:
                if stage != "pretrain" and not force and _is_current(stage, config, paths):
                    log(f"{stage}: up to date, reused ({_marker(stage, paths).parent})")
                    mlflow.set_tag(f"stage.{stage}", "reused")
                    continue
                with tracking.stage_run(stage, config, descriptions[stage]):
                    results[stage] = modules[stage].run(config, log=log)
                if stage != "pretrain":
                    artifacts_marker = _marker(stage, paths)
                    from pipeline import artifacts

                    artifacts.write_text_atomic(artifacts_marker, json.dumps(
                        {"key": _stage_key(stage, config, paths),
                         "mlflow_run_id": mlflow.last_active_run().info.run_id}))
                mlflow.set_tag(f"stage.{stage}", "ran")
    except Exception as err:  # noqa: BLE001 - reported, then mapped to an exit code
        if _is_user_error(err):
            print(f"error: {err}", file=sys.stderr)
            log(f"error: {err}\n{traceback.format_exc()}")
            return 2
        traceback.print_exc()
        log(f"failed: {err!r}")
        return 1
    _summary(config, paths, results, log)
    return 0


def _is_user_error(err: Exception) -> bool:
    from pipeline import artifacts, config as config_lib
    from pipeline.stages import corpus, pretrain

    if isinstance(err, (config_lib.ConfigError, corpus.CorpusError, artifacts.MissingArtifact,
                        pretrain.PretrainError)):
        return True
    # Errors raised inside Beam workers arrive wrapped; our messages say how to fix them.
    return isinstance(err, ValueError) or "vocab file" in str(err) or "not UTF-8" in str(err)


def _summary(config, paths, results, log) -> None:
    from pipeline import tracking

    log("")
    log("done. outputs:")
    log(f"  corpus       {paths.corpus_dir}")
    log(f"  vocab        {paths.vocab_file}")
    log(f"  TFRecords    {paths.data_dir}")
    log(f"  model        {paths.model_keras}  and  {paths.saved_model}")
    log(f"  MLflow store {tracking.tracking_uri(config)}   (browse it: make ui)")
    if paths.pretrain_eval.exists():
        ev = json.loads(paths.pretrain_eval.read_text())
        log(f"  held-out MLM accuracy {ev.get('eval_mlm_accuracy', float('nan')):.4f}   "
            f"NSP accuracy {ev.get('eval_nsp_accuracy', float('nan')):.4f}   "
            f"(step {ev.get('step')})")
