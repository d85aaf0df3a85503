"""Airflow DAG: one cycle of the scheduled loop nightly (docs/scheduling.md), one task per step.

    pretrain -> finetune_<task> (one per entry of cycle.tasks) -> evaluate -> promote

Each task runs `deploy/run-scheduled.sh --step <step>` (`bert-pipeline cycle --step ...`) in
PROJECT (a checkout with `make setup` done, or set PROJECT to where the image keeps it). Exit
code 3 marks the task skipped (`skip_on_exit_code`), and so the tasks after it: `pretrain` exits
3 when no new text arrived since the last cycle (nothing is trained). 4 ("already running":
another invocation holds the run directory's lock) fails the task, which Airflow retries later.
A failed task re-run continues the cycle under way (its completed steps are not done again).

The finetune tasks are read from CONFIG's `cycle.tasks` when the DAG is parsed; where the file
is not readable from the scheduler, one `finetune` task fine-tunes every task.

`stage_command` runs pipeline stages alone (the pretraining-only DAG before the cycle;
tests/test_scheduling.py runs it).
"""

import datetime
from pathlib import Path

PROJECT = "/opt/bert-pipeline"
CONFIG = "configs/nightly.yaml"
SKIP = 3  # "nothing new": the task and everything after it are skipped


def cycle_tasks(config: str = "") -> list:
    """The task names of the config's cycle.tasks (the rule of pipeline/config/load.py
    cycle_tasks: `name`, else the config file's stem); None if the file cannot be read here."""
    try:
        import yaml

        path = Path(config or CONFIG)
        raw = yaml.safe_load((path if path.is_absolute() else Path(PROJECT) / path).read_text())
        entries = ((raw or {}).get("cycle") or {}).get("tasks") or []
        return [str(e.get("name") or Path(str(e["config"])).stem) for e in entries]
    except Exception:  # noqa: BLE001 - parsed on a scheduler without the project
        return None


def step_command(step: str, task: str = "") -> str:
    """The shell command of one step of the cycle."""
    return (f"cd {PROJECT} && STAGES=cycle CONFIG={CONFIG} deploy/run-scheduled.sh --step {step}"
            + (f" --task {task}" if task else ""))


def steps() -> list:
    """(task_id, command) of each Airflow task, in order."""
    tasks = cycle_tasks()
    finetune = ([(f"finetune_{name}", step_command("finetune", name)) for name in tasks]
                if tasks is not None else [("finetune", step_command("finetune"))])
    return [("pretrain", step_command("pretrain")), *finetune,
            ("evaluate", step_command("evaluate")), ("promote", step_command("promote"))]


def stage_command(stage: str) -> str:
    """One pipeline stage with --scheduled; exit 3 (the stage was up to date) is success."""
    return (f"cd {PROJECT} && STAGES={stage} CONFIG={CONFIG} deploy/run-scheduled.sh"
            f" || [ $? -eq 3 ]")


try:  # Airflow is not a dependency of the project; the DAG is only built where it is installed.
    from airflow import DAG
    try:  # Airflow 3: the standard provider
        from airflow.providers.standard.operators.bash import BashOperator
    except ImportError:  # Airflow 2
        from airflow.operators.bash import BashOperator
except ImportError:  # pragma: no cover - the tests run the commands without Airflow
    DAG = None

if DAG is not None:
    with DAG(
        dag_id="bert_pipeline_cycle",
        schedule="15 2 * * *",
        start_date=datetime.datetime(2026, 1, 1),
        catchup=False,
        max_active_runs=1,
        default_args={"retries": 2, "retry_delay": datetime.timedelta(minutes=10)},
    ) as dag:
        previous = None
        for task_id, command in steps():  # in a chain: the steps share the run directory's lock
            task = BashOperator(task_id=task_id, bash_command=command, skip_on_exit_code=SKIP)
            if previous is not None:
                previous >> task
            previous = task
