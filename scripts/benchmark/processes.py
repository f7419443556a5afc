"""Child processes: each measured side runs in one, as a user starts it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

COMPETITOR = "while True: pass"  # one CPU-bound process, for the busy-machine row


class ChildFailed(RuntimeError):
    """A child exited with an error: its command and the end of its stderr."""


def child_env() -> dict:
    """This process's environment as the user gave it (this process imports nothing of gptlab):
    each gptlab process applies gptlab's own process defaults, the reference loop runs as a plain
    script would."""
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def peak_rss_poller(pid: int, peak: list[int]) -> threading.Thread:
    """Follow /proc/<pid>/status VmHWM (the child's own high-water mark, in kB) until it exits.

    Not getrusage: on Linux a child's ru_maxrss also counts the parent's resident set at the
    fork."""

    def poll():
        status = Path(f"/proc/{pid}/status")
        while True:
            try:
                lines = [x for x in status.read_text().splitlines() if x.startswith("VmHWM:")]
            except OSError:
                return
            if not lines:  # a zombie: it has exited
                return
            peak[0] = max(peak[0], int(lines[0].split()[1]))
            time.sleep(0.05)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    return thread


def wait_with_timeout(proc: subprocess.Popen, timeout: float) -> int:
    """Wait for `proc` (killed after `timeout` seconds); its exit code."""
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        _, status, _ = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode


def run_child(cmd: list[str], cwd: Path, name: str, timeout: float = 7200) -> dict:
    """Run `cmd` in `cwd`; its start time, wall time, peak RSS (MB) and output (under logs/)."""
    log_dir = cwd / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    out_path = log_dir / f"{name}.stdout"
    err_path = log_dir / f"{name}.stderr"
    peak = [0]
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        start = time.time()
        proc = subprocess.Popen(cmd, cwd=cwd, env=child_env(), stdout=out, stderr=err)
        poller = peak_rss_poller(proc.pid, peak)
        code = wait_with_timeout(proc, timeout)
        poller.join()
        wall = time.time() - start
    stderr = err_path.read_text(errors="replace")
    if code != 0:
        raise ChildFailed(f"{name}: exit {code}: {' '.join(cmd)}\n{stderr[-3000:]}")
    return {"start": start, "wall_s": wall, "peak_rss_mb": peak[0] * 1024 / 1e6}


def failed(error: Exception) -> dict:
    """A run that failed, as a result: its first line and the last line of its stderr."""
    lines = [x.strip() for x in str(error).splitlines() if x.strip()]
    reason = lines[0] if len(lines) < 2 else f"{lines[0][:300]} ... {lines[-1][:300]}"
    print(f"[benchmark] FAILED: {reason}", file=sys.stderr, flush=True)
    return {"error": reason}


@contextmanager
def competitor():
    """One CPU-bound process while the block runs; afterwards the dict holds the cores it got."""
    proc = subprocess.Popen(
        [sys.executable, "-c", COMPETITOR],
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    began = time.time()
    result = {"command": f"{sys.executable} -c '{COMPETITOR}'"}
    try:
        yield result
    finally:
        proc.kill()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        # CPU time the competitor got over its life: ~1.0 when it held one core all along
        result["cores"] = (usage.ru_utime + usage.ru_stime) / (time.time() - began)
