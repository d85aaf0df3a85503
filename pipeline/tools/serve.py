"""`python -m pipeline serve` / `make serve`: a registered fine-tuned model over HTTP (MLflow's
scoring server), the champion by default.

    python -m pipeline serve --model models:/bert-brown-genre@champion [--port 5001]
    curl -s http://127.0.0.1:5001/invocations -H 'Content-Type: application/json' \\
        -d '{"dataframe_records": [{"text": "The jury said the election was fair."}]}'

It checks that the model resolves in the tracking store (one line and exit 2 if not: which
store, which name, what to run), then runs `mlflow models serve --env-manager local` with this
interpreter's bin folder first on PATH (MLflow starts `uvicorn` by name: from a venv that is not
activated it would not be found). Loopback by default; the answer is the model's DataFrame as
JSON ({"predictions": [{"label": ..., "score_<label>": ...}]}), what `make predict` prints.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

log = logging.getLogger(__name__)


def command(model: str, host: str, port: int, workers: int) -> list[str]:
    """The scoring server's command line (this interpreter's mlflow)."""
    return [sys.executable, "-m", "mlflow", "models", "serve", "-m", model,
            "--env-manager", "local", "--host", host, "--port", str(port),
            "--workers", str(workers)]


def environment(tracking_uri: str) -> dict:
    """The server's environment: the store, and this interpreter's bin folder first on PATH."""
    env = dict(os.environ)
    env["MLFLOW_TRACKING_URI"] = tracking_uri
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def build_parser() -> argparse.ArgumentParser:
    """serve's parser (docs/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(prog="python -m pipeline serve",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--model", default="models:/bert-brown-genre@champion",
                        help="models:/NAME@ALIAS or models:/NAME/VERSION (the MLflow registry)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="where it listens (loopback by default)")
    parser.add_argument("--port", type=int, default=5001)
    parser.add_argument("--workers", type=int, default=1, help="the scoring server's processes")
    parser.add_argument("--tracking-uri", default="",
                        help="the MLflow store (default: $MLFLOW_TRACKING_URI, else the run "
                             "root's mlflow.db)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="every library's INFO lines too (MLflow) on stderr")
    return parser


def main(argv=None) -> int:
    from pipeline.tools import parse

    args = parse(build_parser(), argv, "serve")

    import mlflow

    from pipeline import artifacts

    uri = (args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
           or f"sqlite:///{artifacts.MLFLOW_DB}")
    if not args.model.startswith("models:/"):
        print(f"error: --model {args.model!r} is not a registry URI; give models:/NAME@ALIAS "
              f"(e.g. models:/bert-brown-genre@champion) or models:/NAME/VERSION",
              file=sys.stderr)
        return 2
    try:
        mlflow.set_tracking_uri(uri)
        source = mlflow.MlflowClient().get_model_version_download_uri(
            *_name_and_version(args.model, mlflow.MlflowClient()))
    except (mlflow.exceptions.MlflowException, ValueError) as err:
        print(f"error: {args.model} is not in the store {uri} ({str(err).splitlines()[0][:160]});"
              f" fine-tune and register a model first (make finetune), or pass "
              f"--tracking-uri", file=sys.stderr)
        return 2
    log.info(f"serve: {args.model} ({source}) on http://{args.host}:{args.port}/invocations "
             f"(POST {{\"dataframe_records\": [{{\"text\": \"...\"}}]}}; GET /ping)")
    sys.stdout.flush()
    os.execve(sys.executable, command(args.model, args.host, args.port, args.workers),
              environment(uri))
    return 0  # not reached


def _name_and_version(model: str, client) -> tuple[str, str]:
    """(name, version) of models:/NAME@ALIAS or models:/NAME/VERSION."""
    path = model[len("models:/"):]
    if "@" in path:
        name, alias = path.split("@", 1)
        return name, str(client.get_model_version_by_alias(name, alias).version)
    name, _, version = path.partition("/")
    if not version.isdigit():
        raise ValueError(f"no version or alias in {model!r}")
    return name, version
