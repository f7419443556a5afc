"""Every writer checked where it will write (gptlab.training.writers): the Trainer, its loggers
and its callbacks are asked, once built and in the directory the job runs in, where their bytes
go. A logger's `name`, a relative folder after Hydra's chdir, an MLflow address, a checkpoint's
file name: none reaches another run. A log folder shared by runs holds each run's own folder."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import check, own_copy, run_main, tensorboard_runs
from test_place import FAST, tree

from gptlab.training.writers import mlflow_folder


@pytest.fixture
def foreign(finished, tmp_path) -> Path:
    """A copy of a finished run: someone else's (a copy is never own)."""
    copy = tmp_path / "foreign"
    shutil.copytree(finished, copy)
    return copy


@pytest.mark.parametrize(
    "writer",
    [
        "logger=tensorboard logger.tensorboard.name={dir}/tensorboard",
        "logger=tensorboard logger.tensorboard.name=../foreign",
        "logger=tensorboard logger.tensorboard.name=../foreign/tensorboard",
        "logger=csv logger.csv.save_dir={dir}",
        "trainer.default_root_dir={dir}",
        "hydra.job.chdir=true logger=tensorboard logger.tensorboard.save_dir=../foreign",
        "hydra.job.chdir=true logger=csv logger.csv.save_dir=../foreign/csv",
        "hydra.job.chdir=true trainer.default_root_dir=../foreign",
        "logger=mlflow logger.mlflow.tracking_uri=sqlite:///../../foreign/mlflow.db",
        "logger=mlflow logger.mlflow.tracking_uri=../../foreign/mlruns",
        "logger=mlflow logger.mlflow.tracking_uri={dir}/mlruns",
        "logger=mlflow logger.mlflow.tracking_uri=file://{dir}/mlruns",
        "+callbacks.model_checkpoint.filename=../../foreign/checkpoints/best",
        "+callbacks.model_checkpoint.filename={dir}/checkpoints/best",
        "hydra.job.chdir=true +callbacks.model_checkpoint.filename=../../foreign/evil",
    ],
)
def test_no_writer_writes_into_someone_elses_run(foreign, tmp_path, writer):
    """Each form writes nothing into the foreign run and leaves nothing behind: exit 2 before
    training, in one paragraph naming the place. Launched two folders down, so that a path
    relative to the launch folder is not the one relative to the run (hydra.job.chdir)."""
    launch = tmp_path / "launch" / "here"
    launch.mkdir(parents=True)
    before = tree(foreign)
    args = writer.format(dir=foreign).split(" ")
    cache = {"GPTLAB_CACHE_DIR": str(tmp_path / "cache")}  # the launch folder: nothing written
    result = run_main(*FAST, *args, f"hydra.run.dir={tmp_path / 'mine'}", cwd=launch, env=cache)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert str(foreign) in result.stderr.strip().splitlines()[-1]
    assert tree(foreign) == before
    assert not (tmp_path / "mine").exists()
    assert tree(tmp_path / "launch") == {"here": "folder"}  # no store signed where it was launched


def test_runs_sharing_a_log_folder_each_write_their_own(tmp_path):
    """One TensorBoard and CSV save_dir for several runs (as TensorBoard users compare runs): each
    trains into its own folder there, the printed `tensorboard --logdir` names it, and a resume
    continues that same folder."""
    shared = tmp_path / "logs"
    logs = ["logger=many", f"logger.tensorboard.save_dir={shared}", f"logger.csv.save_dir={shared}"]
    printed = set()
    for run in ("a", "b"):
        result = check(run_main(*FAST, *logs, f"hydra.run.dir={run}", cwd=tmp_path))
        out = result.stdout + result.stderr
        [line] = [x for x in out.splitlines() if "tensorboard --logdir" in x]
        printed.add(line.split("--logdir ", 1)[1])
    assert printed == {str(shared / "tensorboard")}  # where the events are: both runs there
    own = [f"{tmp_path.name}_a", f"{tmp_path.name}_b"]  # each run's folder, by its directory
    assert tensorboard_runs(shared / "tensorboard") == own
    for name in own:
        assert (shared / "csv" / name / "metrics.csv").is_file()
    assert not (tmp_path / "a" / "tensorboard").exists()  # into the shared folder only

    written = (shared / "csv" / own[0] / "metrics.csv").read_bytes()
    check(run_main(f"resume={tmp_path / 'a'}", "trainer.max_steps=30", cwd=tmp_path))
    assert (shared / "csv" / own[0] / "metrics.csv").read_bytes() != written
    assert tensorboard_runs(shared / "tensorboard") == own  # the resume: the same run


def test_relative_places_after_hydras_chdir_land_in_the_run(tmp_path):
    """hydra.job.chdir=true: a relative save_dir, and a checkpoint name with a folder of its own,
    are the run's (resolved where the job runs); nothing is written where it was launched."""
    launch = tmp_path / "launch"
    launch.mkdir()
    args = ["hydra.job.chdir=true", "logger=tensorboard", "logger.tensorboard.save_dir=tb"]
    args += ["+callbacks.model_checkpoint.filename='best/{step}'", f"hydra.run.dir={tmp_path}/run"]
    env = {"GPTLAB_CACHE_DIR": str(tmp_path / "cache")}
    check(run_main(*FAST, *args, cwd=launch, env=env))
    assert list((tmp_path / "run" / "tb").rglob("events.out.tfevents.*"))
    assert list((tmp_path / "run" / "checkpoints" / "best").glob("*.ckpt"))
    assert not list(launch.iterdir())


@pytest.mark.parametrize(
    ("address", "folder"),
    [
        ("sqlite:///mlflow.db", "mlflow.db"),
        ("sqlite:///../x/mlflow.db", "../x/mlflow.db"),
        ("sqlite:////abs/mlflow.db", "/abs/mlflow.db"),
        ("sqlite:///:memory:", None),
        ("sqlite://", None),
        ("file:mlruns", "mlruns"),
        ("file:///abs/mlruns", "/abs/mlruns"),
        ("../x/mlruns", "../x/mlruns"),
        ("http://127.0.0.1:5000", None),
        ("databricks", None),
        ("sqlite+pysqlite:///mlflow.db", "mlflow.db"),
    ],
)
def test_an_mlflow_address_is_read_as_mlflow_reads_it(address, folder):
    assert mlflow_folder(address) == folder


def test_a_resume_opens_no_mlflow_store_in_someone_elses_run(finished, foreign, tmp_path):
    """resume= looks its MLflow run up as the config resolves: the store is checked first."""
    mine = own_copy(finished, tmp_path / "mine")
    before = tree(foreign)
    uri = f"logger.mlflow.tracking_uri=sqlite:///{foreign}/mlflow.db"
    result = run_main(f"resume={mine}", "logger=mlflow", uri, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and str(foreign) in result.stderr
    assert tree(foreign) == before
