#!/usr/bin/env bash
# Runs the pipeline once, non-interactively, for cron / systemd / Kubernetes / Airflow.
#   CONFIG   config file (default configs/pretrain_tiny.yaml)
#   STAGES   stages to run (default "all")
# Exit codes (from `python -m pipeline --scheduled`): 0 ran, 1 failed, 2 bad input,
# 3 nothing to do (every stage up to date), 4 already running (another run holds the lock).
# Output goes to stdout/stderr and to <run_dir>/logs/<time>-<pid>.log.
set -uo pipefail
cd "$(dirname "$0")/.."
make --no-print-directory setup >/dev/null || exit 1
.venv/bin/python -m pipeline ${STAGES:-all} --scheduled --config "${CONFIG:-configs/pretrain_tiny.yaml}" "$@"
