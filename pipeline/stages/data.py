"""Stage `data`: corpus + vocab → masked MLM/NSP TFRecords (Beam job `beam_jobs.pretraining_data`).

Runs the Beam job once for the training documents and once for the held-out
documents, into a temporary directory that replaces <run_dir>/data only when
both are complete, then writes <run_dir>/data/stats.json (both splits' stats
and the settings the records were made with; the pretrain stage checks them).
"""

from __future__ import annotations

import json

import mlflow

from beam_jobs import pretraining_data
from beam_jobs import vocab as vocab_job
from pipeline import artifacts
from pipeline.artifacts import Artifacts
from pipeline.config import Config


def run(config: Config, log=print) -> dict:
    paths = Artifacts(config.run_dir)
    artifacts.require(paths.corpus_manifest, "the prepared corpus", "corpus")
    artifacts.require(paths.vocab_file, "the vocab", "vocab")
    vocab_job.check_vocab(str(paths.vocab_file))
    dc = config.data
    stats = {"settings": {
        "max_seq_length": dc.max_seq_length,
        "max_predictions_per_seq": dc.max_predictions_per_seq,
        "masked_lm_prob": dc.masked_lm_prob,
        "short_seq_prob": dc.short_seq_prob,
        "dupe_factor": dc.dupe_factor,
        "seed": dc.seed,
        "lowercase": config.vocab.lowercase,
        "vocab_file": str(paths.vocab_file),
    }}
    with artifacts.atomic_dir(paths.data_dir) as tmp:
        for split in ("train", "eval"):
            if not paths.corpus_files(split):
                raise artifacts.MissingArtifact(
                    f"no {split} text in {paths.corpus_dir / split}; run `make corpus` again")
            stats[split] = pretraining_data.run([
                "--input", paths.corpus_glob(split),
                "--output_dir", str(tmp),
                "--split", split,
                "--vocab_file", str(paths.vocab_file),
                "--lowercase", str(config.vocab.lowercase).lower(),
                "--max_seq_length", str(dc.max_seq_length),
                "--max_predictions_per_seq", str(dc.max_predictions_per_seq),
                "--masked_lm_prob", str(dc.masked_lm_prob),
                "--short_seq_prob", str(dc.short_seq_prob),
                "--dupe_factor", str(dc.dupe_factor),
                # The held-out split gets its own seed so its masks differ from training's.
                "--seed", str(dc.seed if split == "train" else dc.seed + 1),
                "--num_shards", str(dc.num_shards if split == "train" else 1),
                "--docs_per_group", str(dc.docs_per_group),
                *dc.beam_args,
            ])
            if not stats[split]["instances"]:
                raise ValueError(
                    f"the {split} split produced no instances ({stats[split].get('skipped')}); "
                    f"the corpus is too small for data.max_seq_length = {dc.max_seq_length}")
        (tmp / paths.data_stats.name).write_text(json.dumps(stats, indent=2))
    train, held = stats["train"], stats["eval"]
    log(f"data: {train['instances']:,} training / {held['instances']:,} held-out instances, "
        f"masked fraction {train['masked_fraction']:.3f}, NSP random {train['nsp_random_fraction']:.3f}"
        f" -> {paths.data_dir}")
    if mlflow.active_run():
        for split in ("train", "eval"):
            mlflow.log_metrics({f"{split}_{key}": value for key, value in stats[split].items()
                                if isinstance(value, (int, float)) and not isinstance(value, bool)})
        mlflow.log_artifact(str(paths.data_stats), "data")
    return stats
