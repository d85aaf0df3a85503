"""What a fine-tuning run leaves: <run_dir>/finetune/<name>/ written whole (model, raw-text
SavedModel checked against the in-memory model, metrics, splits, predictions), logged to
MLflow and registered.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import mlflow
import numpy as np

from pipeline import artifacts
from pipeline import config as config_lib
from pipeline.config import Config
from pipeline.finetuning import metrics, readers
from pipeline.finetuning.evaluation import confusion_matrix_png
from pipeline.finetuning.task_model import output_name, predict_outputs, resolve_init, windowed
from pipeline.tracking import outbox


def registered_name(fc) -> str:
    """The model registry name: `finetune.registered_model`, else bert-<finetune.name> with
    dashes (a task named polarity registers as bert-polarity, brown_genre as bert-brown-genre)."""
    return fc.registered_model or "bert-" + output_name(fc).replace("_", "-")


def _report(results: dict, data: readers.TaskData, log) -> None:
    keys = [k for k, v in results["test"].items() if isinstance(v, float)]
    keys = sorted(keys, key=lambda k: (k != data.metric, k))[:4]
    log(f"finetune: test ({len(data.test):,} examples)   " +
        "   ".join(f"{k} {results['test'][k]:.4f}" for k in keys))
    for name, result in results.get("baselines", {}).items():
        log(f"finetune: baseline {name:<18}" +
            "   ".join(f"{k} {result[k]:.4f}" for k in keys if k in result))


def task_info(config: Config, data: readers.TaskData, lowercase: bool, model_path="") -> dict:
    fc = config.finetune
    return {"task": fc.task, "labels": data.labels,
            "pair": data.pair and fc.task != "semantic_search",
            "max_seq_length": fc.max_seq_length, "lowercase": lowercase, "dataset": fc.dataset,
            "glue_task": fc.glue_task, "metric": data.metric,
            "max_query_length": fc.max_query_length, "doc_stride": fc.doc_stride,
            "n_best": fc.n_best, "max_answer_length": fc.max_answer_length,
            "version_2": fc.version_2, "null_score_threshold": fc.null_score_threshold,
            "init_from": str(model_path),
            "long_doc_aggregation": getattr(fc, "long_doc_aggregation", "none"),
            "window_stride": getattr(fc, "window_stride", 0),
            "max_windows": getattr(fc, "max_windows", 0)}


def write_and_log(config, paths, encoder, pre, data, results, predictions, splits, vocab_path,
                  lowercase, log) -> None:
    """Writes <run_dir>/finetune/<name>/ whole, then logs it to MLflow and registers the model."""
    from pipeline.serving import export, mlflow_model

    fc = config.finetune
    task = fc.task
    info = task_info(config, data, lowercase, resolve_init(config)[0])
    with artifacts.atomic_dir(paths.dir) as tmp:
        out = artifacts.FinetuneArtifacts(tmp)
        encoder.save(str(out.model_keras))
        shutil.copyfile(vocab_path, out.vocab_file)
        out.task_json.write_text(json.dumps(info, indent=2))
        out.splits.write_text(json.dumps(data.splits, indent=2))
        out.config.write_text(config_lib.dump_yaml(config))
        if task in export.SERVING_TASKS and not windowed(fc):  # windowed: just below
            export.export_text_model(encoder, pre, out.saved_model, task, data.labels,
                                     info["pair"], options=info)
            if task in export.WORD_TASKS:  # in-graph word split / windows / span search
                results["export_max_abs_diff"], results["export_mismatches"] = \
                    check_word_export(out.saved_model, encoder, pre, data, info)
            else:
                results["export_max_abs_diff"] = check_export(out.saved_model, encoder, pre,
                                                              data, info["pair"])
        if task == "classification" and windowed(fc):  # windows made in the graph
            from pipeline.serving import export

            export.export_window_model(encoder, pre, out.saved_model, data.labels,
                                       fc.window_stride, fc.max_windows)
            results["export_max_abs_diff"] = export.check_window_export(
                out.saved_model, encoder, pre, [e.text for e in data.test[:32]],
                fc.window_stride, fc.max_windows)
        if task == "classification":
            matrix = metrics.confusion_matrix(predictions["test"]["y_true"],
                                              predictions["test"]["y_pred"], len(data.labels))
            results["test"]["confusion_matrix"] = matrix.tolist()
            confusion_matrix_png(matrix, data.labels, out.confusion_matrix,
                                 f"{output_name(fc)}: test confusion matrix "
                                 f"(accuracy {results['test']['accuracy']:.3f})")
        out.metrics.write_text(json.dumps(results, indent=2, default=float))
        _write_predictions(out.test_predictions, task, data, predictions["test"])
        artifacts.write_checksums(tmp)  # last: what distillation checks before it reads them
    log(f"finetune: wrote {paths.dir}")

    if not mlflow.active_run():
        return
    flat = {}
    for split in ("validation", *data.tests):
        flat.update({f"{split}_{k}": v for k, v in results[split].items() if isinstance(v, float)})
    for name, result in results.get("baselines", {}).items():
        flat.update({f"baseline_{name}_test_{k}": v for k, v in result.items()
                     if isinstance(v, float)})
    for key in ("export_max_abs_diff", "export_mismatches"):
        if key in results:
            flat[key] = float(results[key])
    flat["finetune_seconds"] = results["seconds"]
    outbox.log_metrics(flat)  # kept if the tracking store is down
    for path in (paths.metrics, paths.splits, paths.task_json, paths.config,
                 paths.test_predictions, paths.confusion_matrix):
        if path.exists():
            outbox.log_artifact(path, "finetune")
    outbox.log_artifact(paths.model_keras, "finetune")
    if task in export.SERVING_TASKS and fc.register_model and outbox.is_down():
        log(f"warning: finetune: the tracking store is down, so the model in {paths.dir} is not "
            f"registered; register it later by running the stage again with --force")
    elif task in export.SERVING_TASKS and fc.register_model:
        name = registered_name(fc)
        uri, version = mlflow_model.log_to_mlflow(paths.dir, info, name)
        mlflow.set_tags({"finetune.model_uri": uri, "finetune.registered_model": name})
        log(f"finetune: logged the raw-text model to MLflow ({uri}), registered as {name!r} "
            f"version {version}")
        if version:
            from pipeline.tracking import runs as tracking

            # The champion alias moves only to a model that beats it on the same test split.
            split_id = hashlib.sha256(json.dumps(data.splits, sort_keys=True).encode()).hexdigest()
            tracking.promote_if_better(name, version, f"test_{data.metric}",
                                       results["test"][data.metric], split_id[:16], log=log)


def check_export(folder, encoder, pre, data, pair: bool, n: int = 32) -> float:
    """Max |exported − in-memory| output on the first test texts (raw strings both ways)."""
    from pipeline.serving import export

    examples = data.test[:n]
    texts = [e.text for e in examples]
    pairs = [e.text_pair for e in examples] if pair else None
    exported = export.run_saved_model(export.load_saved_model(folder), texts, pairs)
    x = pre.features(texts, pairs)
    memory = predict_outputs(encoder, x, n)
    if "logits" in memory:
        logits = memory["logits"] - memory["logits"].max(-1, keepdims=True)
        probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        return float(np.abs(probs - exported["scores"]).max())
    key = "score" if "score" in memory else "embedding"
    return float(np.abs(memory[key] - exported[key]).max())


def check_word_export(folder, encoder, pre, data, info: dict, n: int = 32) -> tuple[float, int]:
    """Token classification / QA: (max |exported − in-memory| score, the number of words or
    questions whose label / answer differ) on the first test examples, raw strings into the
    SavedModel vs. the Python tokenization + the in-memory model (pipeline/finetuning/features.py)."""
    from pipeline.finetuning import features
    from pipeline.serving import export

    examples = data.test[:n]
    serve = export.load_saved_model(folder)
    if info["task"] == "token_classification":
        texts = [" ".join(e.words) for e in examples]
        exported = export.run_token_model(serve, texts)
        memory = features.python_tag(encoder, pre, texts, info["labels"])
        pairs = [(a, b) for x, y in zip(exported, memory)
                 for a, b in zip(zip(x["labels"], x["scores"]), zip(y["labels"], y["scores"]))]
        mismatches = sum(a[0] != b[0] for a, b in pairs) + \
            sum(len(x["labels"]) != len(y["labels"]) for x, y in zip(exported, memory))
        diff = max([abs(a[1] - b[1]) for a, b in pairs], default=0.0)
        return float(diff), int(mismatches)
    questions, contexts = [e.question for e in examples], [e.context for e in examples]
    exported = export.run_qa_model(serve, questions, contexts)
    memory = features.python_answer(encoder, pre, questions, contexts, info)
    mismatches = sum(x["answer"] != y["answer"] for x, y in zip(exported, memory))
    diffs = [abs(x[k] - y[k]) for x, y in zip(exported, memory) for k in ("score", "null_score")
             if np.isfinite(x[k]) and np.isfinite(y[k])]
    mismatches += sum(np.isfinite(x["score"]) != np.isfinite(y["score"])
                      for x, y in zip(exported, memory))
    return float(max(diffs, default=0.0)), int(mismatches)


def _write_predictions(path: Path, task: str, data: readers.TaskData, prediction: dict) -> None:
    rows = []
    for i, example in enumerate(data.test):
        if task == "classification":
            row = {"text": example.text, "gold": example.label,
                   "predicted": data.labels[int(prediction["y_pred"][i])]}
            if example.text_pair is not None:
                row["text_pair"] = example.text_pair
        elif task == "regression":
            row = {"text": example.text, "text_pair": example.text_pair, "gold": example.label,
                   "predicted": float(prediction["y_pred"][i])}
        elif task == "token_classification":
            row = {"words": example.words, "gold": example.tags, "predicted": prediction["tags"][i]}
        elif task == "question_answering":
            row = {"id": example.qid, "question": example.question,
                   "gold": [a for a, _ in example.answers],
                   "predicted": prediction["answers"][example.qid]}
        else:
            top = int(prediction["top1"][i])
            row = {"query": example.text, "gold": example.text_pair,
                   "top1": data.test[top].text_pair}
        rows.append(json.dumps(row, ensure_ascii=False))
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
