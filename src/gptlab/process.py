"""This process: its rank, and its defaults for training on a CPU, set once when gptlab is
imported.

- OpenMP: `GOMP_SPINCOUNT=1000`. An idle OpenMP thread spins briefly, then sleeps, so a run keeps
  its speed alone and beside another busy process. libgomp reads it when torch loads it, so it is
  set only while torch is not imported yet.
- glibc malloc: a fixed mmap threshold at glibc's largest (32 MiB) and a trim threshold of 1 GiB.
  A training step frees and reallocates the same large buffers every time (logits, their
  gradient, the embedding and head gradients: 25.6 MB each at the full 100,070-row vocabulary);
  by default glibc hands them back to the kernel and the next step faults ~45 MB of fresh zeroed
  pages back in. `mallopt` takes effect at any time in a running process. A no-op without glibc.

A user's own settings win: any `OMP_*`/`GOMP_*` variable (but the print-only ones) leaves OpenMP
alone, any `MALLOC_*` variable or a `glibc.malloc.` tunable in `GLIBC_TUNABLES` leaves malloc
alone (docs/performance.md has the measurements)."""

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
    """This process's rank as its launcher set it, read as Lightning reads it (RANK, LOCAL_RANK,
    SLURM_PROCID, JSM_NAMESPACE_RANK), before Lightning is imported. A DDP rank Lightning spawns
    itself is known to Lightning only: its callbacks ask the trainer (is_global_zero)."""
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if environ.get(key, "").isdigit():
            return int(environ[key])
    return 0


def apply_defaults(environ=os.environ) -> dict[str, bool]:
    """Both defaults; which of them this process got."""
    return {"openmp": set_openmp_default(environ), "malloc": keep_freed_memory(environ)}
