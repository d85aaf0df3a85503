"""A fine-tuning hyperparameter grid (`finetune.sweep`): one nested MLflow run per point,
the best point by the validation metric reported and written beside the task's folder."""

from __future__ import annotations

import itertools
import json
import logging

import yaml

from pipeline import artifacts
from pipeline import config as config_lib
from pipeline.artifacts import Artifacts
from pipeline.config import Config
from pipeline.finetuning.task_model import FinetuneError, output_name
from pipeline.finetuning.train import fine_tune
from pipeline.tracking import outbox
from pipeline.tracking import runs as tracking

log = logging.getLogger(__name__)


def parse_grid(items: list[str]) -> dict:
    """["learning_rate=1e-4,3e-4", "epochs=2,3"] -> {"learning_rate": [1e-4, 3e-4], ...}."""
    grid = {}
    for item in items:
        key, _, values = item.partition("=")
        grid[key.strip()] = [_scalar(v.strip()) for v in values.split(",") if v.strip()]
    return grid


def _scalar(text: str):
    """"3" -> 3, "1e-4" -> 0.0001 (YAML 1.1 would keep it a string), "none" -> "none"."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return yaml.safe_load(text)


def sweep(config: Config, grid: dict | None = None) -> dict:
    """Runs every point of `grid` (default: `finetune.sweep`) as a nested MLflow run, picks the
    best by the validation metric, and writes <run_dir>/finetune/<name>.sweep.json. The points
    are evaluated, not exported; fine-tune the best one with `make finetune ARGS=...`."""
    grid = grid if grid is not None else parse_grid(config.finetune.sweep)
    if not grid:
        raise FinetuneError("finetune.sweep is empty; give a grid, e.g. "
                            "finetune.sweep='[\"learning_rate=1e-4,3e-4\", \"epochs=2,3\"]'")
    keys = list(grid)
    points = [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]
    log.info(f"sweep: {len(points)} points over {', '.join(keys)}")
    results = []
    for i, point in enumerate(points, start=1):
        label = " ".join(f"{k}={v}" for k, v in point.items())
        log.info(f"sweep: point {i}/{len(points)}: {label}")
        result, run_id = run_point(point_config(config, point, "sweep point"),
                                   f"sweep {i}: {label}", "finetune-sweep", point)
        results.append({"point": point, "metric": result["metric"],
                        "validation": _floats(result["validation"]),
                        "test": _floats(result["test"]), "best_epoch": result["best_epoch"],
                        "seconds": result["seconds"], "mlflow_run_id": run_id})
    metric = results[0]["metric"]
    best = max(results, key=lambda r: r["validation"][metric])
    summary = {"metric": f"validation_{metric}", "grid": grid, "points": results, "best": best}
    paths = Artifacts(config.run_dir).finetune(output_name(config.finetune))
    artifacts.write_text_atomic(paths.sweep, json.dumps(summary, indent=2, default=float))
    log.info(f"sweep: best {' '.join(f'{k}={v}' for k, v in best['point'].items())}: validation "
             f"{metric} {best['validation'][metric]:.4f}, test {metric} {best['test'][metric]:.4f} "
             f"({paths.sweep})")
    outbox.log_metrics({f"best_validation_{metric}": best["validation"][metric],
                        f"best_test_{metric}": best["test"][metric]})
    outbox.log_params({f"best.{k}": v for k, v in best["point"].items()})
    if best["mlflow_run_id"]:
        outbox.set_tags({"sweep.best_run_id": best["mlflow_run_id"]})
    outbox.log_artifact(paths.sweep, "sweep")
    return summary


def point_config(config: Config, point: dict, where: str, **fixed) -> Config:
    """`config` with a grid point's finetune.* values (and `fixed` finetune.* values), checked
    again by the config loader (ranges, cross-checks): the config one point trains with. A
    point trains no baselines (the points are compared with each other, not with them) and
    runs no grid of its own."""
    raw = config_lib.to_dict(config)
    raw["finetune"].update({**point, "sweep": [], "baselines": False, **fixed})
    overrides = " ".join(f"finetune.{k}={v}" for k, v in point.items())
    return config_lib.from_dict(raw, f"{where} {overrides}")


def run_point(point_config: Config, run_name: str, stage_tag: str, point: dict,
              evaluate_test: bool = True) -> tuple[dict, str | None]:
    """One fine-tuning of `point_config`, nothing written, as a nested MLflow run of the active
    run (if any) named `run_name` with the tag pipeline.stage = `stage_tag` and the `point` as
    params; its kept epoch's validation (and, with `evaluate_test`, test) metrics logged there.
    Returns (the fine-tuning's results, the nested run's id or None)."""
    with tracking.nested_run(run_name, {"pipeline.stage": stage_tag}) as run_id:
        outbox.log_params({f"finetune.{k}": v for k, v in point.items()})
        result = fine_tune(point_config, write_outputs=False, evaluate_test=evaluate_test)
        outbox.log_metrics({  # the kept epoch's metrics, comparable across the points
            **{f"validation_{k}": v for k, v in _floats(result["validation"]).items()},
            **{f"test_{k}": v for k, v in _floats(result.get("test", {})).items()},
            "best_epoch": float(result["best_epoch"]),
            "trained_steps": float(result["trained_steps"])})
    return result, run_id


def _floats(d: dict) -> dict:
    return {k: v for k, v in d.items() if isinstance(v, float)}
