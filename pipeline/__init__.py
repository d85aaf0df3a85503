"""The pipeline: stages (pipeline/stages/) and the libraries they call, by role.

MLflow 3 sends usage telemetry to its maintainers' service by default, from a thread that is
joined when the process exits (about a second per invocation here, and a request that cannot
succeed on a machine without internet). The pipeline turns it off unless the user has chosen:
MLFLOW_DISABLE_TELEMETRY=false in the environment turns it back on.

TensorFlow runs its CPU matmuls on oneDNN by default only where the CPU has AVX512_VNNI,
AVX512_BF16 or AMX; elsewhere (AVX2-only CPUs) on Eigen, whose float32 matmuls at BERT's
shapes were ~1.4x slower (BERT-small's train step: 728 vs 1,048 tokens/s on a 2-core AVX2
EPYC, docs/benchmarks.md). TensorFlow reads the switch once, when it loads, so it is set here,
before anything imports it: TF_ENABLE_ONEDNN_OPTS=0 in the environment keeps Eigen.
"""

import os

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
# A quiet console (pipeline/logs.py): MLflow's records go through `logging` like every other
# library's (to the log files; its warnings also to the console) instead of a handler of its
# own on stderr, and reading an artifact back draws no "Downloading artifacts" bar. Either,
# set in the environment, wins.
os.environ.setdefault("MLFLOW_CONFIGURE_LOGGING", "false")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

# The built-in fine-tuning tasks register themselves in the config layer's task registry
# (pipeline/config/task_registry.py: the `finetune.task` values a config may name) when their
# package is imported: here, so that every way in (the CLI, a stage, a test, a notebook)
# validates configs against them. Light: the task modules import TensorFlow and Keras only inside their methods.
import pipeline.finetuning.tasks  # noqa: F401
