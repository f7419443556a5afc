"""The machine the table was measured on: CPU model, bf16 instructions, cores, versions."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

BF16_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16")  # /proc/cpuinfo flags

# What torch says in a fresh process, as a user's python sees it (this process has no torch).
TORCH_FACTS = """
import json, torch
facts = {
    "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
    "torch_default_threads": torch.get_num_threads(),
    "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
}
print(json.dumps(facts))
"""


def cpu_info(cpuinfo: str | None) -> dict:
    """The CPU model and its bf16 instructions, from /proc/cpuinfo's text (None where unknown)."""
    model = None
    flags = None
    for line in (cpuinfo or "").splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key == "flags" and flags is None:
            flags = set(value.split())
    features = {flag: (flag in flags) if flags is not None else None for flag in BF16_FLAGS}
    if flags is None:
        summary = "unknown"
        has_amx = None
    else:
        summary = ", ".join(flag for flag in BF16_FLAGS if features[flag]) or "none"
        has_amx = bool(features["amx_bf16"] and features["amx_tile"])
    return {
        "cpu_model": model or platform.processor() or platform.machine(),
        "cpu_bf16_flags": features,
        "cpu_bf16": summary,
        "cpu_has_amx": has_amx,
        "cpu_has_avx512_bf16": features["avx512_bf16"],
    }


def read_cpuinfo() -> str | None:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return None


def torch_facts() -> dict:
    result = subprocess.run(
        [sys.executable, "-c", TORCH_FACTS], capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout)


def machine_info(device: str, threads: int) -> dict:
    return {
        **cpu_info(read_cpuinfo()),
        **torch_facts(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "threads": threads,
        "user_env": {
            k: v for k, v in os.environ.items() if k.startswith(("OMP_", "GOMP_", "MALLOC_"))
        },
        "torch": version("torch"),
        "lightning": version("lightning"),
        "gptlab": version("gptlab"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": device,
        "load_average_start": list(os.getloadavg()),
    }
