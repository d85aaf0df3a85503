#!/usr/bin/env bash
# Runs the pipeline once, non-interactively, for cron / systemd / Kubernetes / Airflow.
#   STAGES   cycle (the default): the scheduled loop, `bert-pipeline cycle` (docs/scheduling.md):
#            the text new in cycle.incoming -> continued pretraining -> each task fine-tuned ->
#            evaluated against the champion -> registered -> promoted if better; arguments after
#            the script's name pick one step (--step pretrain | finetune [--task NAME] |
#            evaluate | promote, as the Airflow DAG does).
#            Or pipeline stages ("all", "corpus vocab", ...): those stages with --scheduled.
#   CONFIG   config file or shipped config name (default configs/nightly.yaml for the cycle,
#            configs/pretrain_tiny.yaml for stages)
#   ARGS     overrides, e.g. ARGS="train.steps=200 data.beam_args=[...]"; arguments after the
#            script's name are passed on too
# Exit codes: 0 ran, 1 failed, 2 bad input, 3 nothing to do (cycle: no new text since the last
# cycle; stages: every stage up to date), 4 already running (another run holds the lock),
# 5 out of disk space. `make cycle` / `make scheduled` cannot pass 3 and 4 through (make turns a
# failing command into its own exit 2): schedulers call this script. Output goes to
# stdout/stderr and to <run_dir>/logs/<time>-<pid>*.log.
# Nothing is installed at start when the project is already set up (a container image, or a
# checkout after `make setup`); only a bare checkout runs `make setup` (network) first.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then
  PYTHON=.venv/bin/python
elif command -v bert-pipeline >/dev/null && ! [ -f Makefile ]; then
  PYTHON=""  # an installed package (the container image): its command
else
  make --no-print-directory setup >/dev/null || exit 1
  PYTHON=.venv/bin/python
fi
STAGES=${STAGES:-cycle}
# shellcheck disable=SC2086 # STAGES and ARGS are word lists
if [ "$STAGES" = cycle ]; then
  set -- cycle --config "${CONFIG:-configs/nightly.yaml}" ${ARGS:-} "$@"
else
  set -- ${STAGES} --scheduled --config "${CONFIG:-configs/pretrain_tiny.yaml}" ${ARGS:-} "$@"
fi
if [ -n "$PYTHON" ]; then
  exec "$PYTHON" -m pipeline "$@"
fi
exec bert-pipeline "$@"
