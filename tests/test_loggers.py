"""logger=mlflow, logger=wandb and lists of loggers, as a user runs them: gptlab-train's command
lines (its entry point in this process: helpers.run_main), a real MLflow tracking server on
127.0.0.1, W&B offline (no account, no network).

Four runs, shared by the checks: one with logger=[tensorboard,mlflow,wandb] on MLflow's local
store, its resume, and a 2-job sweep logging to the MLflow server and to W&B.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import BIN, check, read_metrics, run_main, scalars

mlflow = pytest.importorskip("mlflow")
pytest.importorskip("wandb")
from mlflow.tracking import MlflowClient  # noqa: E402

FAST = "debug=fast"
# Nothing leaves the machine: MLflow's usage telemetry off, W&B offline, its error reports off.
QUIET = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "WANDB_MODE": "offline",
    "WANDB_ERROR_REPORTING": "false",
}


@pytest.fixture(scope="module", autouse=True)
def environment(tmp_path_factory):
    """The variables above; none of the user's MLflow/W&B settings; W&B's own files in a tmp dir."""
    home = tmp_path_factory.mktemp("wandb-home")
    with pytest.MonkeyPatch.context() as mp:
        for key in list(os.environ):
            if key.startswith(("MLFLOW_", "WANDB_")):
                mp.delenv(key)
        for key, value in QUIET.items():
            mp.setenv(key, value)
        for key in ("CONFIG", "CACHE", "DATA"):
            mp.setenv(f"WANDB_{key}_DIR", str(home / key.lower()))
        yield


class Server:
    """`mlflow server` on 127.0.0.1 at a free port, with its own SQLite store and artifact folder.
    Started when the module starts, so it comes up while the first runs train."""

    def __init__(self, root: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.artifacts = root / "artifacts"
        self.log = root / "server.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [
                    str(BIN / "mlflow"),
                    "server",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--backend-store-uri",
                    f"sqlite:///{root / 'server.db'}",
                    "--artifacts-destination",
                    str(self.artifacts),
                    "--workers",
                    "1",
                ],
                cwd=root,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # no job runner: it starts 8 more processes that a tracking server does not need
                env={**os.environ, **QUIET, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
            )

    def wait(self, timeout: float = 180) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (
                f"mlflow server exited:\n{self.log.read_text()[-3000:]}"
            )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return self.url
            except OSError:
                time.sleep(0.5)
        raise AssertionError(
            f"mlflow server not up after {timeout} s:\n{self.log.read_text()[-3000:]}"
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture(scope="module", autouse=True)
def server(environment, tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("mlflow-server"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """Where the user runs gptlab-train: outputs/ (runs, sweeps, the local MLflow store) lands
    here."""
    return tmp_path_factory.mktemp("project")


def run_dirs(workdir: Path) -> list[Path]:
    return sorted(p.parent for p in (workdir / "outputs").glob("2*/*/metrics.json"))


@pytest.fixture(scope="module")
def local_run(workdir) -> Path:
    check(run_main(FAST, "logger=[tensorboard,mlflow,wandb]", cwd=workdir))
    (run,) = run_dirs(workdir)
    return run


@pytest.fixture(scope="module")
def resumed(local_run) -> Path:
    """The same run continued for 10 more steps, in its own directory."""
    check(run_main(f"resume={local_run}", "trainer.max_steps=40", cwd=local_run.parents[2]))
    return local_run


@pytest.fixture(scope="module")
def sweep(workdir, server) -> Path:
    """Two jobs, one process, to the MLflow server and W&B."""
    check(
        run_main(
            "-m",
            FAST,
            "model.d_model=32,48",
            "logger=[mlflow,wandb]",
            f"logger.mlflow.tracking_uri={server.wait()}",
            cwd=workdir,
        )
    )
    (sweep_dir,) = (workdir / "outputs" / "multirun").glob("*/*")
    return sweep_dir


def local_store(workdir: Path) -> str:
    return f"sqlite:///{workdir / 'outputs' / 'mlflow.db'}"


def mlflow_runs(uri: str, experiment: str) -> list:
    """The experiment's runs; MLflow's address put back (set_tracking_uri also exports it as
    MLFLOW_TRACKING_URI, which a later test's run in this process would log to)."""
    mlflow.set_tracking_uri(uri)
    try:
        return mlflow.search_runs(experiment_names=[experiment], output_format="list")
    finally:
        mlflow.set_tracking_uri(None)


def wandb_records(path: Path):
    """The records of a W&B run file (run-<id>.wandb: a log of 32 KiB blocks of protobuf
    records, each behind a 7-byte header), without any W&B service."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos = 7
    block = 32768
    chunks = b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        length = int.from_bytes(data[pos + 4 : pos + 6], "little")
        kind = data[pos + 6]
        chunks += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(chunks)
            chunks = b""
            yield record


def wandb_run(folder: Path) -> dict:
    """What an offline W&B run holds: its run record, final summary and config, history keys."""
    (file,) = folder.glob("run-*.wandb")
    run = None
    summary = {}
    config = {}
    history = set()
    for record in wandb_records(file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            config.update({i.key: json.loads(i.value_json) for i in run.config.update})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "summary":
            summary.update(
                {i.key: json.loads(i.value_json) for i in record.summary.update if i.key}
            )
        elif kind == "history":
            history.update("/".join(i.nested_key) or i.key for i in record.history.item)
    return {
        "id": run.run_id,
        "name": run.display_name,
        "group": run.run_group,
        "project": run.project,
        "summary": summary,
        "config": config,
        "history": history,
    }


def offline_runs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*"))


# ---------------------------------------------------------------------------------------------
# one run, three loggers


def test_mlflow_local_store_holds_scalars_hparams_results_and_config(workdir, local_run):
    metrics = read_metrics(local_run)
    (run,) = mlflow_runs(local_store(workdir), "gptlab")
    assert run.info.run_name == str(local_run.relative_to(workdir))  # outputs/<date>/<time>
    assert run.info.status == "FINISHED"
    assert run.data.tags["gptlab.run_dir"] == str(local_run)
    assert run.data.metrics["val/loss"] == pytest.approx(metrics["final_val_loss"], rel=1e-6)
    for key in ("best_val_loss", "best_val_perplexity", "num_params", "tokens_per_sec", "steps"):
        assert run.data.metrics[key] == pytest.approx(metrics[key], rel=1e-6)
    assert run.data.tags["gptlab.status"] == "ok"
    params = run.data.params
    assert params["model/d_model"] == "32" and params["optim/lr"] == "0.003"
    assert int(params["model/vocab_size"]) > 0  # the built model's, not the config's null
    history = MlflowClient(local_store(workdir)).get_metric_history(run.info.run_id, "train/loss")
    assert len(history) >= 20
    # the config as composed, and metrics.json, next to the store:
    # outputs/mlartifacts/<run>/artifacts
    artifacts = Path(run.info.artifact_uri)
    assert artifacts.is_relative_to(workdir / "outputs" / "mlartifacts")
    composed = (local_run / ".hydra" / "config.yaml").read_text()
    assert (artifacts / "hydra" / "config.yaml").read_text() == composed
    assert (artifacts / "hydra" / "overrides.yaml").is_file() and (
        artifacts / "metrics.json"
    ).is_file()
    assert not (workdir / "mlruns").exists() and not (workdir / "mlartifacts").exists()


def test_wandb_offline_run_lies_in_the_run_directory(workdir, local_run):
    metrics = read_metrics(local_run)
    (folder,) = offline_runs(local_run)
    run = wandb_run(folder)
    assert folder.name.endswith(f"-{run['id']}")
    assert run["name"] == str(local_run.relative_to(workdir)) and run["group"] == ""
    assert run["project"] == "gptlab"
    assert {"train/loss", "val/loss", "val/perplexity"} <= run["history"]
    assert run["summary"]["best_val_loss"] == pytest.approx(metrics["best_val_loss"], rel=1e-6)
    assert run["summary"]["status"] == "ok"
    assert run["config"]["model/d_model"] == 32 and run["config"]["gptlab/run_dir"] == str(
        local_run
    )
    assert (folder / "files" / ".hydra" / "config.yaml").is_file()
    assert (folder / "files" / "metrics.json").is_file()


def test_a_list_of_loggers_logs_to_each(local_run):
    tags = scalars(local_run / "tensorboard")
    assert "val/loss" in tags and "val_results/best_loss" in tags  # one TensorBoard run
    assert offline_runs(local_run)  # and MLflow: the test above


# ---------------------------------------------------------------------------------------------
# resume


def test_resume_continues_the_same_mlflow_and_wandb_runs(workdir, resumed):
    metrics = read_metrics(resumed)
    assert metrics["steps"] == 40
    first, second = offline_runs(resumed)  # W&B: one more folder, the same run id
    assert wandb_run(first)["id"] == wandb_run(second)["id"]
    assert wandb_run(second)["summary"]["steps"] == 40
    (run,) = mlflow_runs(local_store(workdir), "gptlab")  # MLflow: still one run, now at step 40
    assert run.info.status == "FINISHED" and run.data.metrics["steps"] == 40
    client = MlflowClient(local_store(workdir))
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
    assert max(steps) >= 39


# ---------------------------------------------------------------------------------------------
# a sweep, on a real MLflow server


def test_sweep_jobs_are_grouped_on_the_mlflow_server(workdir, server, sweep):
    name = str(sweep.relative_to(workdir))  # outputs/multirun/<date>/<time>
    runs = sorted(mlflow_runs(server.url, name), key=lambda r: r.info.run_name)
    assert [r.info.run_name for r in runs] == [f"{name}/0", f"{name}/1"]
    assert [r.data.params["model/d_model"] for r in runs] == ["32", "48"]
    for job, run in enumerate(runs):
        assert run.data.tags["gptlab.job"] == str(job) and run.data.tags["gptlab.sweep_dir"] == str(
            sweep
        )
        assert run.data.metrics["val/loss"] == pytest.approx(
            read_metrics(sweep / str(job))["final_val_loss"]
        )
        # artifacts went through the server into its own artifact folder
        local = mlflow.artifacts.download_artifacts(
            run_id=run.info.run_id,
            artifact_path="hydra/config.yaml",
            tracking_uri=server.url,
            dst_path=str(workdir / f"download{job}"),
        )
        assert Path(local).read_text() == (sweep / str(job) / ".hydra" / "config.yaml").read_text()
    assert any(server.artifacts.rglob("config.yaml"))
    assert (
        MlflowClient(local_store(workdir)).get_experiment_by_name(name) is None
    )  # not in the local store


def test_sweep_jobs_are_one_wandb_group(workdir, sweep):
    name = str(sweep.relative_to(workdir))
    runs = [wandb_run(folder) for job in ("0", "1") for folder in offline_runs(sweep / job)]
    assert [r["name"] for r in runs] == [f"{name}/0", f"{name}/1"]  # one W&B run per job
    assert {r["group"] for r in runs} == {name} and len({r["id"] for r in runs}) == 2


def test_wandb_without_a_login_is_bad_input_with_the_fix(tmp_path, monkeypatch):
    """Online W&B with no API key anywhere (no WANDB_API_KEY, an empty home): exit 2 before any
    work, naming `wandb login` and the offline mode, not W&B's traceback from inside the step."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    result = run_main(
        "debug=fast",
        "logger=wandb",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
        env={"WANDB_MODE": "online"},
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "logger=wandb: W&B has no login here" in result.stderr
    assert "wandb login" in result.stderr and "WANDB_MODE=offline" in result.stderr
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.rglob("*.ckpt"))
