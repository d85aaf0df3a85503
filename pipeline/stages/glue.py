"""Stage `glue`: every GLUE task folder of `finetune.glue_dir` (or those `--tasks` names)
fine-tuned as the BERT paper did, scored on dev, and the test sets predicted for the server.

`make glue GLUE_DIR=/path/to/glue_data [TASKS=cola,sst-2] [ARGS='finetune.init_from=...']`.

Reads top to bottom:
  1. the tasks: the folders present (CoLA/, SST-2/, ...), or the named ones;
  2. per task, a nested MLflow run: one fine-tuning per point of `finetune.sweep` (empty: one,
     `finetune.learning_rate`) with the BERT paper's settings (configs/glue.yaml), each written
     to <run_dir>/finetune/glue_<task>[_p<i>]/ as the finetune stage writes; the point with the
     best dev score kept (the paper picked its learning rate on dev); WNLI: the majority class
     (the paper's choice, pipeline/finetuning/glue.py);
  3. the kept model predicts the task's unlabelled test file(s) (MNLI: matched, mismatched and
     the diagnostic set as AX);
  4. <run_dir>/glue/ written whole: results.md and results.json (task, metrics, dev score,
     steps, time; the GLUE score and the BERT paper's average) and submission/<TASK>.tsv,
     logged to this stage's MLflow run. Tasks of an earlier run on the same encoder that
     this one did not run are kept (their rows say so), so tasks may be run one at a time.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path

from pipeline import config as config_lib
from pipeline.config import Config
from pipeline.finetuning import glue
from pipeline.finetuning.readers import GLUE_TASKS
from pipeline.finetuning.sweep import parse_grid
from pipeline.finetuning.task_model import resolve_init
from pipeline.finetuning.train import fine_tune
from pipeline.tracking import outbox
from pipeline.tracking import runs as tracking

log = logging.getLogger(__name__)


def run(config: Config, tasks="") -> dict:
    """Runs the GLUE tasks; returns {"output_dir", "glue_score", "tasks": {...}}."""
    fc = config.finetune
    # 1. Tasks (every error here comes before anything trains).
    chosen = glue.select_tasks(fc.glue_dir, tasks)
    init_from = str(resolve_init(config)[0])
    grid = parse_grid(fc.sweep)
    points = [dict(zip(grid, values)) for values in itertools.product(*grid.values())] or [{}]
    log.info(f"glue: {len(chosen)} task(s) from {fc.glue_dir}: {', '.join(chosen)}; encoder "
             f"{init_from}; " + (f"{len(points)} points per task ({', '.join(grid)}), the best by "
                                 f"dev score" if grid else f"learning rate {fc.learning_rate}"))
    if fc.recipe == "auto":
        log.warning("glue: finetune.recipe = auto applies to the finetune stage only; here each "
                    f"task trains at learning_rate {fc.learning_rate:g} for {fc.epochs} epoch(s) "
                    "(give finetune.sweep a grid to choose per task by dev score)")
    for task in chosen:
        for path in glue.missing_test_files(fc.glue_dir, task):
            log.warning(f"glue: {path} is missing: no submission file for {task}")

    # 2-3. Each task: fine-tuned (or the majority class), its test files predicted.
    records = {}
    for task in chosen:
        with tracking.nested_run(f"glue {task}",
                                 {"pipeline.stage": "glue-task", "glue.task": task}) as run_id:
            records[task] = (glue.majority_class(fc.glue_dir, task)
                             if task in glue.MAJORITY_CLASS_TASKS else
                             _fine_tune_task(config, task, points))
            records[task]["mlflow_run_id"] = run_id
            records[task]["init_from"] = init_from
            outbox.log_metrics({f"dev_{name.lower()}_{m}": v
                                for name, values in records[task]["entries"].items()
                                for m, v in values.items()})

    # 4. Results and submission files, with the tasks of an earlier run on this encoder.
    earlier = _earlier(config.run_dir, init_from, chosen)
    header = {"date": f"{datetime.datetime.now():%Y-%m-%d %H:%M}", "init_from": init_from,
              "glue_dir": str(fc.glue_dir), "grid": grid, "learning_rate": fc.learning_rate,
              "command": " ".join(["python -m pipeline", *sys.argv[1:]]),
              "machine": _machine()}
    out = glue.write_outputs(config.run_dir, {**earlier, **records}, header)
    results = json.loads((out / "results.json").read_text())
    for line in glue.table(results["tasks"]):
        log.info(f"glue: {line}")
    log.info(f"glue: wrote {out}/results.md and {out}/submission/ "
             f"(zip its files for the GLUE server)")
    score, paper = results["glue_score"], results["bert_paper_average"]
    outbox.log_metrics({
        **{f"dev_{name.lower()}_{m}": v for r in results["tasks"].values()
           for name, values in r["entries"].items() for m, v in values.items()},
        **({"glue_score_dev": score["score"]} if score["score"] is not None else {}),
        **({"bert_paper_average_dev": paper["score"]} if paper["score"] is not None else {})})
    outbox.set_tags({"glue.tasks": ",".join(results["tasks"]),
                     "glue.complete": str(score["complete"]).lower()})
    for name in ("results.md", "results.json"):
        outbox.log_artifact(out / name, "glue")
    for path in sorted((out / "submission").iterdir()):
        outbox.log_artifact(path, "glue/submission")
    return {"output_dir": str(out), "glue_score": results["glue_score"],
            "tasks": results["tasks"]}


def _fine_tune_task(config: Config, task: str, points: list) -> dict:
    """One fine-tuning per point (nested runs when several); the best by dev score predicts
    the test files. Returns the task's record."""
    started, trials = time.time(), []
    for i, point in enumerate(points, start=1):
        name = f"glue_{task}" + (f"_p{i}" if len(points) > 1 else "")
        task_config = _task_config(config, task, name, point)
        label = " ".join(f"{k}={v}" for k, v in point.items())
        with (tracking.nested_run(f"glue {task} {i}: {label}", {"pipeline.stage": "glue-point"})
              if len(points) > 1 else contextlib.nullcontext()):
            outbox.log_params({f"finetune.{k}": v for k, v in point.items()})
            result = fine_tune(task_config, write_outputs=True)
        entries = glue.dev_entries(task, result)
        trials.append({"point": point, "model_dir": result["output_dir"], "entries": entries,
                       "score": glue.task_scores(entries)[task],
                       "steps": result["history"][-1]["step"] if result["history"] else 0,
                       "train_seconds": result["train_seconds"]})
        log.info(f"glue: {task} {label or ''} dev score {trials[-1]['score']:.4f}")
    best = max(trials, key=lambda t: t["score"])
    if len(trials) > 1:
        log.info(f"glue: {task}: keeping {best['model_dir']} (dev score {best['score']:.4f})")
    predictions, predict = {}, None
    for sub, path in glue.test_files(config.finetune.glue_dir, task).items():
        indices, examples = glue.read_test(path, "mnli" if sub == "AX.tsv" else task)
        predict = predict or glue.predictor(best["model_dir"], task)
        predictions[sub] = (indices, predict(examples))
        log.info(f"glue: {task}: predicted {len(examples):,} rows of {path} -> {sub}")
    method = "fine-tuned" + (f", best of {len(trials)} by dev score" if len(trials) > 1 else "")
    return {"method": method, **{k: best[k] for k in ("point", "model_dir", "entries",
                                                      "steps", "train_seconds")},
            "trials": [{k: t[k] for k in ("point", "model_dir", "score")} for t in trials],
            "seconds": round(time.time() - started, 1), "predictions": predictions}


def _task_config(config: Config, task: str, name: str, point: dict) -> Config:
    """The finetune section for one GLUE task (and grid point), validated as the CLI would."""
    raw = config_lib.to_dict(config)
    raw["finetune"].update(point)
    raw["finetune"].update(dataset="glue", glue_task=task, name=name, sweep=[], labels=[],
                           task="regression" if GLUE_TASKS[task]["labels"] is None
                           else "classification")
    return config_lib.from_dict(raw, f"glue task {task}")


def _earlier(run_dir, init_from: str, chosen: list) -> dict:
    """Records of an earlier glue run on the same encoder for tasks not run now."""
    try:
        old = json.loads((glue.output_dir(run_dir) / "results.json").read_text())["tasks"]
    except (OSError, ValueError, KeyError):
        return {}
    kept = {t: {**r, "earlier": True} for t, r in old.items()
            if t not in chosen and r.get("init_from") == init_from}
    if kept:
        log.info(f"glue: keeping the results of an earlier run for {', '.join(kept)} "
                 f"(same encoder)")
    return kept


def _machine() -> str:
    cpu = ""
    with contextlib.suppress(OSError):
        cpu = next((line.split(":", 1)[1].strip() for line in
                    Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), "")
    return f"{cpu or platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
