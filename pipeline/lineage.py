"""Lineage and caching: what each stage's output depends on, fingerprinted.

A stage's *key* hashes everything its output depends on: its config sections,
its code (the source files that implement it), and its inputs (the upstream
stages' outputs, or for the corpus stage the input files' sizes and
modification times). When a stage completes, a marker `.stage.json` is
written into its output folder with the key, the MLflow run that produced it,
and the input hashes. A later invocation whose key equals the marker's reuses
the output instead of recomputing it (`--force` overrides).

The dependency rules follow how people use continued pretraining:

    corpus   ← corpus.* settings, input files (size + mtime), code
    vocab    ← vocab.* settings, corpus.source/path (not the corpus contents: a
               vocabulary stays fixed when new text arrives, so models keep their ids), code
    data     ← data.* settings, prepared corpus (manifest hash), vocab.txt hash, code
    pretrain ← model.* / train.* settings, data stats + shards listing, vocab.txt hash, code
    finetune, sweep, multitask, distill ← always run (any model, any labelled set); their keys record config + code

so touching the corpus re-runs corpus → data → pretrain (and what follows), not the vocab.
"""

from __future__ import annotations

import glob
import hashlib
import json
from pathlib import Path

from pipeline import artifacts, config as config_lib
from pipeline.artifacts import Artifacts

# Fine-tuning stages share their data, heads, metrics and exports.
FINETUNE_CODE = ["pipeline/stages/finetune.py", "pipeline/finetune_data.py", "pipeline/metrics.py",
                 "pipeline/predict.py", "pipeline/word_serving.py", "pipeline/windows.py",
                 "models/*.py"]
STAGE_CODE = {
    "corpus": ["pipeline/stages/corpus.py"],
    "vocab": ["pipeline/stages/vocab.py", "beam_jobs/vocab.py"],
    "data": ["pipeline/stages/data.py", "beam_jobs/pretraining_data.py",
             "beam_jobs/transforms.py", "beam_jobs/schema.py"],
    "pretrain": ["pipeline/stages/pretrain.py", "pipeline/inputs.py", "beam_jobs/schema.py",
                 "models/*.py"],
    "finetune": FINETUNE_CODE,
    "sweep": FINETUNE_CODE,
    "multitask": ["pipeline/stages/multitask.py"] + FINETUNE_CODE,
    "distill": ["pipeline/stages/distill.py"] + FINETUNE_CODE,
}
STAGE_CONFIG = {
    "corpus": ["corpus"],
    "vocab": ["vocab"],
    "data": ["data", "vocab.lowercase"],
    "pretrain": ["model", "train", "data.max_seq_length", "data.max_predictions_per_seq",
                 "data.phases"],
    "finetune": ["finetune"],
    "sweep": ["finetune"],
    "multitask": ["finetune", "multitask"],
    "distill": ["distill"],
}
UPSTREAM = {"corpus": [], "vocab": ["corpus"], "data": ["corpus", "vocab"], "pretrain": ["data"],
            "finetune": ["pretrain"], "sweep": ["pretrain"],
            "multitask": ["pretrain"], "distill": ["finetune"]}
MARKER = ".stage.json"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()




def output_dir(stage: str, paths: Artifacts) -> Path:
    return {"corpus": paths.corpus_dir, "vocab": paths.vocab_dir, "data": paths.data_dir,
            "pretrain": paths.pretrain_dir, "finetune": paths.finetune_root,
            "sweep": paths.finetune_root, "multitask": paths.multitask_root,
            "distill": paths.distill_root}[stage]


def marker_path(stage: str, paths: Artifacts) -> Path:
    """<output dir>/.stage.json; the sweep shares finetune/ and keeps its own marker there."""
    name = ".sweep.stage.json" if stage == "sweep" else MARKER
    return output_dir(stage, paths) / name


def code_hash(stage: str) -> str:
    sha = hashlib.sha256()
    for pattern in STAGE_CODE[stage]:
        for path in sorted(glob.glob(str(artifacts.PROJECT_ROOT / pattern))):
            sha.update(Path(path).relative_to(artifacts.PROJECT_ROOT).as_posix().encode())
            sha.update(Path(path).read_bytes())
    return sha.hexdigest()


def config_hash(stage: str, config: config_lib.Config) -> str:
    flat = config_lib.to_flat_dict(config)
    chosen = {k: v for k, v in flat.items()
              if any(k == key or k.startswith(key + ".") for key in STAGE_CONFIG[stage])}
    if stage == "data":
        chosen.pop("data.beam_args", None)  # where it runs does not change what it makes
    if stage == "vocab":
        chosen["corpus.source"], chosen["corpus.path"] = flat["corpus.source"], flat["corpus.path"]
    return sha256_bytes(json.dumps(chosen, sort_keys=True).encode())


def input_hashes(stage: str, config: config_lib.Config, paths: Artifacts) -> dict | None:
    """The hashes of a stage's inputs, or None if an input is missing (the stage will say which)."""
    if stage == "corpus":
        if config.corpus.source == "brown":
            files = [artifacts.BROWN_TARBALL]
        else:
            from pipeline.stages.corpus import expand_globs

            try:
                files = expand_globs(config.corpus.path)
            except ValueError:
                return None
        if not all(f.exists() for f in files):
            return None
        stats = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
        return {"corpus_files": sha256_bytes(json.dumps(stats).encode()),
                "corpus_file_count": len(files)}
    if stage in ("finetune", "sweep", "multitask", "distill"):
        return None  # fine-tuning always runs (its inputs: any model, any labelled set)
    if stage == "vocab":
        if config.vocab.from_file:
            given = Path(config.vocab.from_file)
            return {"vocab_file": artifacts.sha256_file(given)} if given.exists() else None
        return {}
    needed = {"data": {"corpus_manifest": paths.corpus_manifest, "vocab": paths.vocab_file},
              "pretrain": {"data_stats": paths.data_stats, "vocab": paths.vocab_file}}[stage]
    if not all(p.exists() for p in needed.values()):
        return None
    hashes = {name: artifacts.sha256_file(path) for name, path in needed.items()}
    if stage == "pretrain":
        shards = sorted((p.relative_to(paths.data_dir).as_posix(), p.stat().st_size)
                        for p in paths.data_dir.rglob("*.tfrecord"))  # data/ and data/phase*/
        hashes["data_shards"] = sha256_bytes(json.dumps(shards).encode())
    return hashes


def fingerprint(stage: str, config: config_lib.Config, paths: Artifacts) -> dict:
    """{"key": ..., "config_hash", "code_hash", "inputs": {...}, "upstream_runs": {...}}."""
    inputs = input_hashes(stage, config, paths)
    upstream_runs = {}
    for up in UPSTREAM[stage]:
        marker = read_marker(up, paths)
        if marker:
            upstream_runs[up] = marker.get("mlflow_run_id", "")
    parts = {"stage": stage, "config": config_hash(stage, config), "code": code_hash(stage),
             "inputs": inputs}
    key = sha256_bytes(json.dumps(parts, sort_keys=True).encode())[:16] if inputs is not None else None
    return {"key": key, "config_hash": parts["config"], "code_hash": parts["code"],
            "inputs": inputs or {}, "upstream_runs": upstream_runs}


def read_marker(stage: str, paths: Artifacts) -> dict | None:
    marker = marker_path(stage, paths)
    try:
        return json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def write_marker(stage: str, paths: Artifacts, fp: dict, run_id: str) -> None:
    artifacts.write_text_atomic(marker_path(stage, paths),
                                json.dumps({**fp, "mlflow_run_id": run_id}, indent=2))


def is_current(stage: str, paths: Artifacts, fp: dict) -> dict | None:
    """The marker if the stage's output is complete and was made from exactly these inputs."""
    marker = read_marker(stage, paths)
    if not marker or fp["key"] is None or marker.get("key") != fp["key"]:
        return None
    if stage == "pretrain" and not (paths.model_keras.exists() and paths.pretrain_eval.exists()):
        return None
    return marker


def tags(stage: str, fp: dict) -> dict:
    """MLflow tags recording where a stage's output came from."""
    out = {"lineage.config_hash": fp["config_hash"], "lineage.code_hash": fp["code_hash"],
           "lineage.key": fp["key"] or ""}
    out.update({f"lineage.input.{name}": str(value) for name, value in fp["inputs"].items()})
    out.update({f"lineage.upstream.{name}": run for name, run in fp["upstream_runs"].items()})
    return out
