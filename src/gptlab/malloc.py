"""glibc malloc settings for CPU training: keep freed tensor memory for the next step.

By default glibc hands a freed block back to the operating system when it was mmap'd (blocks
above a threshold that adapts up to 32 MiB) or when more than twice that threshold lies free at
the top of the heap. A training step frees and reallocates the same large buffers every time
(logits, their gradient, the embedding and head gradients: 25.6 MB each at the full 100,070-row
vocabulary), so each step faulted ~45 MB of fresh zeroed pages back in: ~20 % of a step at the
reference setting on 2 cores. A fixed mmap threshold at glibc's maximum (32 MiB) and a high
trim threshold keep those pages in the process; peak memory stays the same.

The same as exporting MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_; those (or glibc.malloc
tunables in GLIBC_TUNABLES) win when set.
`tune_malloc=false` in gptlab-train keeps glibc's defaults.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20  # the largest value mallopt accepts on 64-bit glibc
TRIM_THRESHOLD = 2**30
ENV_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def keep_freed_memory() -> bool:
    """Set glibc's thresholds for this process; True when they were set.

    A no-op (False) off Linux/glibc, or when the user set malloc's environment variables."""
    user_set = any(os.environ.get(v) for v in ENV_VARS) or "glibc.malloc." in os.environ.get(
        "GLIBC_TUNABLES", "")
    if not sys.platform.startswith("linux") or user_set:
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc only (musl's mallopt does nothing)  # noqa: B018
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    log.debug("glibc malloc thresholds %s", "set" if ok else "refused")
    return ok
