"""`make server` / `python -m pipeline server start|stop|status`: an MLflow tracking server for a
team on this machine (docs/team-server.md).

    python -m pipeline server start [--dir runs/server] [--host 127.0.0.1] [--port 5000]
    python -m pipeline server status [--dir ...]     exit 0 answering, 3 not running
    python -m pipeline server stop [--dir ...]

What `start` runs (docs/team-server.md):
- PostgreSQL: without DATABASE_URL, a cluster of its own in <dir>/postgres/ (made once: initdb
  into `data.partial`, the role `mlflow` and databases `mlflow`, `mlflow_auth` created in
  single-user mode, then renamed to `data`), on 127.0.0.1 only, a free port, no Unix socket,
  SCRAM password logins; as root it runs as the `postgres` system user (initdb and postgres
  refuse root). DATABASE_URL=postgresql://... uses an existing database instead (the users:
  AUTH_DATABASE_URL, else <dir>/basic_auth.db).
- `mlflow server --app-name basic-auth` on --host (127.0.0.1 unless told otherwise), artifacts
  uploaded to and served by it (<dir>/artifacts or ARTIFACTS_DESTINATION). Arguments `start`
  does not know go to `mlflow server` (e.g. --allowed-hosts).

No secret is in a command line, a config file, a log or the console: the admin password is
MLFLOW_AUTH_ADMIN_PASSWORD or <dir>/admin_password (random, mode 600, made when absent; MLflow
uses it only when it creates the admin user), the database password is in <dir>/pgpass (libpq's
PGPASSFILE: no database URL holds it), the form-signing key MLFLOW_FLASK_SERVER_SECRET_KEY or
<dir>/secret_key. Clients need only MLFLOW_TRACKING_URI, MLFLOW_TRACKING_USERNAME and
MLFLOW_TRACKING_PASSWORD. `stop` ends what `start` started: the server's process group (pid in
<dir>/mlflow.pid) and the cluster, if it made one. Bad input: one line, exit 2.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import hmac
import json
import logging
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from pipeline import artifacts, tools

log = logging.getLogger(__name__)

DEFAULT_DIR = "runs/server"
ADMIN = "admin"
DB_ROLE = "mlflow"
DATABASES = ("mlflow", "mlflow_auth")  # runs and the model registry; users and permissions
PERMISSIONS = ("READ", "EDIT", "MANAGE", "NO_PERMISSIONS")
NOT_RUNNING = 3  # `status`, as LSB init scripts say it
DRIVER = "postgresql+psycopg2"  # requirements.lock: psycopg2-binary


class ServerError(Exception):
    """Bad input or a server that cannot start: its message is the one line the user sees."""


class Layout:
    """Every path under the server's folder."""

    def __init__(self, folder):
        self.dir = Path(folder).expanduser().resolve()
        self.admin_password = self.dir / "admin_password"
        self.secret_key = self.dir / "secret_key"
        self.pgpass = self.dir / "pgpass"
        self.auth_ini = self.dir / "basic_auth.ini"
        self.state = self.dir / "server.json"
        self.pid = self.dir / "mlflow.pid"
        self.log = self.dir / "server.log"
        self.lock = self.dir / ".lock"
        self.artifacts = self.dir / "artifacts"
        self.pg = self.dir / "postgres"           # owned by the cluster's system user
        self.pgdata = self.pg / "data"
        self.pglog = self.pg / "postgres.log"


# ---------------------------------------------------------------------------
# Secrets: files of mode 600, written aside and moved into place; never printed.
# ---------------------------------------------------------------------------
def _write_secret(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


def _secret(path: Path, variable: str, what: str, minimum: int = 12) -> str:
    """$variable if set, else the file's contents (made with a random value if absent)."""
    value = os.environ.get(variable)
    if value is None:
        if not path.exists():
            _write_secret(path, secrets.token_urlsafe(24) + "\n")
        if path.stat().st_mode & 0o077:
            raise ServerError(f"{path} ({what}) can be read by other users: chmod 600 {path}")
        value = path.read_text().strip()
    if len(value) < minimum:
        raise ServerError(f"the {what} ({'$' + variable if variable in os.environ else path}) "
                          f"is shorter than {minimum} characters: set a longer one")
    return value


def scram_verifier(password: str, iterations: int = 4096) -> str:
    """PostgreSQL's stored form of a SCRAM-SHA-256 password (RFC 5802/7677): CREATE ROLE takes it
    as is, so the password itself never reaches the database, its log or a command line."""
    salt = secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    stored = hashlib.sha256(hmac.new(salted, b"Client Key", "sha256").digest()).digest()
    server = hmac.new(salted, b"Server Key", "sha256").digest()
    salt, stored, server = (base64.b64encode(b).decode() for b in (salt, stored, server))
    return f"SCRAM-SHA-256${iterations}:{salt}${stored}:{server}"


def _pgpass_field(text: str) -> str:
    return text.replace("\\", "\\\\").replace(":", "\\:")


# ---------------------------------------------------------------------------
# The backend store: a cluster of our own, or DATABASE_URL.
# ---------------------------------------------------------------------------
def pg_bin() -> Path | None:
    """The folder of the PostgreSQL server binaries (pg_ctl, initdb, postgres), or None."""
    found = shutil.which("pg_ctl")
    candidates = [Path(found).resolve().parent] if found else []
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True,
                         key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    return next((folder for folder in candidates if all(
        (folder / name).is_file() for name in ("pg_ctl", "initdb", "postgres"))), None)


def _cluster_user() -> str | None:
    """The system user the cluster runs as: `postgres` when we are root, else None (ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise ServerError("running as root, but there is no `postgres` system user to run the "
                          "cluster as (initdb and postgres refuse root): install the Debian "
                          "package postgresql, or run as another user, or set DATABASE_URL") from None
    return "postgres"


def _as_cluster_user(command: list, user: str | None, **kwargs) -> subprocess.CompletedProcess:
    prefix = ["runuser", "-u", user, "--"] if user else []
    return subprocess.run(prefix + [str(c) for c in command], capture_output=True, text=True,
                          check=False, **kwargs)


def _make_cluster(layout: Layout, binaries: Path, user: str | None) -> None:
    """initdb into postgres/data.partial, the role and databases in single-user mode (the
    role's password as its SCRAM verifier), then the rename that makes it `data`."""
    layout.pg.mkdir(mode=0o700, exist_ok=True)
    if user:
        shutil.chown(layout.pg, user, user)
    if _as_cluster_user(["test", "-w", layout.pg], user).returncode != 0:
        raise ServerError(f"the {user} system user cannot write {layout.pg} (the cluster runs as "
                          f"it: initdb refuses root): make the folders above it searchable "
                          f"(chmod o+x) or choose another SERVER_DIR, e.g. /srv/mlflow")
    partial = layout.pg / "data.partial"
    if partial.exists():  # a killed start's
        shutil.rmtree(partial)
    done = _as_cluster_user([binaries / "initdb", "-D", partial, "--auth-local=peer",
                             "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8"], user)
    if done.returncode != 0:
        raise ServerError(f"initdb failed in {partial}: {_last_line(done.stderr + done.stdout)}")
    with open(partial / "postgresql.conf", "a") as conf:  # settings of `make server`'s cluster
        conf.write("\n# make server\nlisten_addresses = '127.0.0.1'\n"
                   "unix_socket_directories = ''\npassword_encryption = 'scram-sha-256'\n")
    password = secrets.token_urlsafe(24)
    sql = (f"CREATE ROLE {DB_ROLE} LOGIN PASSWORD '{scram_verifier(password)}';\n"
           + "".join(f"CREATE DATABASE {db} OWNER {DB_ROLE};\n" for db in DATABASES))
    done = _as_cluster_user([binaries / "postgres", "--single", "-D", partial, "postgres"], user,
                            input=sql)
    if done.returncode != 0 or "ERROR:" in done.stdout + done.stderr:
        raise ServerError(f"creating the mlflow role and databases in {partial} failed: "
                          f"{_last_line(done.stdout + done.stderr)}")
    _write_secret(layout.pgpass, f"127.0.0.1:*:*:{DB_ROLE}:{_pgpass_field(password)}\n")
    partial.rename(layout.pgdata)


def _pg_running_port(layout: Layout) -> int | None:
    """The port of the cluster's postmaster if it runs (postmaster.pid: pid, dir, start, port)."""
    try:
        lines = (layout.pgdata / "postmaster.pid").read_text().splitlines()
        os.kill(int(lines[0]), 0)
        return int(lines[3])
    except (OSError, ValueError, IndexError):
        return None


def start_cluster(layout: Layout, state: dict) -> int:
    """Makes the cluster if needed and starts it; returns its port."""
    binaries = pg_bin()
    if binaries is None:
        raise ServerError("the PostgreSQL server binaries (pg_ctl, initdb) are not installed: "
                          "`make test-setup` installs them (apt-get install postgresql), or "
                          "set DATABASE_URL=postgresql://user@host:port/db to use an existing "
                          "database")
    user = _cluster_user()
    if not layout.pgdata.exists():
        _make_cluster(layout, binaries, user)
    port = _pg_running_port(layout)
    if port:
        return port
    port = state.get("pg_port") or 0
    port = port if port and _port_free("127.0.0.1", port) else free_port()
    done = _as_cluster_user([binaries / "pg_ctl", "-D", layout.pgdata, "-l", layout.pglog,
                             "-o", f"-p {port}", "-w", "-t", "60", "start"], user)
    if done.returncode != 0:
        raise ServerError(f"PostgreSQL did not start ({_last_line(done.stdout + done.stderr)}); "
                          f"its log: {layout.pglog}")
    return port


def stop_cluster(layout: Layout) -> bool:
    binaries = pg_bin()
    if binaries is None or _pg_running_port(layout) is None:
        return False
    done = _as_cluster_user([binaries / "pg_ctl", "-D", layout.pgdata, "-m", "fast", "-w",
                             "-t", "60", "stop"], _cluster_user())
    return done.returncode == 0


def external_database(url: str, layout: Layout) -> str:
    """DATABASE_URL without its password (which goes to <dir>/pgpass instead)."""
    parts = urllib.parse.urlsplit(url)
    if not parts.scheme.startswith(("postgresql", "postgres")) or not parts.hostname:
        raise ServerError("DATABASE_URL must look like postgresql://USER[:PASSWORD]@HOST[:PORT]/"
                          "DATABASE (a PostgreSQL database the server may create tables in)")
    # SQLAlchemy 2.1 takes postgresql:// for psycopg 3; the driver installed is psycopg2.
    scheme = DRIVER if parts.scheme in ("postgres", "postgresql") else parts.scheme
    if parts.password is None:
        return urllib.parse.urlunsplit((scheme, *parts[1:]))
    user, password = urllib.parse.unquote(parts.username or ""), urllib.parse.unquote(parts.password)
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    netloc = f"{parts.username}@{host}" + (f":{parts.port}" if parts.port else "")
    database = parts.path.lstrip("/") or "*"
    line = ":".join(_pgpass_field(str(f)) for f in (parts.hostname, parts.port or 5432,
                                                     database, user, password))
    old = layout.pgpass.read_text().splitlines() if layout.pgpass.exists() else []
    _write_secret(layout.pgpass, "\n".join([line] + [ln for ln in old if ln != line]) + "\n")
    return urllib.parse.urlunsplit((scheme, netloc, parts.path, parts.query, parts.fragment))


# ---------------------------------------------------------------------------
# The MLflow server.
# ---------------------------------------------------------------------------
def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _port_free(host: str, port: int) -> bool:
    """True unless something listens on host:port (closed connections' TIME_WAIT do not count:
    the server binds with SO_REUSEADDR too)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


def _alive(pid: int) -> bool:
    """True if `pid` runs and is an `mlflow server` (not a pid the system gave to another)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(b"mlflow" in part for part in cmdline[:2]) and b"server" in cmdline


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _server_pid(layout: Layout) -> int | None:
    try:
        pid = int(layout.pid.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def _request(url: str, auth: tuple[str, str] | None = None, timeout: float = 5) -> int:
    """The HTTP status of GET url (0: no answer)."""
    request = urllib.request.Request(url)
    if auth:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


@contextlib.contextmanager
def _locked(layout: Layout):
    """One start/stop at a time per server folder."""
    with open(layout.lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def start(folder=DEFAULT_DIR, host: str = "127.0.0.1", port: int = 5000, workers: int = 2,
          database_url: str | None = None, extra_args: tuple = (), timeout: float = 180) -> dict:
    """Starts PostgreSQL (unless `database_url`) and the MLflow server with basic auth; returns
    the server's state (url, pids, ports; no secrets). Already running: its state."""
    layout = Layout(folder)
    layout.dir.mkdir(parents=True, exist_ok=True)
    os.chmod(layout.dir, 0o711)  # others may pass through to postgres/, not list the secrets
    with _locked(layout):
        state = _read_json(layout.state)
        if _server_pid(layout):
            log.info(f"server: already running at {state.get('url')} (pid {state.get('pid')})")
            return state
        if port and not _port_free(host, port):
            raise ServerError(f"port {port} on {host} is in use: stop what uses it or choose "
                              f"another (make server PORT=5001)")
        port = port or free_port(host)
        admin_password = _secret(layout.admin_password, "MLFLOW_AUTH_ADMIN_PASSWORD",
                                 "admin password")
        secret_key = _secret(layout.secret_key, "MLFLOW_FLASK_SERVER_SECRET_KEY",
                             "server secret key")
        default_permission = os.environ.get("DEFAULT_PERMISSION", "READ").upper()
        if default_permission not in PERMISSIONS:
            raise ServerError(f"DEFAULT_PERMISSION={default_permission} is not one of "
                              f"{', '.join(PERMISSIONS)}")
        cache_seconds = os.environ.get("AUTH_CACHE_SECONDS", "60")
        if not cache_seconds.isdigit():
            raise ServerError(f"AUTH_CACHE_SECONDS={cache_seconds} must be a whole number of "
                              f"seconds (0: check every password on every request)")
        database_url = database_url or os.environ.get("DATABASE_URL")
        if database_url:
            backend = external_database(database_url, layout)
            auth_url = os.environ.get("AUTH_DATABASE_URL")
            auth_db = (external_database(auth_url, layout) if auth_url
                       else f"sqlite:///{layout.dir / 'basic_auth.db'}")
            state = {"cluster": False}
        else:
            pg_port = start_cluster(layout, state)
            backend, auth_db = (f"{DRIVER}://{DB_ROLE}@127.0.0.1:{pg_port}/{db}"
                                for db in DATABASES)
            state = {"cluster": True, "pg_port": pg_port}  # recorded now: `stop` stops it
            artifacts.write_text_atomic(layout.state, json.dumps(state, indent=1))
        artifacts.write_text_atomic(layout.auth_ini, "\n".join([
            "[mlflow]", f"default_permission = {default_permission}",
            f"database_uri = {auth_db}", f"admin_username = {ADMIN}",
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth",
            # A checked password is remembered (keyed by an HMAC, in each worker's memory) for
            # this long: without it every logging call pays a scrypt hash (seconds under load).
            f"auth_cache_ttl_seconds = {cache_seconds}", ""]))
        destination = os.environ.get("ARTIFACTS_DESTINATION") or str(layout.artifacts)
        command = [str(Path(sys.executable).with_name("mlflow")), "server",
                   "--app-name", "basic-auth", "--backend-store-uri", backend,
                   "--serve-artifacts", "--artifacts-destination", destination,
                   "--host", host, "--port", str(port), "--workers", str(workers),
                   *extra_args]
        env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(layout.auth_ini),
               "MLFLOW_AUTH_ADMIN_PASSWORD": admin_password,
               "MLFLOW_FLASK_SERVER_SECRET_KEY": secret_key,
               "PGPASSFILE": str(layout.pgpass), "MLFLOW_DISABLE_TELEMETRY": "true",
               # MLflow's GenAI job runner (7 huey consumers) does nothing for this pipeline
               "MLFLOW_SERVER_ENABLE_JOB_EXECUTION":
                   os.environ.get("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")}
        for client_variable in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME",
                                "MLFLOW_TRACKING_PASSWORD", "DATABASE_URL", "AUTH_DATABASE_URL"):
            env.pop(client_variable, None)
        with open(layout.log, "a") as out:
            out.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(command)}\n")
            out.flush()
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    cwd=layout.dir)
        artifacts.write_text_atomic(layout.pid, f"{proc.pid}\n")
        url = f"http://{_client_host(host)}:{port}"
        state.update(url=url, host=host, port=port, pid=proc.pid, backend=backend,
                     auth_database=auth_db, artifacts=destination,
                     started=time.strftime("%Y-%m-%d %H:%M:%S"))
        artifacts.write_text_atomic(layout.state, json.dumps(state, indent=1))
        deadline = time.time() + timeout
        while _request(f"{url}/health") != 200:
            if proc.poll() is not None or time.time() > deadline:
                what = (f"exited ({proc.returncode})" if proc.poll() is not None
                        else f"did not answer in {timeout:.0f} s")
                _stop_locked(layout)
                raise ServerError(f"mlflow server {what}: {_last_line(layout.log.read_text())} "
                                  f"(whole log: {layout.log})")
            time.sleep(0.5)
        answer = 0
        while answer == 0 or answer >= 500:  # the first calls load the auth app: be patient
            answer = _request(f"{url}/api/2.0/mlflow/users/get?username={ADMIN}",
                              (ADMIN, admin_password), timeout=max(5.0, deadline - time.time()))
            if time.time() > deadline:
                break
        if answer != 200:
            _stop_locked(layout)
            source = ("$MLFLOW_AUTH_ADMIN_PASSWORD" if "MLFLOW_AUTH_ADMIN_PASSWORD" in os.environ
                      else str(layout.admin_password))
            raise ServerError(f"the server refuses {ADMIN} with the password from {source}: "
                              f"MLflow set {ADMIN}'s password when it first created the user "
                              f"and ignores this one; use that one (or change it with the auth "
                              f"API, docs/team-server.md)")
    return state


def _stop_locked(layout: Layout, level: int = logging.DEBUG) -> bool:
    """Stops what runs; says so at `level` (a failed `start` cleaning up: not on the console,
    its one-line error says what went wrong)."""
    pid = _server_pid(layout)
    if pid:
        os.killpg(pid, signal.SIGTERM)  # its process group: workers and job runner too
        for _ in range(60):
            if not _alive(pid):
                break
            time.sleep(0.25)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        log.log(level, f"server: stopped mlflow server (pid {pid})")
    layout.pid.unlink(missing_ok=True)
    stopped_pg = bool(_read_json(layout.state).get("cluster")) and stop_cluster(layout)
    if stopped_pg:
        log.log(level, f"server: stopped PostgreSQL ({layout.pgdata})")
    return bool(pid) or stopped_pg


def stop(folder=DEFAULT_DIR) -> bool:
    """Stops the MLflow server and the cluster `start` started; False if nothing ran."""
    layout = Layout(folder)
    if not layout.dir.is_dir():
        log.info(f"server: nothing to stop ({layout.dir} does not exist)")
        return False
    with _locked(layout):
        stopped = _stop_locked(layout, logging.INFO)
    if not stopped:
        log.info(f"server: nothing was running ({layout.dir})")
    return stopped


def status(folder=DEFAULT_DIR) -> dict:
    """The state `start` recorded, with `running` (pid alive and /health answering) and
    `postgres_port` (the cluster's, if it runs)."""
    layout = Layout(folder)
    state = _read_json(layout.state)
    pid = _server_pid(layout)
    state["running"] = bool(pid) and _request(f"{state.get('url')}/health") == 200
    state["postgres_port"] = _pg_running_port(layout) if state.get("cluster") else None
    return state


def build_parser() -> argparse.ArgumentParser:
    """server's parser (docs/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(
        prog="python -m pipeline server", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("action", choices=("start", "stop", "status"),
                        help="start it (the flags it does not know go to `mlflow server`), stop "
                             "it, or say whether it runs")
    parser.add_argument("--dir", default="",
                        help=f"the server's folder (secrets, cluster, artifacts, logs; default: "
                             f"$SERVER_DIR, else {DEFAULT_DIR})")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0: all)")
    parser.add_argument("--port", type=int, default=5000, help="0: a free one")
    parser.add_argument("--workers", type=int, default=2, help="the server's worker processes")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="every library's INFO lines too (MLflow, PostgreSQL's driver)")
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv[1:] if argv and argv[0] == "server" else argv)
    args.dir = args.dir or os.environ.get("SERVER_DIR") or DEFAULT_DIR
    if extra and args.action != "start":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    tools.console(args.verbose)
    layout = Layout(args.dir)
    try:
        if args.action == "stop":
            stop(args.dir)
            return 0
        if args.action == "status":
            state = status(args.dir)
            if not state["running"]:
                print(f"server: not running ({layout.dir})")
                return NOT_RUNNING
            pg = (f"PostgreSQL on 127.0.0.1:{state['postgres_port']}" if state["cluster"]
                  else f"database {state.get('backend')}")
            print(f"server: {state['url']} (pid {state['pid']}, {pg}, since {state['started']})")
            return 0
        state = start(args.dir, args.host, args.port, args.workers, extra_args=tuple(extra))
    except ServerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    store = (f"PostgreSQL cluster {layout.pgdata} on 127.0.0.1:{state['pg_port']}"
             if state.get("cluster") else f"database {state['backend']}")
    password = ("$MLFLOW_AUTH_ADMIN_PASSWORD" if "MLFLOW_AUTH_ADMIN_PASSWORD" in os.environ
                else f'"$(cat {layout.admin_password})"')  # where it is, never what it is
    print(f"server: MLflow {state['url']} with basic auth; backend {store}; artifacts "
          f"{state['artifacts']}; log {layout.log}\nserver: the pipeline reaches it with\n"
          f"  export MLFLOW_TRACKING_URI={state['url']}\n"
          f"  export MLFLOW_TRACKING_USERNAME={ADMIN}   # better: your own (docs/team-server.md)\n"
          f"  export MLFLOW_TRACKING_PASSWORD={password}\n"
          f"server: stop it with `make server-stop SERVER_DIR={args.dir}`")
    return 0
