"""A real two-node SLURM cluster on this host, for the tests: `up()` brings it up, `down()` stops it.

Two slurmd daemons (nodes `n1` and `n2`, one CPU and 8000 MB each, both on 127.0.0.1 with
ports of their own) in one partition `debug`, a slurmctld, and munge for authentication.
Everything the cluster writes (config, state, spool, logs, pid files) lives in `CLUSTER_DIR`
(default /tmp/gptlab-slurm, or $GPTLAB_SLURM_DIR), never in the repository; clients find the
config through $SLURM_CONF (see `client_env()`). Accounting is off, so `sacct` does not work:
check jobs with `squeue`/`scontrol show job` and their files instead.

`up()` is idempotent (a cluster already up with this config is left alone) and takes a few
seconds. It needs root (the daemons run as root, munged as `munge`) and the Debian packages
`slurm-wlm` and `munge`; `unavailable()` says why the cluster cannot run here, or None.

    python tests/slurm_cluster.py up|down|status
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

CLUSTER_DIR = Path(os.environ.get("GPTLAB_SLURM_DIR", "/tmp/gptlab-slurm"))
CONF = CLUSTER_DIR / "slurm.conf"
NODES = {"n1": 17011, "n2": 17012}  # node name -> slurmd port
CTLD_PORT = 17010
PARTITION = "debug"
NODE_CPUS = 1
NODE_MEMORY_MB = 8000
MUNGE_SOCKET_DIR = Path("/run/munge")
HOSTS_LINE = "127.0.0.1 " + " ".join(NODES)
COMMANDS = (
    "slurmctld",
    "slurmd",
    "srun",
    "sbatch",
    "squeue",
    "scontrol",
    "sinfo",
    "munged",
    "munge",
)


def unavailable() -> str | None:
    """Why a cluster cannot be brought up here (a reason to skip), or None when it can."""
    if os.geteuid() != 0:
        return "a real SLURM cluster needs root (slurmd and munged are started on this host)"
    missing = [c for c in COMMANDS if shutil.which(c) is None and not Path("/usr/sbin", c).exists()]
    if missing:
        return f"SLURM is not installed (no {', '.join(missing)}): apt-get install slurm-wlm munge"
    return None


def client_env() -> dict[str, str]:
    """Environment variables a SLURM client (srun, sbatch, squeue, ...) needs for this cluster."""
    return {"SLURM_CONF": str(CONF)}


def slurm_conf() -> str:
    host = socket.gethostname()
    d = CLUSTER_DIR
    nodes = "\n".join(
        f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={NODE_CPUS} "
        f"RealMemory={NODE_MEMORY_MB} State=UNKNOWN"
        for name, port in NODES.items()
    )
    return f"""\
# Written by gptlab's tests/slurm_cluster.py: two nodes on one host.
ClusterName=gptlab
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={CTLD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# a requeued job may start again after cred_expire seconds (default 120; slurmd refuses the old
# credential until then, "Job credential revoked")
AuthInfo=cred_expire=10
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
EnforcePartLimits=ALL
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
ReturnToService=2
MailProg=/bin/true
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
KillWait=5
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
{nodes}
PartitionName={PARTITION} Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


def _run(*cmd: str, timeout: float = 10, check: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, **client_env()}
    return subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=timeout, check=check
    )


def _pid(path: Path) -> int | None:
    """The pid in `path` when that process is alive, else None."""
    try:
        pid = int(path.read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    return pid


def _munge_works() -> bool:
    try:
        token = subprocess.run(["munge", "-n"], capture_output=True, timeout=5)
        if token.returncode != 0:
            return False
        return (
            subprocess.run(
                ["unmunge"], input=token.stdout, capture_output=True, timeout=5
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def _start_munge() -> None:
    if _munge_works():
        return
    MUNGE_SOCKET_DIR.mkdir(mode=0o755, exist_ok=True)
    shutil.chown(MUNGE_SOCKET_DIR, "munge", "munge")
    key = Path("/etc/munge/munge.key")
    if not key.is_file():  # the Debian package creates it; make one if it was removed
        subprocess.run(["mungekey", "--create", "--force"], check=True, capture_output=True)
        shutil.chown(key, "munge", "munge")
    subprocess.run(
        ["/usr/sbin/munged"],
        user="munge",
        group="munge",
        check=True,
        capture_output=True,
        timeout=10,
    )
    (CLUSTER_DIR / "munged.started").write_text("gptlab tests started munged\n")
    _wait(_munge_works, 10, "munged did not answer")


def _ensure_hosts() -> None:
    hosts = Path("/etc/hosts")
    lines = hosts.read_text().splitlines()
    if HOSTS_LINE not in lines:
        with hosts.open("a") as f:
            f.write(
                ("" if not lines or hosts.read_text().endswith("\n") else "\n") + HOSTS_LINE + "\n"
            )


def _wait(predicate, timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{message} within {timeout:.0f} s; logs in {CLUSTER_DIR / 'log'}")
        time.sleep(0.2)


def node_states() -> dict[str, str]:
    """{node: state} as sinfo reports it (idle, mix, alloc, down*, unk*, ...); {} when not up."""
    try:
        out = _run("sinfo", "-h", "-N", "-p", PARTITION, "-o", "%N %t", timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if out.returncode != 0:
        return {}
    return dict(line.split() for line in out.stdout.splitlines() if line.strip())


def _daemons_alive() -> bool:
    return _pid(CLUSTER_DIR / "slurmctld.pid") is not None and all(
        _pid(CLUSTER_DIR / f"slurmd-{n}.pid") is not None for n in NODES
    )


def is_up() -> bool:
    """Both nodes answer and are usable (idle, mixed or allocated)."""
    if not _daemons_alive():
        return False
    states = node_states()
    return set(states) == set(NODES) and all(
        s.rstrip("*~#!%$@^-") in ("idle", "mix", "alloc", "comp") and not s.endswith("*")
        for s in states.values()
    )


def up(timeout: float = 60) -> bool:
    """Bring the cluster up; return True if it was started now, False if it was already up."""
    reason = unavailable()
    if reason:
        raise RuntimeError(reason)
    CLUSTER_DIR.mkdir(parents=True, exist_ok=True)
    conf = slurm_conf()
    same_conf = CONF.is_file() and CONF.read_text() == conf
    _start_munge()
    _ensure_hosts()
    if same_conf and is_up():
        return False
    stop_daemons()  # whatever half of it runs, or a cluster of another config
    for sub in ("state", "log", *(f"spool/{n}" for n in NODES)):
        (CLUSTER_DIR / sub).mkdir(parents=True, exist_ok=True)
    CONF.write_text(conf)
    # -c: start with no saved jobs; -i: ignore state files that do not match
    subprocess.run(
        ["slurmctld", "-c", "-i", "-f", str(CONF)], check=True, capture_output=True, timeout=20
    )
    _wait(
        lambda: _run("scontrol", "ping", timeout=5).stdout.count("is UP") >= 1,
        20,
        "slurmctld did not answer",
    )
    for name in NODES:
        subprocess.run(
            ["slurmd", "-f", str(CONF), "-N", name], check=True, capture_output=True, timeout=20
        )
    try:
        _wait(is_up, timeout, f"nodes {', '.join(NODES)} did not come up")
    except RuntimeError:
        # a node kept DOWN from an earlier life of the cluster: tell slurmctld it may use it
        _run("scontrol", "update", f"nodename={','.join(NODES)}", "state=resume")
        _wait(is_up, 10, f"nodes {', '.join(NODES)} did not come up")
    return True


def _stop(pid_file: Path, timeout: float = 10) -> None:
    pid = _pid(pid_file)
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _pid(pid_file) == pid and time.monotonic() < deadline:
        time.sleep(0.1)
    if _pid(pid_file) == pid:
        os.kill(pid, signal.SIGKILL)


def stop_daemons() -> None:
    for name in NODES:
        _stop(CLUSTER_DIR / f"slurmd-{name}.pid")
    _stop(CLUSTER_DIR / "slurmctld.pid")


def down() -> None:
    """Cancel every job of the cluster, stop its daemons, and munged if `up()` started it."""
    if _pid(CLUSTER_DIR / "slurmctld.pid") is not None:
        try:
            _run("scancel", "-p", PARTITION, timeout=10)
            _wait(
                lambda: not _run("squeue", "-h", "-p", PARTITION, timeout=5).stdout.strip(),
                15,
                "jobs did not end",
            )
        except (RuntimeError, OSError, subprocess.TimeoutExpired):
            pass
    stop_daemons()
    started = CLUSTER_DIR / "munged.started"
    if started.is_file():
        _stop(MUNGE_SOCKET_DIR / "munged.pid")
        started.unlink()


def main(argv: list[str]) -> int:
    action = argv[1] if len(argv) > 1 else "status"
    if action == "up":
        t0 = time.monotonic()
        started = up()
        print(
            f"{'started' if started else 'already up'} in {time.monotonic() - t0:.1f} s; "
            f"export SLURM_CONF={CONF}"
        )
    elif action == "down":
        down()
        print("down")
    elif action == "status":
        print(f"up: {is_up()}; nodes: {node_states()}; SLURM_CONF={CONF}")
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
