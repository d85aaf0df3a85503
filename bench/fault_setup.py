"""The tiny pipeline the fault suite runs (bench/fault_suite.py, and its team-server cases in
bench/fault_server.py): the suite's stages, the pipeline stage each one runs, the settings
(configs/test_tiny.yaml with these overrides: 24 pretraining steps, a checkpoint every 4) and
the generated inputs (a Google-format corpus, a labelled CSV).
"""

from __future__ import annotations

import random
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

STAGES = ("corpus", "vocab", "data", "pretrain", "export", "finetune", "finetune_resume")
# The team server's cases (bench/fault_server.py): concurrent jobs, the server / PostgreSQL killed.
SERVER_CASES = ("server_concurrent", "server_restart", "postgres_restart")
# The pipeline stage a suite stage runs.
COMMAND = {"export": "pretrain", "finetune_resume": "finetune"}
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
            "finetune.register_model=false", "finetune.checkpoint_every=4"]


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
