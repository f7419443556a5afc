"""A real two-node SLURM cluster on this host, for the tests and for trying SLURM by hand.

Two slurmd daemons (nodes `n1` and `n2`, one CPU and 8000 MB each, both on 127.0.0.1) in one
partition `debug`, a slurmctld, and a munged of its own. Everything a cluster writes (config,
munge key and socket, state, spool, logs, pid files) lives in its directory, and its ports are
free ones chosen at start, so several clusters run side by side on one host (two checkouts'
tests, a user's). Clients find a cluster through $SLURM_CONF (`Cluster.client_env()`).
Accounting is off: check jobs with `squeue`/`scontrol show job` and their files, not `sacct`.

The tests' cluster (tests/conftest.py) lives in a private temporary directory and is always
stopped. By hand, as root (in /tmp/gptlab-slurm, or $GPTLAB_SLURM_DIR; `up` is idempotent):

    python tests/slurm_cluster.py up|down|status

It needs root (the daemons run as root) and the Debian packages `slurm-wlm` and `munge`;
`unavailable()` says why a cluster cannot run here, or None.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_DIR = Path(os.environ.get("GPTLAB_SLURM_DIR", "/tmp/gptlab-slurm"))
NODES = ("n1", "n2")
PARTITION = "debug"
NODE_CPUS = 1
NODE_MEMORY_MB = 8000
HOSTS_LINE = "127.0.0.1 " + " ".join(NODES)
COMMANDS = ("slurmctld", "slurmd", "srun", "sbatch", "squeue", "scontrol", "sinfo", "munged")
START_ATTEMPTS = 3  # a free port may be taken by another process before a daemon binds it


def unavailable() -> str | None:
    """Why a cluster cannot be brought up here (a reason to skip), or None when it can."""
    if os.geteuid() != 0:
        return "a real SLURM cluster needs root (slurmd and munged are started on this host)"
    missing = [c for c in COMMANDS if shutil.which(c) is None and not Path("/usr/sbin", c).exists()]
    if missing:
        return f"SLURM is not installed (no {', '.join(missing)}): apt-get install slurm-wlm munge"
    return None


def free_ports(count: int) -> list[int]:
    """`count` ports that nobody listens on now, chosen by the kernel (port 0)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def pid_in(path: Path) -> int | None:
    """The pid in `path` when that process is alive, else None."""
    try:
        pid = int(path.read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    return pid


def stop_process(pid_file: Path, timeout: float = 10) -> None:
    """SIGTERM the process of `pid_file`, SIGKILL it if it is still there after `timeout`."""
    pid = pid_in(pid_file)
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_in(pid_file) == pid and time.monotonic() < deadline:
        time.sleep(0.1)
    if pid_in(pid_file) == pid:
        os.kill(pid, signal.SIGKILL)


def start_daemon(*cmd: str) -> None:
    """Run a daemon's command; it forks into the background and returns."""
    subprocess.run(cmd, check=True, capture_output=True, timeout=20)


def wait(predicate, timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{message} within {timeout:.0f} s")
        time.sleep(0.2)


def ensure_hosts() -> None:
    """The node names resolve to 127.0.0.1 (the same line for every cluster of this host)."""
    hosts = Path("/etc/hosts")
    text = hosts.read_text()
    if HOSTS_LINE not in text.splitlines():
        with hosts.open("a") as f:
            f.write(("" if not text or text.endswith("\n") else "\n") + HOSTS_LINE + "\n")


class Cluster:
    """One cluster, all of whose files are in `directory`."""

    def __init__(self, directory: Path | str):
        self.dir = Path(directory)
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge" / "munge.socket"

    def client_env(self) -> dict[str, str]:
        """Environment variables a SLURM client (srun, sbatch, squeue, ...) needs for it."""
        return {"SLURM_CONF": str(self.conf)}

    def slurm_conf(self, ctld_port: int, node_ports: list[int]) -> str:
        host = socket.gethostname()
        d = self.dir
        nodes = "\n".join(
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={NODE_CPUS} RealMemory={NODE_MEMORY_MB} State=UNKNOWN"
            for name, port in zip(NODES, node_ports, strict=True)
        )
        return f"""\
# Written by gptlab's tests/slurm_cluster.py: two nodes on one host, ports free at start.
ClusterName=gptlab
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# this cluster's own munged; a requeued job may start again after cred_expire seconds
# (default 120; slurmd refuses the old credential until then, "Job credential revoked")
AuthInfo=socket={self.munge_socket},cred_expire=10
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

    def run(self, *cmd: str, timeout: float = 10) -> subprocess.CompletedProcess:
        env = {**os.environ, **self.client_env()}
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)

    def munge_works(self) -> bool:
        socket_flag = f"--socket={self.munge_socket}"
        try:
            token = subprocess.run(["munge", "-n", socket_flag], capture_output=True, timeout=5)
            check = subprocess.run(
                ["unmunge", socket_flag], input=token.stdout, capture_output=True, timeout=5
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return token.returncode == 0 and check.returncode == 0

    def start_munge(self) -> None:
        """A munged of this cluster's own (its key, socket and pid file in the directory), so that
        no other cluster's start or stop touches its authentication."""
        folder = self.munge_socket.parent
        folder.mkdir(mode=0o755, parents=True, exist_ok=True)
        key = folder / "munge.key"
        if not key.is_file():
            key.touch(mode=0o600)
            key.write_bytes(os.urandom(1024))
        # --force: the tests' folders are private (0700), which munged only warns about then
        start_daemon(
            "munged",
            "--force",
            f"--socket={self.munge_socket}",
            f"--key-file={key}",
            f"--pid-file={folder / 'munged.pid'}",
            f"--log-file={folder / 'munged.log'}",
            f"--seed-file={folder / 'munged.seed'}",
        )
        wait(self.munge_works, 10, f"munged did not answer; see {folder / 'munged.log'}")

    def node_states(self) -> dict[str, str]:
        """{node: state} as sinfo reports it (idle, mix, alloc, down*, unk*, ...); {} if not up."""
        try:
            out = self.run("sinfo", "-h", "-N", "-p", PARTITION, "-o", "%N %t", timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            return {}
        if out.returncode != 0:
            return {}
        return dict(line.split() for line in out.stdout.splitlines() if line.strip())

    def pid_files(self) -> list[Path]:
        """The daemons' pid files, in the order they are stopped (munged last)."""
        slurmds = [self.dir / f"slurmd-{n}.pid" for n in NODES]
        return [*slurmds, self.dir / "slurmctld.pid", self.dir / "munge" / "munged.pid"]

    def is_up(self) -> bool:
        """Every daemon runs and both nodes are usable (idle, mixed or allocated)."""
        if not self.conf.is_file() or any(pid_in(p) is None for p in self.pid_files()):
            return False
        states = self.node_states()
        return set(states) == set(NODES) and all(
            s.rstrip("*~#!%$@^-") in ("idle", "mix", "alloc", "comp") and not s.endswith("*")
            for s in states.values()
        )

    def up(self, timeout: float = 60, stop_at_exit: bool = False) -> bool:
        """Bring the cluster up; True if it was started now, False if it was already up. Free
        ports are chosen at each attempt; a failed start stops whatever it started.
        `stop_at_exit`: stop it when this Python process ends, whatever happens to it."""
        reason = unavailable()
        if reason:
            raise RuntimeError(reason)
        ensure_hosts()
        if self.is_up():
            return False
        if stop_at_exit:
            atexit.register(self.down)
        for _ in range(START_ATTEMPTS):
            self.down()  # whatever half of it runs
            try:
                self.start(timeout)
                return True
            except (RuntimeError, subprocess.SubprocessError) as e:
                error = e
        self.down()
        raise RuntimeError(f"{error}; logs in {self.dir / 'log'}") from error

    def start(self, timeout: float) -> None:
        ctld_port, *node_ports = free_ports(1 + len(NODES))
        for sub in ("state", "log", *(f"spool/{n}" for n in NODES)):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(self.slurm_conf(ctld_port, node_ports))
        self.start_munge()
        # -c: start with no saved jobs; -i: ignore state files that do not match
        conf = str(self.conf)
        start_daemon("slurmctld", "-c", "-i", "-f", conf)
        wait(lambda: "is UP" in self.run("scontrol", "ping", timeout=5).stdout, 20, "no slurmctld")
        for name in NODES:
            start_daemon("slurmd", "-f", conf, "-N", name)
        try:
            wait(self.is_up, timeout, f"nodes {', '.join(NODES)} did not come up")
        except RuntimeError:
            # a node kept DOWN from an earlier life of the cluster: tell slurmctld it may use it
            self.run("scontrol", "update", f"nodename={','.join(NODES)}", "state=resume")
            wait(self.is_up, 10, f"nodes {', '.join(NODES)} did not come up")

    def down(self) -> None:
        """Cancel every job of the cluster and stop its daemons, munged included."""
        if self.conf.is_file() and pid_in(self.dir / "slurmctld.pid") is not None:
            try:
                self.run("scancel", "-p", PARTITION, timeout=10)
                wait(
                    lambda: not self.run("squeue", "-h", "-p", PARTITION, timeout=5).stdout.strip(),
                    15,
                    "jobs did not end",
                )
            except (RuntimeError, OSError, subprocess.TimeoutExpired):
                pass
        for pid_file in self.pid_files():
            stop_process(pid_file)


def main(argv: list[str]) -> int:
    cluster = Cluster(DEFAULT_DIR)
    action = argv[1] if len(argv) > 1 else "status"
    if action == "up":
        t0 = time.monotonic()
        started = cluster.up()
        print(
            f"{'started' if started else 'already up'} in {time.monotonic() - t0:.1f} s; "
            f"export SLURM_CONF={cluster.conf}"
        )
    elif action == "down":
        cluster.down()
        print("down")
    elif action == "status":
        print(f"up: {cluster.is_up()}; nodes: {cluster.node_states()}; SLURM_CONF={cluster.conf}")
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
