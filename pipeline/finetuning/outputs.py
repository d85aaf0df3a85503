"""What a fine-tuning run leaves: <run_dir>/finetune/<name>/ written whole (model, raw-text
SavedModel checked against the in-memory model unless `finetune.export` is false, metrics,
splits, predictions), logged to MLflow and registered.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from pipeline import artifacts
from pipeline import config as config_lib
from pipeline.config import Config
from pipeline.finetuning import readers, tasks
from pipeline.finetuning.task_model import output_name
from pipeline.text import vocab as vocab_lib
from pipeline.tracking import outbox

log = logging.getLogger(__name__)


def registered_name(fc) -> str:
    """The model registry name: `finetune.registered_model`, else bert-<finetune.name> with
    dashes (a task named polarity registers as bert-polarity, brown_genre as bert-brown-genre)."""
    return fc.registered_model or "bert-" + output_name(fc).replace("_", "-")


def _report(results: dict, data: readers.TaskData) -> None:
    if "test" not in results:  # a point of recipe auto's search: validation only
        log.info(f"finetune: validation {data.metric} {results['validation'][data.metric]:.4f} "
                 f"(epoch {results['best_epoch']}; the test split not evaluated)")
        return
    keys = [k for k, v in results["test"].items() if isinstance(v, float)]
    keys = sorted(keys, key=lambda k: (k != data.metric, k))[:4]
    log.info(f"finetune: test ({len(data.test):,} examples)   " +
             "   ".join(f"{k} {results['test'][k]:.4f}" for k in keys))
    for name, result in results.get("baselines", {}).items():
        log.info(f"finetune: baseline {name:<18}" +
                 "   ".join(f"{k} {result[k]:.4f}" for k in keys if k in result) +
                 (f"   ({result['chosen']})" if result.get("chosen") else ""))
    if results.get("recipe", {}).get("line"):
        log.info(f"finetune: {results['recipe']['line']}")
    best = results.get("best_baseline")
    if best:
        (log.warning if best["margin_points"] < 0 else log.info)(f"finetune: {best['line']}")


def compare_with_baselines(results: dict, task, metric: str) -> None:
    """results["best_baseline"]: the strongest baseline on the test `metric` (every row
    counts), its value, the model's margin in points and the summary line."""
    from pipeline.finetuning import baselines

    line, margin, name = baselines.margin_line(results["test"][metric],
                                               results.get("baselines", {}), metric,
                                               task.points)
    if line is not None:
        results["best_baseline"] = {"name": name, "metric": metric,
                                    "value": float(results["baselines"][name][metric]),
                                    "margin_points": round(float(margin), 2), "line": line}


def task_info(config: Config, data: readers.TaskData, lowercase: bool, model_path="") -> dict:
    """task.json: what serving, `make predict` and distillation need to know of the model."""
    fc = config.finetune
    task = tasks.get(fc.task, fc)
    return {"task": fc.task, "labels": data.labels,
            "pair": data.pair and not task.always_pair,
            "inputs": list(task.inputs) + (["text_pair"] if data.pair and not task.always_pair
                                           else []),
            "max_seq_length": fc.max_seq_length, "lowercase": lowercase, "dataset": fc.dataset,
            "glue_task": fc.glue_task, "metric": data.metric,
            **task.task_info(data),
            "init_from": str(model_path),
            "long_doc_aggregation": fc.long_doc_aggregation,
            "window_stride": fc.window_stride,
            "max_windows": fc.max_windows}


def write_and_log(ctx, encoder, results: dict, predictions: dict) -> None:
    """Writes the run's output folder (`ctx.paths`, context.RunContext) whole, then logs it to
    MLflow and registers the model."""
    from pipeline.serving import mlflow_model

    config, paths, data, task, tokenizer = ctx.config, ctx.paths, ctx.data, ctx.task, ctx.tokenizer
    fc = config.finetune
    task.keep(results["validation"])  # what validation chose for these weights (QA's threshold)
    exported = task.serving and fc.export
    info = task_info(config, data, tokenizer.lowercase, ctx.model_path)
    with artifacts.atomic_dir(paths.dir) as tmp:
        out = artifacts.FinetuneArtifacts(tmp)
        encoder.save(str(out.model_keras))
        vocab_lib.write_beside_model(tokenizer.vocab_path, tokenizer.lowercase, tmp)  # + .json
        out.task_json.write_text(json.dumps(info, indent=2))
        out.splits.write_text(json.dumps(data.splits, indent=2))
        out.config.write_text(config_lib.dump_yaml(config))
        if exported:  # the raw-text SavedModel, checked against the in-memory model
            task.export(encoder, tokenizer.preprocessor, out.saved_model, info)
            results.update(task.check_export(out.saved_model, encoder, tokenizer.preprocessor,
                                             data, info))
        task.test_artifacts(results, predictions, data, out, output_name(fc))
        out.metrics.write_text(json.dumps(results, indent=2, default=float))
        _write_predictions(out.test_predictions, task, data, predictions["test"])
        artifacts.write_checksums(tmp)  # last: what distillation checks before it reads them
    log.info(f"finetune: wrote {paths.dir}")

    flat = {}
    for split in ("validation", *data.tests):
        flat.update({f"{split}_{k}": v for k, v in results[split].items() if isinstance(v, float)})
    for name, result in results.get("baselines", {}).items():
        flat.update({f"baseline_{name}_test_{k}": v for k, v in result.items()
                     if isinstance(v, float)})
    if "best_baseline" in results:  # the model's margin over the strongest baseline, in points
        flat["margin_vs_best_baseline"] = results["best_baseline"]["margin_points"]
        outbox.set_tags({"finetune.best_baseline": results["best_baseline"]["name"]})
    for key in ("export_max_abs_diff", "export_mismatches"):
        if key in results:
            flat[key] = float(results[key])
    flat["finetune_seconds"] = results["seconds"]
    flat["trained_steps"] = float(results.get("trained_steps", 0))  # < planned: max_seconds
    flat["stopped_for_time"] = float(bool(results.get("stopped_for_time")))
    outbox.log_metrics(flat)  # kept if the tracking store is down
    for path in (paths.metrics, paths.splits, paths.task_json, paths.config,
                 paths.test_predictions, paths.confusion_matrix):
        if path.exists():
            outbox.log_artifact(path, "finetune")
    outbox.log_artifact(paths.model_keras, "finetune")
    if not (task.serving and fc.register_model) or outbox.active_run_id() is None:
        return  # a model is registered from a run
    if not exported:
        log.warning(f"finetune: finetune.export = false wrote no SavedModel in {paths.dir}, so "
                    f"nothing is registered; run again with finetune.export=true to register")
    elif outbox.is_down() or outbox.is_pending(outbox.active_run_id()):
        log.warning(f"finetune: the tracking store is (or was, when this run began) down, so "
                    f"the model in {paths.dir} is not registered; register it later by running "
                    f"the stage again with --force")
    else:
        name = registered_name(fc)
        uri, version = mlflow_model.log_to_mlflow(paths.dir, info, name)
        outbox.set_tags({"finetune.model_uri": uri, "finetune.registered_model": name})
        log.info(f"finetune: logged the raw-text model to MLflow ({uri}), registered as {name!r} "
                 f"version {version}")
        if version:
            from pipeline.tracking import runs as tracking

            # The champion alias moves only to a model that beats it on the same test split.
            split_id = hashlib.sha256(json.dumps(data.splits, sort_keys=True).encode()).hexdigest()
            tracking.promote_if_better(name, version, f"test_{data.metric}",
                                       results["test"][data.metric], split_id[:16])


def _write_predictions(path: Path, task, data: readers.TaskData, prediction: dict) -> None:
    rows = [json.dumps(task.prediction_row(example, prediction, i, data), ensure_ascii=False)
            for i, example in enumerate(data.test)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
