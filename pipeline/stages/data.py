"""Stage `data`: corpus + vocab → MLM + NSP/SOP TFRecords (Beam job `beam_jobs.pretraining_data`).

Runs the Beam job once for the training documents and once for the held-out
documents, into a temporary directory that replaces <run_dir>/data only when
both are complete, then writes <run_dir>/data/stats.json (both splits' stats
and the settings the records were made with; the pretrain stage checks them).
With `data.remote_dir` (a URL, for workers on other machines) the job reads copies of the
corpus and vocab below it and writes there; its outputs are copied back into the temporary
directory (pipeline/remote_dir.py). While a split's job runs on this machine, a progress bar
or plain lines say how much of its text has become instances (pipeline/beam_progress.py).

Layout: one phase (the default) writes data/{train,eval}-*.tfrecord; with
`data.phases` (e.g. ["128/20", "512/80"]) each phase has its own folder,
data/phase1/, data/phase2/, … with the same files, from one reading of the corpus.
stats.json then holds `phases`: [{"name", "dir", "max_seq_length",
"max_predictions_per_seq", "train", "eval"}, …], and its `settings` describe phase 1.

MLflow (child run `data`): every number of the stats as a metric (nested ones
flattened: `train_length_histogram.1-16`, `train_skipped.empty_documents`;
phases after the first prefixed `phase2.`), stats.json as an artifact (the settings
are the config's `data.*` params, logged by the tracking module).
"""

from __future__ import annotations

import json
import logging

from beam_jobs import pretraining_data
from beam_jobs import vocab as vocab_job
from pipeline import artifacts, beam_progress, remote_dir
from pipeline import config as config_lib
from pipeline.artifacts import Artifacts
from pipeline.config import Config, data_job
from pipeline.tracking import outbox
from pipeline.tracking.runs import flat_metrics

log = logging.getLogger(__name__)


def run(config: Config) -> dict:
    paths = Artifacts(config.run_dir)
    artifacts.require(paths.corpus_manifest, "the prepared corpus", "corpus")
    artifacts.require(paths.vocab_file, "the vocab", "vocab")
    vocab_job.check_vocab(str(paths.vocab_file))
    dc = config.data
    phases = config_lib.data_phases(config)
    settings = {**data_job.instance_settings(config), "group_size_mb": dc.group_size_mb,
                "lowercase": config.vocab.lowercase, "vocab_file": str(paths.vocab_file)}
    stats: dict = {"settings": settings}
    if dc.phases:
        stats["phases"] = [{"name": f"phase{i + 1}", "dir": f"phase{i + 1}",
                            "max_seq_length": seq, "max_predictions_per_seq": pred}
                           for i, (seq, pred) in enumerate(phases)]
    remote_dir.check(config)
    with artifacts.atomic_dir(paths.data_dir) as tmp, remote_dir.Staging(config, "data") as stage:
        vocab_file = stage.file(paths.vocab_file, "vocab/vocab.txt")
        output = stage.output(tmp, "data")
        for split in ("train", "eval"):
            if not paths.corpus_files(split):
                raise artifacts.MissingArtifact(
                    f"no {split} text in {paths.corpus_dir / split}; run `make corpus` again")
            corpus = stage.files(paths.corpus_files(split), paths.corpus_glob(split),
                                 f"corpus/{split}")
            size = paths.corpus_bytes(split)
            if data_job.runs_directly(config):
                log.info(f"data: {split} split, {size / 1e6:.1f} MB of text, "
                         f"{data_job.workers(config, size)} Beam worker process(es)")
            # A bar or plain lines while the documents become instances, when the workers
            # are local (pipeline/beam_progress.py).
            with beam_progress.watch(f"data: {split} split", size, data_job.runs_locally(config),
                                     measure="done") as progress_dir:
                result = pretraining_data.run(data_job.job_args(
                    config, corpus, vocab_file, output, split, size, progress_dir))
            per_phase = result["phases"] if dc.phases else [result]
            for i, phase_stats in enumerate(per_phase):
                if not phase_stats["instances"]:
                    raise ValueError(
                        f"the {split} split produced no instances ({phase_stats.get('skipped')}); "
                        f"the corpus is too small for max_seq_length = "
                        f"{phase_stats['settings']['max_seq_length']}")
                if dc.phases:
                    stats["phases"][i][split] = phase_stats
            stats[split] = per_phase[0]
        stage.download(output, tmp)
        # Every shard's records, bytes and sha256, for the record (checksums.json, below,
        # lists them again with every other file: that is what is verified before use).
        stats["shards"] = artifacts.checksum_entries(tmp, suffix=".tfrecord")
        (tmp / paths.data_stats.name).write_text(json.dumps(stats, indent=2))
        # Last: every shard's bytes, sha256 and record count, verified before any use.
        stats["files"] = artifacts.write_checksums(tmp)
    train, held = stats["train"], stats["eval"]
    pair = "one segment each (MLM only)"
    if dc.objective == "nsp":
        pair = f"NSP random {train['nsp_random_fraction']:.3f}"
    elif dc.objective == "sop":
        pair = f"SOP swapped {train['sop_swapped_fraction']:.3f}"
    masks = (f"masked fraction {train['masked_fraction']:.3f}" if dc.masking == "static"
             else "unmasked (dynamic masking in tf.data)")
    where = (paths.data_dir if not dc.phases
             else f"{paths.data_dir}/phase1..{len(phases)}")
    log.info(f"data: {train['instances']:,} training / {held['instances']:,} held-out instances, "
             f"{masks}, {pair} -> {where}")
    log_to_mlflow(stats, paths)
    return stats


def log_to_mlflow(stats: dict, paths: Artifacts) -> None:
    metrics = {}
    for split in ("train", "eval"):
        metrics.update(flat_metrics(stats[split], f"{split}_"))
    for phase in stats.get("phases", [])[1:]:
        for split in ("train", "eval"):
            metrics.update(flat_metrics(phase[split], f"{phase['name']}.{split}_"))
    outbox.log_metrics(metrics)  # kept if the tracking store is down
    outbox.log_artifact(paths.data_stats, "data")
