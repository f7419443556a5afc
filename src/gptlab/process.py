"""This process: its rank, the memory its machine has left, and its CPU defaults set when gptlab
is imported (GOMP_SPINCOUNT, glibc's malloc thresholds) unless the user set their own
(docs/devices.md)."""

import ctypes
import os
import sys

OPENMP_PRINT_ONLY = ("OMP_DISPLAY_ENV", "OMP_DISPLAY_AFFINITY")
M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20  # the largest value mallopt accepts on 64-bit glibc
TRIM_THRESHOLD = 2**30


def set_openmp_default(environ) -> bool:
    """GOMP_SPINCOUNT for torch's OpenMP runtime; True when set (too late once torch is loaded)."""
    own = any(k.startswith(("OMP_", "GOMP_")) and k not in OPENMP_PRINT_ONLY for k in environ)
    if "torch" in sys.modules or own:
        return False
    environ["GOMP_SPINCOUNT"] = "1000"
    return True


def keep_freed_memory(environ) -> bool:
    """Set glibc's mmap and trim thresholds for this process; True when glibc took both (not
    where the C library is another: musl's mallopt does nothing)."""
    own = any(k.startswith("MALLOC_") for k in environ)
    if own or "glibc.malloc." in environ.get("GLIBC_TUNABLES", "") or sys.platform != "linux":
        return False
    try:
        libc = ctypes.CDLL(None)  # this process's own symbols, its C library's among them
        libc.gnu_get_libc_version  # glibc only  # noqa: B018
    except (OSError, AttributeError):
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mmap_set = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    trim_set = libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
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
            found = [int(line.split()[1]) * 1024 for line in f if line.startswith(b"MemAvailable:")]
    except OSError:
        return None
    return found[0] if found else None
