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

import datetime
import itertools
import logging
import sys

from pipeline.config import Config
from pipeline.finetuning import glue
from pipeline.finetuning.sweep import parse_grid
from pipeline.finetuning.task_model import resolve_init
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
                             glue.fine_tune_task(config, task, points))
            records[task]["mlflow_run_id"] = run_id
            records[task]["init_from"] = init_from
            outbox.log_metrics({f"dev_{name.lower()}_{m}": v
                                for name, values in records[task]["entries"].items()
                                for m, v in values.items()})

    # 4. Results and submission files, with the tasks of an earlier run on this encoder.
    earlier = glue.earlier_records(config.run_dir, init_from, chosen)
    header = {"date": f"{datetime.datetime.now():%Y-%m-%d %H:%M}", "init_from": init_from,
              "glue_dir": str(fc.glue_dir), "grid": grid, "learning_rate": fc.learning_rate,
              "command": " ".join(["python -m pipeline", *sys.argv[1:]]),
              "machine": glue.machine()}
    out = glue.write_outputs(config.run_dir, {**earlier, **records}, header)
    results = glue.log_results(out)
    return {"output_dir": str(out), "glue_score": results["glue_score"],
            "tasks": results["tasks"]}
