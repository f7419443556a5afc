"""Scale-out for real: sweeps, multi-node DDP and requeue on a two-node SLURM cluster on this host.

The cluster (tests/slurm_cluster.py: nodes n1 and n2, one CPU and 8000 MB each, partition
`debug`) comes from the session fixture `slurm_cluster`: a cluster of this session's own, in a
private temporary directory, on free ports, with its own munged, always stopped at the end, so
that other clusters on the host (another checkout's tests, a user's) do not matter. Without root
or without slurm-wlm and munge every test here is skipped with the reason. Accounting is off, so
nothing here uses `sacct`: jobs are followed with `squeue` / `scontrol show job` and checked
through their files.
Every gptlab-train is a debug=fast run (seconds).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from helpers import BIN, check, read_metrics, run_cli

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

NODES = {"n1", "n2"}
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")
# CPU-only SLURM jobs: no GPUs, one task per node, one core and 2 GB each
SLURM_SWEEP = (
    "-m",
    "hydra/launcher=slurm",
    "hydra.launcher.partition=debug",
    "hydra.launcher.gpus_per_node=0",
    "hydra.launcher.tasks_per_node=1",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.mem_gb=2",
)
TWO_NODE_DDP = (
    "trainer=ddp",
    "trainer.accelerator=cpu",
    "trainer.devices=1",
    "trainer.num_nodes=2",
    "debug=fast",
)


def slurm(*args: str, timeout: float = 30) -> str:
    """Run a SLURM client command; the jobs it submits get this environment, gptlab-train on
    PATH."""
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, f"{' '.join(args)}: exit {result.returncode}\n{result.stderr}"
    return result.stdout


def job_fields(job_id: str) -> dict[str, str]:
    """`scontrol show job` as {key: value}; {} once slurmctld has forgotten the job."""
    result = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=30
    )
    if result.returncode != 0:
        return {}
    return dict(re.findall(r"(\w+)=(\S*)", result.stdout))


def ended(job_id: str) -> dict[str, str] | None:
    """The job's fields once it has ended, else None."""
    fields = job_fields(job_id)
    return fields if fields.get("JobState") in ENDED else None


def wait_for(predicate, timeout: float, what: str, poll: float = 0.25):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


def cancel_all_jobs() -> None:
    def queue() -> str:
        return subprocess.run(
            ["squeue", "-h", "-p", "debug"], capture_output=True, text=True
        ).stdout.strip()

    if queue():
        subprocess.run(["scancel", "-p", "debug"], capture_output=True)
        wait_for(lambda: not queue(), 30, "cancelled jobs to end")


@pytest.fixture(autouse=True)
def no_jobs_left(slurm_cluster):
    """Each test starts and ends with an empty queue (a failed test cancels what it left)."""
    cancel_all_jobs()
    yield
    cancel_all_jobs()


def expand_nodes(nodelist: str) -> set[str]:
    """SLURM's compact node list ('n1', 'n[1-2]', 'n[1,2]', 'n1,n2') as a set of names."""
    names = set()
    for prefix, inside, plain in re.findall(r"(\w+?)\[([\d,-]+)\]|(\w+)", nodelist):
        if plain:
            names.add(plain)
            continue
        for part in inside.split(","):
            lo, _, hi = part.partition("-")
            names.update(f"{prefix}{i}" for i in range(int(lo), int(hi or lo) + 1))
    return names


class QueueWatch:
    """Polls squeue in a thread: which jobs ran at the same moment, on which nodes."""

    def __init__(self):
        self.snapshots: list[list[tuple[str, str, str]]] = []  # [(job id, array id, node)] running
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            out = subprocess.run(
                ["squeue", "-h", "-p", "debug", "-t", "RUNNING", "-o", "%A %i %N"],
                capture_output=True,
                text=True,
            ).stdout
            rows = [tuple(line.split()) for line in out.splitlines() if len(line.split()) == 3]
            if rows:
                self.snapshots.append(rows)
            self._stop.wait(0.2)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def job_ids(self) -> set[str]:
        return {i for rows in self.snapshots for row in rows for i in row[:2]}

    def max_nodes_at_once(self) -> set[str]:
        return max(
            ({n for row in rows for n in expand_nodes(row[2])} for rows in self.snapshots),
            key=len,
            default=set(),
        )


def job_dirs(sweep: Path) -> list[Path]:
    return sorted(p for p in sweep.iterdir() if p.name.isdigit())


def test_a_sweep_runs_as_slurm_jobs_on_both_nodes_at_once(tmp_path):
    sweep = tmp_path / "sweep"
    with QueueWatch() as queue:
        result = check(
            run_cli(
                *SLURM_SWEEP,
                "debug=fast",
                "model.num_heads=2,4",
                f"hydra.sweep.dir={sweep}",
                cwd=tmp_path,
                timeout=240,
            )
        )
    assert "Sweep done: 2 jobs, 2 ok, 0 failed." in result.stdout
    assert queue.max_nodes_at_once() == NODES, f"never both nodes at once: {queue.snapshots}"
    jobs = job_dirs(sweep)
    assert [j.name for j in jobs] == ["0", "1"]
    for job, heads in zip(jobs, (2, 4), strict=True):
        metrics = read_metrics(job)
        assert metrics["status"] == "ok" and metrics["steps"] == 30, metrics
        assert f"model.num_heads={heads}" in (job / ".hydra" / "overrides.yaml").read_text()
        assert "slurm_job_id" in metrics, (
            f"metrics.json of job {job.name} has no slurm_job_id: {metrics}"
        )
        assert str(metrics["slurm_job_id"]) in queue.job_ids(), (
            metrics["slurm_job_id"],
            queue.snapshots,
        )
    # CPU-only jobs: gpus_per_node=0 on a cluster without GPUs (no gres configured)
    (script,) = (sweep / ".submitit").glob("*/*_submission.sh")
    assert "#SBATCH --gpus-per-node=0" in script.read_text()


def test_an_invalid_job_fails_alone_and_the_sweep_exits_1(tmp_path):
    # debug=fast sets model.d_model=32: 3 heads do not divide it
    sweep = tmp_path / "sweep"
    result = run_cli(
        *SLURM_SWEEP,
        "debug=fast",
        "trainer.max_steps=10",
        "model.num_heads=3,2",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
        timeout=240,
    )
    assert result.returncode == 1, (
        f"exit {result.returncode}\n{result.stdout}\n{result.stderr[-3000:]}"
    )
    assert "Sweep failed: 1 of 2 jobs failed" in result.stdout + result.stderr
    bad, good = (read_metrics(j) for j in job_dirs(sweep))
    assert bad["status"] == "failed" and "num_heads" in bad["reason"], bad
    assert good["status"] == "ok" and good["steps"] == 10, good


def check_two_node_run(run_dir: Path, output: str) -> None:
    files = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file())
    assert files.count("metrics.json") == 1, files
    metrics = read_metrics(run_dir)
    assert metrics["status"] == "ok" and metrics["steps"] == 30, metrics
    assert metrics["device"].endswith("x2"), metrics
    assert (
        metrics["tokens_seen"] == 2 * 30 * 8 * 32
    )  # both ranks trained: steps x batch x context each
    assert output.count("Done: ") == 1, output[-3000:]  # rank 0 alone reports


def test_srun_two_node_ddp(tmp_path):
    run_dir = tmp_path / "run"
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "MASTER_PORT": str(free_port()),  # not Lightning's from the job id (see free_port)
    }
    result = subprocess.run(
        [
            "srun",
            "-N2",
            "--ntasks-per-node=1",
            "--mem=3G",
            "gptlab-train",
            *TWO_NODE_DDP,
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, (
        f"exit {result.returncode}\n{result.stdout}\n{result.stderr[-4000:]}"
    )
    check_two_node_run(run_dir, result.stdout + result.stderr)


def free_port() -> int:
    """A port for DDP's rendezvous. Under SLURM, Lightning derives it from the job id, which is
    the same in another cluster on this host (both count from 1): give it MASTER_PORT instead."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun_two_node_ddp(tmp_path):
    run_dir, port = tmp_path / "run", free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [
                str(BIN / "torchrun"),
                "--nnodes=2",
                "--nproc_per_node=1",
                f"--node_rank={rank}",
                "--master_addr=127.0.0.1",
                f"--master_port={port}",
                str(BIN / "gptlab-train"),
                *TWO_NODE_DDP,
                f"hydra.run.dir={run_dir}",
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        outputs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, f"exit {p.returncode}\n{out[-4000:]}"
    check_two_node_run(run_dir, "".join(outputs))


# last.ckpt from step 20 (not 100): the requeue comes early, 220 steps before the run would end
EVERY_20 = "callbacks.last_checkpoint.every_n_train_steps=20"


def test_sbatch_requeue_continues_from_last_checkpoint(tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "slurm-%j.out"
    job_id = slurm(
        "sbatch",
        "--parsable",
        "--requeue",
        "--open-mode=append",
        "-c",
        "1",
        "--mem=2G",
        "--time=10",
        f"--chdir={tmp_path}",
        f"--output={log}",
        "--wrap",
        f"gptlab-train debug=fast trainer.max_steps=240 {EVERY_20} hydra.run.dir={run_dir}",
    ).strip()
    last = run_dir / "checkpoints" / "last.ckpt"
    wait_for(last.is_file, 120, f"{last} (job {job_id}: {job_fields(job_id).get('JobState')})")
    slurm("scontrol", "requeue", job_id)  # what a preemption with PreemptMode=REQUEUE does
    # SIGTERM: gptlab saves last.ckpt and exits; the job waits cred_expire (10 s here), starts again
    final = wait_for(lambda: ended(job_id), 400, f"job {job_id} to end")  # a hang, not a speed
    output = Path(str(log).replace("%j", job_id)).read_text()
    assert final["JobState"] == "COMPLETED" and final["Restarts"] == "1", (final, output[-3000:])
    train_log = (run_dir / "train.log").read_text()
    assert "Stopped by SIGTERM" in train_log  # the first run saved last.ckpt and stopped
    assert f"Restoring states from the checkpoint path at {last}" in train_log, (
        "the requeued job did not continue from last.ckpt:\n" + train_log[-3000:]
    )
    metrics = read_metrics(run_dir)
    assert metrics["status"] == "ok" and metrics["steps"] == 240, metrics


def test_submitit_sweep_of_two_node_ddp_jobs(tmp_path):
    # one job keeps it short: test_a_sweep_runs_... covers several jobs at once
    sweep = tmp_path / "sweep"
    with QueueWatch() as queue:
        result = check(
            run_cli(
                *SLURM_SWEEP,
                "hydra.launcher.nodes=2",
                *TWO_NODE_DDP,
                "model.num_heads=4",
                f"hydra.sweep.dir={sweep}",
                cwd=tmp_path,
                timeout=240,
                env={"MASTER_PORT": str(free_port())},  # sbatch passes it on to the job
            )
        )
    assert re.search(r"Sweep done: 1 jobs?, 1 ok, 0 failed\.", result.stdout), result.stdout
    assert queue.max_nodes_at_once() == NODES, queue.snapshots
    (job,) = job_dirs(sweep)
    check_two_node_run(job, (job / "train.log").read_text())
    logs = sorted((sweep / ".submitit").glob("*/*_log.out"))
    assert len(logs) == 2, logs  # one task per node
