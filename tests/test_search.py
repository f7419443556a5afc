"""Optuna searches end to end (hparams_search=optuna on gptlab's sweeper): real gptlab-train
processes where the process is the point (joblib, SLURM, DDP, a SIGKILL), the entry point in this
process otherwise (helpers.run_main: a resume, the basic launcher's trials); a real study in
SQLite, real pruning, the real dashboard."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import time
import urllib.request
from datetime import datetime
from pathlib import Path

import optuna
import pytest
import yaml
from helpers import BIN, check, read_metrics, run_cli, run_main
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

import gptlab.cli.train  # noqa: F401 - registers the sweeper's config nodes
from gptlab.sweep.optuna_study import search_space

# a small model (d_model and depth fixed, so out of the search space): seconds per trial
TINY = ("debug=fast", "model.d_model=32", "model.num_blocks=1", "trainer.val_check_interval=10")
SEARCH = ("-m", "hparams_search=optuna", *TINY)
PID_LOG = "hydra.job_logging.formatters.simple.format='[%(process)d][%(asctime)s] %(message)s'"


def study_of(sweep: Path) -> optuna.Study:
    return optuna.load_study(study_name="gptlab", storage=f"sqlite:///{sweep / 'optuna.db'}")


def states(study: optuna.Study) -> list[str]:
    return [t.state.name for t in study.trials]


@pytest.fixture(scope="module")
def search(tmp_path_factory):
    """One pruned search of 6 trials, two at a time in two joblib processes, shared below."""
    cwd = tmp_path_factory.mktemp("search")
    sweep = cwd / "sweep"
    result = check(
        run_cli(
            *SEARCH,
            "trainer.max_steps=40",
            "hydra.sweeper.n_trials=6",
            "hydra.sweeper.n_jobs=2",
            "hydra.sweeper.pruner=median",
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
            PID_LOG,
            f"hydra.sweep.dir={sweep}",
            cwd=cwd,
            timeout=600,
        )
    )
    return sweep, result


def test_the_study_holds_every_trial_finished_some_pruned(search):
    sweep, result = search
    study = study_of(sweep)
    assert len(study.trials) == 6 and "RUNNING" not in states(study), states(study)
    assert "PRUNED" in states(study) and "COMPLETE" in states(study), states(study)
    for trial in study.trials:
        metrics = read_metrics(sweep / trial.user_attrs["job"])
        curve = metrics["val_curve"]
        # reported at each validation, keyed on global_step
        assert trial.intermediate_values == {step: loss for step, _, loss in curve}
        assert [step for step, _, _ in curve] == list(range(10, metrics["steps"] + 1, 10))
        if trial.state == TrialState.PRUNED:
            assert metrics["status"] == "pruned" and metrics["steps"] < 40, metrics
            assert (sweep / trial.user_attrs["job"] / "checkpoints" / "last.ckpt").is_file()
        else:
            assert metrics["status"] == "ok" and metrics["steps"] == 40, metrics
            assert trial.value == pytest.approx(metrics["best_val_loss"])


def test_the_best_trial_is_printed_and_saved(search):
    sweep, result = search
    study = study_of(sweep)
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    complete = [t.value for t in study.trials if t.state == TrialState.COMPLETE]
    assert best["best_value"] == pytest.approx(min(complete))
    assert set(best["best_params"]) == {
        "optim.lr",
        "model.num_heads",
        "model.dropout",
    }  # model.d_model and model.num_blocks are fixed by TINY: out of the search space
    assert f"Best parameters: {best['best_params']}" in result.stdout + result.stderr


def test_the_trial_lines_are_rounded_and_hold_no_internal_override(search):
    """Each trial logged with its parameters and objective to 4 digits; the study and trial each
    job reads (hydra.job.env_set) never in a logged line."""
    sweep, result = search
    logged = result.stdout + result.stderr
    assert "GPTLAB_OPTUNA" not in logged and "env_set" not in logged
    for trial in study_of(sweep).trials:
        lr = re.escape(f"optim.lr={trial.params['optim.lr']:.4g}")
        assert re.search(rf"Trial {trial.number}: .*\b{lr}( |$)", logged, re.M), trial.number
        if trial.state == TrialState.COMPLETE:
            assert f"Trial {trial.number}: COMPLETE best_val_loss={trial.value:.4g}" in logged


def test_the_summary_counts_pruned_trials_and_draws_the_study(search):
    import matplotlib.image

    sweep, result = search
    study = study_of(sweep)
    n = {state: states(study).count(state) for state in ("COMPLETE", "PRUNED")}
    md = (sweep / "summary.md").read_text()
    assert f"Trials: {n['COMPLETE']} complete, {n['PRUNED']} pruned, 0 failed." in md
    assert f"Sweep done: 6 jobs, {n['COMPLETE']} ok, {n['PRUNED']} pruned, 0 failed." in (
        result.stdout
    )
    assert f"Best trial: {study.best_trial.number} " in md
    assert "| optim.lr |" in md and "| model.num_heads |" in md  # parameter importances
    # the sweep's own plot, then Optuna's optimisation history and parameter importances below it
    assert matplotlib.image.imread(sweep / "summary.png").shape[0] > 3 * 200
    assert "ExperimentalWarning" not in result.stderr


def test_optunas_plots_leave_the_process_style_as_it_was(search, tmp_path):
    """Optuna's matplotlib plots call pyplot.style.use("ggplot"): a sweep drawn after them in the
    same process kept its 7 colours, so configurations 8 to 10 shared colours with 1 to 3."""
    import shutil

    import matplotlib

    from gptlab.sweep.search import add_plots

    sweep, _ = search
    png = Path(shutil.copy(sweep / "summary.png", tmp_path / "summary.png"))
    before = dict(matplotlib.rcParams)
    add_plots(study_of(sweep), png, with_importances=True)
    assert dict(matplotlib.rcParams) == before


def job_log(job: Path) -> tuple[set[int], datetime, datetime]:
    """The process ids of a job's log lines, its first and its last time."""
    lines = re.findall(r"^\[(\d+)\]\[([\d\- :,]+)\]", (job / "train.log").read_text(), re.M)
    times = [datetime.strptime(t, "%Y-%m-%d %H:%M:%S,%f") for _, t in lines]
    return {int(pid) for pid, _ in lines}, min(times), max(times)


def test_joblib_runs_a_batch_of_trials_in_two_processes_at_once(search):
    sweep, _ = search
    (pid0,), start0, end0 = job_log(sweep / "0")
    (pid1,), start1, end1 = job_log(sweep / "1")
    assert pid0 != pid1 and os.getpid() not in (pid0, pid1)
    assert start0 < end1 and start1 < end0, (start0, end0, start1, end1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_dashboard_serves_the_study(search):
    sweep, _ = search
    port = free_port()
    url = f"http://127.0.0.1:{port}/api/studies"
    dashboard = subprocess.Popen(
        [str(BIN / "optuna-dashboard"), f"sqlite:///{sweep / 'optuna.db'}"]
        + ["--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    studies = json.load(response)["study_summaries"]
                break
            except OSError:
                assert dashboard.poll() is None, dashboard.stderr.read().decode()
                assert time.monotonic() < deadline, "optuna-dashboard did not answer in 60 s"
                time.sleep(0.5)
    finally:
        dashboard.terminate()
        dashboard.wait(timeout=30)
    assert [s["study_name"] for s in studies] == ["gptlab"]
    assert studies[0]["directions"] == ["minimize"]


def test_search_space_grammar_becomes_optuna_distributions():
    space, fixed = search_space(
        [
            "optim.lr=tag(log, interval(1e-4, 1e-2))",
            "model.dropout=interval(0.0, 0.2)",
            "model.num_blocks=range(1, 5)",
            "model.num_heads=choice(1, 2, 4)",
            "data.batch_size=range(8, 33, 8)",
            "model.d_model=choice(64, 128)",
            "model.d_model=96",  # a later plain value wins over the search space
        ]
    )
    assert space == {
        "optim.lr": FloatDistribution(1e-4, 1e-2, log=True),
        "model.dropout": FloatDistribution(0.0, 0.2),
        "model.num_blocks": IntDistribution(1, 4),  # stop excluded, as Hydra's grid
        "model.num_heads": CategoricalDistribution([1, 2, 4]),
        "data.batch_size": IntDistribution(8, 32, step=8),
    }
    assert fixed == ["model.d_model=96"]


def test_a_bad_pruner_is_refused_before_any_trial(tmp_path):
    sweep = tmp_path / "sweep"
    result = run_main(
        *SEARCH, "hydra.sweeper.pruner=sometimes", f"hydra.sweep.dir={sweep}", cwd=tmp_path
    )
    assert result.returncode == 2, result.stderr
    assert (
        "hydra.sweeper.pruner='sometimes': choose one of none, median, hyperband" in result.stderr
    )
    assert not (sweep / "optuna.db").exists() and not (sweep / "0").exists()


def test_a_storage_optuna_cannot_open_is_bad_input_not_a_composition_error(tmp_path):
    sweep = tmp_path / "sweep"
    args = [*SEARCH, "hydra.sweeper.storage=nosuchdb://x/y", f"hydra.sweep.dir={sweep}"]
    result = run_main(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "hydra.sweeper.storage: Optuna cannot open the study's storage" in result.stderr
    assert "cannot be composed" not in result.stderr and "Traceback" not in result.stderr
    assert not (sweep / "0").exists()


def completed(db: Path) -> int:
    """COMPLETE trials in the study's SQLite file, read as the search writes it."""
    if not db.is_file():
        return 0
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as connection:
        try:
            return connection.execute(
                "SELECT COUNT(*) FROM trials WHERE state='COMPLETE'"
            ).fetchone()[0]
        except sqlite3.OperationalError:  # tables not created yet
            return 0


def test_a_killed_search_resumes_to_n_trials_without_rerunning_finished_ones(tmp_path):
    sweep = tmp_path / "sweep"
    args = [*SEARCH, "trainer.max_steps=30", "hydra.sweeper.n_trials=6", f"hydra.sweep.dir={sweep}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    search = subprocess.Popen(
        [str(BIN / "gptlab-train"), *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while completed(sweep / "optuna.db") < 2:
        assert search.poll() is None, f"the search ended (exit {search.returncode}) before 2 trials"
        assert time.monotonic() < deadline, "2 trials did not finish in 300 s"
        time.sleep(0.2)
    os.killpg(search.pid, signal.SIGKILL)
    search.wait(timeout=30)
    study = study_of(sweep)
    finished = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(finished) in (2, 3) and len(study.trials) < 6, states(study)
    kept = {}
    for trial in finished:
        path = sweep / trial.user_attrs["job"] / "metrics.json"
        kept[path] = (path.stat().st_mtime_ns, path.read_bytes())
    # a study is data: a job name planted in the trial the kill interrupted never becomes a path
    with sqlite3.connect(sweep / "optuna.db") as connection:
        connection.execute(
            "UPDATE trial_user_attributes SET value_json = ? WHERE key = 'job' AND trial_id IN "
            "(SELECT trial_id FROM trials WHERE state = 'RUNNING')",
            ('"../../escape"',),
        )
    mismatch = run_main(f"resume={sweep}", "hydra.sweeper.study_name=another", cwd=tmp_path)
    assert mismatch.returncode == 2 and "holds no study of that name" in mismatch.stderr

    result = check(run_main(f"resume={sweep}", cwd=tmp_path))
    assert not (tmp_path / "escape").exists() and not (sweep.parent.parent / "escape").exists()
    study = study_of(sweep)
    assert states(study).count("COMPLETE") == 6, states(study)
    # a trial the kill interrupted ended FAIL and ran again in its own job directory
    reruns = [t for t in study.trials if "rerun_of" in t.user_attrs]
    assert len(reruns) == states(study).count("FAIL")
    for path, (mtime, data) in kept.items():
        assert (path.stat().st_mtime_ns, path.read_bytes()) == (mtime, data), path
    jobs = sorted(p.name for p in sweep.iterdir() if p.name.isdigit())
    # a job directory per trial number; a trial run again keeps the directory of the first
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert jobs == sorted(t.user_attrs["job"] for t in complete) and len(jobs) == 6
    assert all(read_metrics(sweep / job)["status"] == "ok" for job in jobs)
    assert "Trials: 6 complete, 0 pruned, 0 failed" in (sweep / "summary.md").read_text()
    assert "Sweep done: 6 jobs, 6 ok, 0 failed." in result.stdout


def test_two_objectives_give_a_pareto_front(tmp_path):
    sweep = tmp_path / "sweep"
    check(
        run_main(
            *SEARCH,
            "trainer.max_steps=10",
            "hydra.sweeper.n_trials=2",
            "hydra.sweeper.n_jobs=2",
            "hydra.sweeper.objectives=[best_val_loss,num_params]",
            "hydra.sweeper.direction=[minimize,minimize]",
            "model.num_blocks=choice(1,2)",
            f"hydra.sweep.dir={sweep}",
            cwd=tmp_path,
        )
    )
    study = study_of(sweep)
    assert [d.name for d in study.directions] == ["MINIMIZE", "MINIMIZE"]
    for trial in study.trials:
        metrics = read_metrics(sweep / trial.user_attrs["job"])
        assert trial.values == pytest.approx([metrics["best_val_loss"], metrics["num_params"]])
    md = (sweep / "summary.md").read_text()
    front = md.split("### Pareto front (best_val_loss, num_params)")[1].split("\n\n")[1]
    rows = [line for line in front.splitlines() if re.match(r"\| \d+ \|", line)]
    assert sorted(int(r.split("|")[1]) for r in rows) == sorted(t.number for t in study.best_trials)


@pytest.mark.slurm
def test_a_pruned_search_runs_on_the_slurm_cluster(slurm_cluster, tmp_path):
    sweep = tmp_path / "sweep"
    check(
        run_cli(
            *SEARCH,
            "hydra/launcher=slurm",
            "hydra.launcher.partition=debug",
            "hydra.launcher.gpus_per_node=0",
            "hydra.launcher.tasks_per_node=1",
            "hydra.launcher.cpus_per_task=1",
            "hydra.launcher.mem_gb=2",
            "trainer.max_steps=40",
            "hydra.sweeper.n_trials=4",
            "hydra.sweeper.n_jobs=2",
            "hydra.sweeper.pruner=median",
            "hydra.sweeper.pruners.median.n_startup_trials=1",
            "hydra.sweeper.pruners.median.n_warmup_steps=0",
            f"hydra.sweep.dir={sweep}",
            cwd=tmp_path,
            timeout=400,
            env={"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"},
        )
    )
    study = study_of(sweep)
    assert "PRUNED" in states(study) and "RUNNING" not in states(study), states(study)
    for trial in study.trials:
        metrics = read_metrics(sweep / trial.user_attrs["job"])
        assert metrics["slurm_job_id"], metrics  # the job ran as a SLURM job
        assert metrics["status"] == {"PRUNED": "pruned", "COMPLETE": "ok"}[trial.state.name]


def test_under_ddp_rank_0_asks_the_study_and_both_ranks_stop(tmp_path):
    """One run of two CPU DDP ranks as trial 1 of a study whose finished trial 0 had a far lower
    val loss at every step: the median pruner stops it at its first validation (a rank that
    did not stop would hang the other)."""
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="gptlab", storage=url)
    study.set_user_attr("gptlab_pruner", {"name": "median", "n_startup_trials": 1})
    study.set_user_attr("gptlab_objectives", ["best_val_loss"])
    done = study.ask()
    for step in (10, 20, 30):
        done.report(0.1, step)
    study.tell(done, 0.1)
    trial = study.ask()
    env = {
        "GPTLAB_OPTUNA_STORAGE": url,
        "GPTLAB_OPTUNA_STUDY": "gptlab",
        "GPTLAB_OPTUNA_TRIAL": str(trial.number),
    }
    check(
        run_cli(
            "hparams_search=optuna",
            "trainer=ddp_cpu",
            *TINY,
            "hydra.run.dir=run",
            cwd=tmp_path,
            env=env,
        )
    )
    metrics = read_metrics(tmp_path / "run")
    assert metrics["status"] == "pruned" and metrics["steps"] == 10, metrics
    assert metrics["device"] == "cpu x2"
    reported = optuna.load_study(study_name="gptlab", storage=url).trials[trial.number]
    assert list(reported.intermediate_values) == [10]  # rank 0 alone reported, once
