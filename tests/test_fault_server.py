"""The counting behind the team server's fault-suite cases (bench/fault_server.py): the metric
steps a job's own log says it logged, and the comparison with what the server holds (lost
steps, steps sent twice). The cases themselves (a PostgreSQL-backed server, three jobs at once,
minutes on 2 cores) run in `make fault-suite`."""

from __future__ import annotations

from bench import fault_server

PRETRAIN_LOG = """\
tracking: experiment faults
step 5/100000  loss 6.1234  mlm_acc 0.010  lr 1.00e-03  gnorm 2.1  1,234 tok/s
warning: the tracking store http://127.0.0.1:5000 does not answer (API request to ...)
step 10/100000  loss 6.0001  mlm_acc 0.020  lr 1.00e-03  gnorm 2.0  1,230 tok/s
not a step 15/100000 line
step 15/100000  loss 5.9  mlm_acc 0.030  lr 1.00e-03  gnorm 1.9  1,100 tok/s
final weights sha256 abc
"""

FINETUNE_LOG = """\
finetune: step 10/24  loss 0.6931  52 examples/s
finetune: epoch 1  step 12  loss 0.6900  validation accuracy 0.5000  (3 s)
finetune: step 20/24  loss 0.6500  50 examples/s
finetune: epoch 2  step 24  loss 0.6400  validation accuracy 0.6250  (6 s)
finetune: wrote /tmp/x/finetune/topic
"""


def test_pretraining_steps_come_from_the_step_lines_only():
    assert fault_server.logged_steps("pretrain_a", PRETRAIN_LOG) == {"loss": [5, 10, 15]}


def test_finetuning_logs_train_loss_from_progress_and_epoch_lines():
    steps = fault_server.logged_steps("finetune", FINETUNE_LOG)
    assert steps == {"train_loss": [10, 12, 20, 24], "val_*": [12, 24]}


def test_an_epoch_step_that_is_also_a_progress_step_counts_twice():
    log = ("finetune: step 8/16  loss 0.7  10 examples/s\n"
           "finetune: epoch 1  step 8  loss 0.7  validation accuracy 0.5  (1 s)\n")
    assert fault_server.logged_steps("finetune", log)["train_loss"] == [8, 8]


def test_lost_and_duplicated_steps_are_told_apart():
    assert fault_server.missing_and_extra([5, 10, 15], [5, 10, 15]) == ([], [])
    assert fault_server.missing_and_extra([5, 10, 15], [5, 15]) == ([10], [])
    assert fault_server.missing_and_extra([5, 10], [5, 5, 10]) == ([], [5])
    # a step the log has twice must be stored twice
    assert fault_server.missing_and_extra([8, 8, 16], [8, 16]) == ([8], [])
    assert fault_server.missing_and_extra([], [3]) == ([], [3])


def test_expected_artifacts_name_the_local_files(tmp_path):
    run = tmp_path / "run"
    (run / "finetune" / "topic").mkdir(parents=True)
    for name in ("metrics.json", "model.keras", "test_predictions.jsonl", "splits.json"):
        (run / "finetune" / "topic" / name).write_text("x")
    wanted = fault_server.expected_artifacts("finetune", run)
    assert sorted(wanted) == ["finetune/metrics.json", "finetune/model.keras",
                              "finetune/test_predictions.jsonl"]
    assert wanted["finetune/model.keras"] == run / "finetune" / "topic" / "model.keras"
    pretrain = fault_server.expected_artifacts("pretrain_b", run)
    assert pretrain["model/model.keras"] == run / "pretrain" / "model.keras"


def test_system_metrics_start_again_when_the_store_answers(tmp_path, monkeypatch):
    """MLflow's system-metrics monitor ends its thread at the first failed call (the server
    killed mid-training); once the outbox has sent what it kept, a new monitor continues the
    run's `system/*` steps (pipeline/tracking/outbox.py restart_system_metrics)."""
    import time

    import mlflow
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
    from mlflow.tracking import fluent

    from pipeline.tools.server import free_port
    from pipeline.tracking import outbox

    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient()
    run_id = client.create_run(client.create_experiment("monitor")).info.run_id
    client.log_metric(run_id, "system/cpu_utilization_percentage", 1.0, step=4)
    # The monitor of a run whose server went away: its first call fails, its thread ends.
    dead = SystemMetricsMonitor(run_id, tracking_uri=f"http://127.0.0.1:{free_port()}")
    fluent.run_id_to_system_metrics_monitor[run_id] = dead
    outbox.configure(tmp_path / "outbox.jsonl")
    try:
        dead.start()
        dead._process.join(timeout=60)
        assert not dead._process.is_alive()
        outbox._append({"op": "batch", "run_id": run_id, "metrics": [["loss", 2.0, 0, 7]]})
        assert outbox.flush() == (1, 0)  # the store answers: the kept call, then the monitor
        fresh = fluent.run_id_to_system_metrics_monitor[run_id]
        assert fresh is not dead and fresh._process.is_alive()
        deadline = time.time() + 60
        while time.time() < deadline:
            steps = [m.step for m in client.get_metric_history(
                run_id, "system/cpu_utilization_percentage")]
            if len(steps) > 1:
                break
            time.sleep(0.2)
        assert steps[0] == 4 and steps[1] == 5, steps  # continues after the last step
    finally:
        monitor = fluent.run_id_to_system_metrics_monitor.pop(run_id, None)
        if monitor is not None:
            monitor.finish()
        outbox.configure(None)


# ---------------------------------------------------------------------------
# What counts as injected (restart_verdict, saw_outage); server_concurrent outside the tally
# ---------------------------------------------------------------------------
OUTAGE = ("warning: the tracking store http://127.0.0.1:5000 does not answer (API request to "
          "... failed); training goes on, and what it logs is kept in ...\n")


def _logs(tmp_path, texts: dict) -> dict:
    logs = {}
    for job, text in texts.items():
        logs[job] = tmp_path / f"{job}.log"
        logs[job].write_text(text)
    return logs


def test_a_restart_no_job_saw_is_not_injected(tmp_path):
    """A warning from before the kill (the log's size then is the offset) is not this outage;
    with none after it, the restart is reported as not injected, whatever the checks say."""
    logs = _logs(tmp_path, {"pretrain_a": "step 5/100000  loss 6.1\n" + OUTAGE,
                            "pretrain_b": "step 5/100000  loss 6.1\n",
                            "finetune": "finetune: step 10/24  loss 0.69\n"})
    offsets = {job: path.stat().st_size for job, path in logs.items()}  # at the kill
    with open(logs["pretrain_a"], "a") as out:
        out.write("step 10/100000  loss 6.0\n")  # after the kill: trained on, saw nothing
    saw = fault_server.saw_outage(logs, offsets)
    assert saw == []
    verdict = fault_server.restart_verdict(40.0, True, saw)
    assert "no job saw the outage" in verdict
    result = fault_server.Result("server_restart", "server", 40.0, inside=True,
                                 not_injected=verdict)
    assert not result.injected and not result.survived


def test_a_restart_inside_the_run_that_a_job_saw_is_injected(tmp_path):
    logs = _logs(tmp_path, {"pretrain_a": "step 5/100000  loss 6.1\n",
                            "finetune": "finetune: step 10/24  loss 0.69\n"})
    offsets = {job: path.stat().st_size for job, path in logs.items()}
    with open(logs["finetune"], "a") as out:
        out.write(OUTAGE + "tracking: the store ... answers again; sent the 12 calls kept "
                  "meanwhile\n")
    saw = fault_server.saw_outage(logs, offsets)
    assert saw == ["finetune"]
    assert fault_server.restart_verdict(40.0, True, saw) == ""
    assert fault_server.Result("postgres_restart", "postgres", 40.0, inside=True).injected
    # a kill that came after a job had ended is not inside the jobs' run
    assert "already ended" in fault_server.restart_verdict(40.0, False, saw)
    assert "not killed" in fault_server.restart_verdict(None, False, [])


def test_server_concurrent_is_a_check_not_in_the_tally():
    """The no-fault case injects nothing: not counted as a survived injection (it once was,
    with killed_at 0.0), reported on its own line instead."""
    from bench import fault_suite

    assert fault_server.FAULT["server_concurrent"] is None
    for killed_at in (None, 0.0):
        concurrent = fault_server.Result("server_concurrent", "none", killed_at)
        assert concurrent.no_fault and not concurrent.injected and not concurrent.survived
    lines, failed = fault_suite.summary([fault_server.Result("server_concurrent", "none", None),
                                         fault_server.Result("server_restart", "server", 40.0,
                                                             inside=True)])
    assert lines == ["no-fault checks: 1 passed, 0 failed (server_concurrent passed)",
                     "fault-suite: 1/1 survived, 0 lost, 0 not injected"] and not failed
