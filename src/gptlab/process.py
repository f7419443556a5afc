"""This process: its rank, the memory its machine has left, its CPU defaults set when gptlab
is imported (GOMP_SPINCOUNT, glibc's malloc thresholds) unless the user set their own
(docs/devices.md), and SIGTERM outside training (raised, as Ctrl-C is)."""

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Iterator

OPENMP_PRINT_ONLY = ("OMP_DISPLAY_ENV", "OMP_DISPLAY_AFFINITY")
GOMP_SPINCOUNT = "1000"

M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20  # the largest value mallopt accepts on 64-bit glibc
TRIM_THRESHOLD = 2**30


def user_set_openmp(environ) -> bool:
    return any(k.startswith(("OMP_", "GOMP_")) and k not in OPENMP_PRINT_ONLY for k in environ)


def user_set_malloc(environ) -> bool:
    tunables = environ.get("GLIBC_TUNABLES", "")
    return any(k.startswith("MALLOC_") for k in environ) or "glibc.malloc." in tunables


def set_openmp_default(environ) -> bool:
    """GOMP_SPINCOUNT for torch's OpenMP runtime; True when set (too late once torch is loaded)."""
    if "torch" in sys.modules or user_set_openmp(environ):
        return False
    environ["GOMP_SPINCOUNT"] = GOMP_SPINCOUNT
    return True


def glibc_mallopt():
    """glibc's mallopt, or None where the C library is not glibc (musl's mallopt does nothing)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # this process's own symbols, its C library's among them
        libc.gnu_get_libc_version  # glibc only  # noqa: B018
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt


def keep_freed_memory(environ) -> bool:
    """Set glibc's mmap and trim thresholds for this process; True when glibc took both."""
    if user_set_malloc(environ):
        return False
    mallopt = glibc_mallopt()
    if mallopt is None:
        return False
    mmap_set = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    trim_set = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    return mmap_set and trim_set


def rank(environ=os.environ) -> int:
    """This process's rank as its launcher set it, read as Lightning reads it, before Lightning
    is imported (a rank Lightning spawns itself is the trainer's to know: is_global_zero)."""
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if environ.get(key, "").isdigit():
            return int(environ[key])
    return 0


def available_memory() -> int | None:
    """Bytes of memory this machine can still give (Linux's MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo", "rb") as f:
            lines = f.read().decode().splitlines()
    except OSError:
        return None
    found = [int(line.split()[1]) * 1024 for line in lines if line.startswith("MemAvailable:")]
    return found[0] if found else None


def apply_defaults(environ=os.environ) -> dict[str, bool]:
    """Both defaults; which of them this process got."""
    return {"openmp": set_openmp_default(environ), "malloc": keep_freed_memory(environ)}


class Terminated(BaseException):
    """SIGTERM outside training, raised as Ctrl-C raises KeyboardInterrupt: a start stopped by
    it is undone the same way (gptlab.cli.app), not killed with its half-made run left."""


def raise_terminated(signum, frame) -> None:
    raise Terminated


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within: SIGTERM raises Terminated (in the main thread, where Python runs handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def sigterm_passes() -> Iterator[None]:
    """Within (training): SIGTERM is not raised but back at its default, on which Lightning
    puts its own handler (finish the step, save, stop)."""
    if signal.getsignal(signal.SIGTERM) is not raise_terminated:
        yield
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, raise_terminated)
