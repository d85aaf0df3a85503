"""The tiny pipeline the fault suite runs (bench/fault_suite.py, and its team-server cases in
bench/fault_server.py): the suite's stages, the pipeline stage each one runs, the settings
(configs/test_tiny.yaml with these overrides: 24 pretraining steps, a checkpoint every 4) and
the generated inputs (a Google-format corpus, a labelled CSV, a tagged CoNLL file).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

STAGES = ("corpus", "vocab", "data", "pretrain", "export", "finetune", "finetune_resume",
          "multitask", "distill")
# The team server's cases (bench/fault_server.py): concurrent jobs, the server / PostgreSQL killed.
SERVER_CASES = ("server_concurrent", "server_restart", "postgres_restart")
# The pipeline stage a suite stage runs.
COMMAND = {"export": "pretrain", "finetune_resume": "finetune"}
# Where the fine-tuning stages write their checkpoints while they train, by suite stage.
CHECKPOINTS = {"finetune": "finetune/.checkpoints/topic",
               "finetune_resume": "finetune/.checkpoints/topic",
               "multitask": "multitask/.checkpoints/multitask/mixed",
               "distill": "distill/.checkpoints/student"}
# The output folder of a fine-tuning stage, by pipeline stage.
OUTPUT = {"finetune": "finetune/topic", "multitask": "multitask/multitask",
          "distill": "distill/student"}
# The suite stages killed at a checkpoint, with the label their "resuming from" line begins with.
STAGE_LABEL = {"finetune_resume": "finetune", "multitask": "multitask", "distill": "distill"}
STEPS, CHECKPOINT_EVERY = 24, 4


def overrides(top: Path) -> list[str]:
    """The tiny pipeline's settings, its run directory and store inside `top`."""
    root = top / "root"
    return [f"run_dir={root / 'run'}", f"corpus.path={top / 'raw'}/*.txt",
            f"tracking.tracking_uri=sqlite:///{root / 'mlflow.db'}", "tracking.experiment=faults",
            f"train.steps={STEPS}", f"train.checkpoint_every={CHECKPOINT_EVERY}",
            "train.log_every=1", "train.peak_flops_seconds=0",
            "finetune.dataset=csv", f"finetune.train_file={top / 'labelled.csv'}",
            "finetune.name=topic", "finetune.max_seq_length=24", "finetune.batch_size=8",
            "finetune.epochs=2", "finetune.learning_rate=0.001", "finetune.baselines=false",
            "finetune.register_model=false", "finetune.checkpoint_every=4",
            # multi-task: the labelled CSV and a tagging task (write_inputs), 24 updates
            f"multitask.tasks={json.dumps(multitask_tasks(top))}", "multitask.steps=24",
            "multitask.compare_single_task=false",
            # distillation: the finetune stage's model as the teacher, 2 epochs of 8 updates
            f"distill.teacher={root / 'run' / 'finetune' / 'topic'}", "distill.name=student",
            "distill.num_layers=1", "distill.batch_size=8", "distill.epochs=2"]


def multitask_tasks(top: Path) -> list[dict]:
    return [{"name": "topic", "task": "classification", "dataset": "csv",
             "train_file": str(top / "labelled.csv")},
            {"name": "tags", "task": "token_classification", "dataset": "conll",
             "train_file": str(top / "tags.conll"), "max_seq_length": 16}]


WORDS = (  # noqa: SIM905 (the words of the generated corpus: one string reads better)
    "the cat dog bird sat ran flew over under near a big small red blue green house tree "
    "river hill road quickly slowly saw heard found kept old new happy sad garden window "
    "morning evening children teacher farmer city village letter story music").split()


def write_inputs(top: Path, documents: int = 120, seed: int = 0) -> None:
    """A Google-format corpus (two files) and a labelled CSV (animal / place sentences)."""
    rng = random.Random(seed)
    raw = top / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    docs = []
    for d in range(documents):
        sentences = [" ".join([WORDS[d % len(WORDS)]] + [rng.choice(WORDS) for _ in
                                                         range(rng.randint(5, 14))]
                              ).capitalize() + "." for _ in range(rng.randint(3, 12))]
        docs.append("\n".join(sentences))
    for f in range(2):
        (raw / f"part-{f}.txt").write_text("\n\n".join(docs[f::2]) + "\n", encoding="utf-8")
    rows = ["text,label"]
    for i in range(80):
        topic = ["cat", "dog", "bird"] if i % 2 else ["house", "tree", "river", "hill", "city"]
        words = [rng.choice(topic)] + [rng.choice(WORDS[:12]) for _ in range(rng.randint(2, 5))]
        rng.shuffle(words)
        rows.append(f"{' '.join(words).capitalize()}.,{'animal' if i % 2 else 'place'}")
    (top / "labelled.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    tagged = []  # CoNLL: animals ANI, places LOC, the rest O
    for _ in range(40):
        for word in [rng.choice(WORDS[:20]) for _ in range(rng.randint(3, 6))]:
            tag = "ANI" if word in ("cat", "dog", "bird") else (
                "LOC" if word in ("house", "tree", "river", "hill", "city") else "O")
            tagged.append(f"{word} {tag}")
        tagged.append("")
    (top / "tags.conll").write_text("\n".join(tagged) + "\n", encoding="utf-8")
