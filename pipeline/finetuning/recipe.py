"""The fine-tuning recipe that finds itself (`finetune.recipe: auto`): the learning rate and the
number of epochs chosen on the validation split, within the time budget, before the real run.

`choose` runs one point per rate of `finetune.recipe_learning_rates` through the sweep's
machinery (pipeline/finetuning/sweep.py: a nested MLflow run each, nothing written, no
baselines), each for up to `finetune.epochs` epochs with the validation metric after every
epoch. The test split is not evaluated for the points, so nothing of it reaches the choice. The
point with the best validation metric wins (ties: the earlier, smaller rate); its best epoch is
the epoch count. With `finetune.max_seconds` the search gets `recipe_search_fraction` of the
budget, each point an even share of what is left of it (a point that cannot start within it is
skipped, and said so), and the final run the rest. A validation split too small to choose on
(fewer than `baselines.MIN_VALIDATION` examples) keeps the config's learning rate and epochs,
with one warning naming the split.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from pipeline import config as config_lib
from pipeline.config import Config
from pipeline.finetuning import data as fd
from pipeline.finetuning.baselines import MIN_VALIDATION
from pipeline.finetuning.sweep import point_config, run_point
from pipeline.finetuning.train import fine_tune
from pipeline.tracking import outbox

log = logging.getLogger(__name__)

MIN_POINT_SECONDS = 1.0  # a point with less of the search's budget left does not start


@dataclasses.dataclass
class Choice:
    """What the search decided: the final run's config and the report of what was tried."""
    config: Config  # learning_rate, epochs and max_seconds (the rest of the budget) set
    report: dict  # metrics.json's "recipe": points, chosen values, the summary line


def fine_tune_as_configured(config: Config) -> dict:
    """The finetune stage: one fine-tuning run, its outputs written and registered; with
    `finetune.recipe: auto`, on the learning rate and epochs `choose` picked."""
    if config.finetune.recipe == "auto":
        choice = choose(config)  # the points: validation only, nothing written
        return fine_tune(choice.config, write_outputs=True, recipe=choice.report)
    return fine_tune(config, write_outputs=True)


def choose(config: Config) -> Choice:
    """Tries every rate of finetune.recipe_learning_rates on the validation split (see the
    module's docstring) and returns the final run's config and what was tried; logs the choice
    on the active MLflow run (tags finetune.recipe*, recipe_* metrics)."""
    fc = config.finetune
    started = time.time()
    budget = fc.max_seconds
    search_budget = budget * fc.recipe_search_fraction if budget else 0.0
    rates = [float(r) for r in fc.recipe_learning_rates]
    data = fd.load_task(fc)
    if len(data.validation) < MIN_VALIDATION:
        where = (f"finetune.validation_file {fc.validation_file}" if fc.validation_file
                 else f"the validation split of {fc.train_file or fc.dataset} "
                      f"(finetune.validation_fraction = {fc.validation_fraction:g})")
        log.warning(f"finetune: recipe auto: {where} has {len(data.validation)} example(s), "
                    f"fewer than {MIN_VALIDATION}: too small to choose a learning rate and "
                    f"epochs on, so the config's learning_rate {fc.learning_rate:g} and epochs "
                    f"{fc.epochs} are used; give a larger validation split "
                    f"(finetune.validation_file or finetune.validation_fraction)")
        return _chosen(config, Search(data.metric, started, []), fc.learning_rate, fc.epochs,
                       fallback=f"a validation split of {len(data.validation)} example(s), "
                                f"fewer than {MIN_VALIDATION}")

    log.info(f"finetune: recipe auto: trying learning rates "
             f"{', '.join(f'{r:g}' for r in rates)} for up to {fc.epochs} epoch(s) each on the "
             f"validation split ({len(data.validation):,} examples)"
             + (f", within {search_budget:.0f} s of finetune.max_seconds = {budget:g}"
                if budget else ""))
    points = []
    for i, rate in enumerate(rates, start=1):
        share = 0.0
        if search_budget:
            left = search_budget - (time.time() - started)
            if left < MIN_POINT_SECONDS:
                log.info(f"finetune: recipe auto: point {i}/{len(rates)} (learning_rate {rate:g}) "
                         f"skipped: the search's {search_budget:.0f} s of finetune.max_seconds "
                         f"are spent")
                points.append({"learning_rate": rate, "skipped": "the search's budget is spent"})
                continue
            share = left / (len(rates) - i + 1)  # an even share of what is left
        log.info(f"finetune: recipe auto: point {i}/{len(rates)}: learning_rate {rate:g}"
                 + (f", at most {share:.0f} s" if share else ""))
        point = {"learning_rate": rate}
        began = time.time()
        result, run_id = run_point(
            point_config(config, point, "recipe auto point", recipe="fixed", max_seconds=share,
                         random_init_baseline=False),
            f"recipe {i}: learning_rate={rate:g}", "finetune-recipe", point, evaluate_test=False)
        points.append({"learning_rate": rate, "best_epoch": result["best_epoch"],
                       f"validation_{data.metric}": float(result["validation"][data.metric]),
                       "validation_by_epoch": [h.get(f"val_{data.metric}")
                                               for h in result["history"]],
                       "trained_steps": result["trained_steps"],
                       "planned_steps": result["planned_steps"],
                       "stopped_for_time": result["stopped_for_time"],
                       "seconds": round(time.time() - began, 1), "mlflow_run_id": run_id})

    tried = [p for p in points if "best_epoch" in p]
    if not tried:  # reading the data took the search's whole share
        log.warning(f"finetune: recipe auto: no point could start within the search's "
                    f"{search_budget:.0f} s of finetune.max_seconds = {budget:g}, so the config's "
                    f"learning_rate {fc.learning_rate:g} and epochs {fc.epochs} are used; raise "
                    f"finetune.max_seconds or finetune.recipe_search_fraction")
        return _chosen(config, Search(data.metric, started, points), fc.learning_rate, fc.epochs,
                       fallback="no point started within the search's budget")
    key = f"validation_{data.metric}"
    best = max(tried, key=lambda p: p[key])  # ties: the earlier point
    return _chosen(config, Search(data.metric, started, points, best), best["learning_rate"],
                   best["best_epoch"])


@dataclasses.dataclass
class Search:
    """What the search did: the validation `metric`, when it `started` (time.time()), the
    `points` tried (or skipped) and the `best` of them (None: none chosen)."""
    metric: str
    started: float
    points: list
    best: dict | None = None


def _chosen(config: Config, search: Search, rate: float, epochs: int,
            fallback: str = "") -> Choice:
    """The final run's config (learning_rate, epochs, recipe fixed, max_seconds: the rest of
    the budget, at least its share) and the report, logged."""
    fc = config.finetune
    budget, metric, points, best = fc.max_seconds, search.metric, search.points, search.best
    seconds = time.time() - search.started
    rest = max(budget - seconds, budget * (1 - fc.recipe_search_fraction)) if budget else 0.0
    tried = [p for p in points if "best_epoch" in p]
    skipped = len(points) - len(tried)
    if fallback:
        line = (f"recipe auto could not choose ({fallback}): learning_rate {rate:g}, "
                f"{epochs} epoch(s) as configured")
    else:
        line = (f"recipe auto chose learning_rate {rate:g}, {epochs} epoch(s) (validation "
                f"{metric} {best[f'validation_{metric}']:.4f}; tried {len(tried)} point(s) in "
                f"{seconds:.0f} s" + (f", {skipped} skipped for time" if skipped else "") + ")")
    log.info(f"finetune: {line}")
    report = {"recipe": "auto", "learning_rate": rate, "epochs": epochs,
              "metric": f"validation_{metric}", "points": points, "search_seconds":
              round(seconds, 1), "final_max_seconds": round(rest, 1), "fallback": fallback,
              "line": line}
    raw = config_lib.to_dict(config)
    raw["finetune"].update(learning_rate=rate, epochs=epochs, recipe="fixed", max_seconds=rest)
    final = config_lib.from_dict(raw, "recipe auto's choice")
    # Tags, not params: a resumed stage run may choose again.
    outbox.set_tags({"finetune.recipe": line, "finetune.recipe.learning_rate": f"{rate:g}",
                     "finetune.recipe.epochs": str(epochs)})
    outbox.log_metrics({"recipe_points_tried": float(len(tried)),
                        "recipe_points_skipped": float(skipped),
                        "recipe_search_seconds": round(seconds, 1),
                        **({f"recipe_validation_{metric}": best[f"validation_{metric}"]}
                           if best else {})})
    return Choice(final, report)
