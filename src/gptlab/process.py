"""This process: its rank, the memory its machine has left, and its CPU defaults set when gptlab
is imported (GOMP_SPINCOUNT, glibc's malloc thresholds) unless the user set their own
(docs/devices.md)."""

import ctypes
import os
import sys

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
