"""gptlab.malloc: with its glibc settings a training step stops faulting in fresh pages."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc only")

# A full-vocabulary step (the reference setting's 100,070 rows, one block) in a fresh process;
# prints whether the settings were applied and the minor page faults of each step.
STEPS = """
import json, resource, sys, torch
import torch.nn.functional as F
from gptlab.malloc import keep_freed_memory
from gptlab.model.gpt import GPT, GPTConfig
torch.set_num_threads(1)
applied = keep_freed_memory() if sys.argv[1] != "default" else None
if sys.argv[1] == "apply-only":
    sys.exit(print(json.dumps({"applied": applied})))
torch.manual_seed(0)
model = GPT(GPTConfig(vocab_size=100_070, context_length=16, d_model=64, num_heads=4, num_blocks=1))
optimizer = torch.optim.AdamW(model.parameters())
x, y = torch.randint(0, 100_070, (2, 4, 16))
faults = []
for _ in range(12):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults": faults}))
"""


def run_steps(mode: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    result = subprocess.run([sys.executable, "-c", STEPS, mode], env={**clean, **env},
                            capture_output=True, text=True, timeout=120, check=True)
    return json.loads(result.stdout.splitlines()[-1])


def test_steps_reuse_freed_memory_once_tuned():
    default, tuned = run_steps("default"), run_steps("tuned")
    assert tuned["applied"] is True
    # steady state (last 6 steps): glibc's defaults hand the 25.6 MB buffers back to the OS and
    # fault them in again (6,250 pages each); tuned, the pages stay in the process
    default_faults, tuned_faults = sum(default["faults"][6:]), sum(tuned["faults"][6:])
    assert default_faults > 6_250, default["faults"]
    assert tuned_faults * 4 < default_faults, (default["faults"], tuned["faults"])


def test_user_malloc_environment_wins():
    assert run_steps("apply-only", MALLOC_TRIM_THRESHOLD_="131072")["applied"] is False
    assert run_steps("apply-only", GLIBC_TUNABLES="glibc.malloc.mmap_threshold=65536")["applied"] is False
    assert run_steps("apply-only", GLIBC_TUNABLES="glibc.cpu.x86_ibt=0")["applied"] is True
