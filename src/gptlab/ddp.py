"""DDP under Hydra: start each extra rank as a plain run of *this* job, not of the command line.

Lightning's `ddp` strategy starts ranks 1..N-1 by re-running `sys.argv` with
`hydra.run.dir=<run.dir>` appended. Under `-m` that re-runs the whole sweep in every rank
(Lightning #11300), and a time-stamped run dir may resolve to another folder. Here a rank is
started with the job's own overrides (`hydra.overrides.task`) into the job's own output
directory (`hydra.runtime.output_dir`), as a single run that writes no `.hydra/` of its own.
Between the jobs of a sweep, `finish_ddp_job` waits for the ranks, closes the process group
and clears the DDP environment, so the next job starts its own ranks.

Under SLURM or torchrun the ranks are started outside and none of this is used.
"""

from __future__ import annotations

import os
import sys

import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.strategies.launchers import subprocess_script

DDP_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")
# Hydra overrides that belong to the sweep or to the parent's run, not to a rank of one job.
NOT_FOR_RANKS = ("hydra.mode", "hydra.sweep", "hydra.sweeper", "hydra/sweeper", "hydra.launcher",
                 "hydra/launcher", "hydra.run.dir", "hydra.output_subdir", "hydra.job.name",
                 "hydra.job.num", "hydra.job.id", "hydra.callbacks")


def rank_command(local_rank: int) -> tuple[list[str], str]:
    """The command line that starts `local_rank` for the current Hydra job, and its cwd."""
    import __main__

    hc = HydraConfig.get()
    if __main__.__spec__ is None:  # a console script or a file
        command = [sys.executable, os.path.abspath(os.path.join(hc.runtime.cwd, sys.argv[0]))]
    else:
        command = [sys.executable, "-m", __main__.__spec__.name]
    command += list(hc.overrides.task)
    command += [o for o in hc.overrides.hydra if not o.lstrip("+~").startswith(NOT_FOR_RANKS)]
    command += [f'hydra.run.dir="{hc.runtime.output_dir}"', "hydra.output_subdir=null",
                f"hydra.job.name={hc.job.name}"]
    return command, hc.runtime.cwd


class _JobLauncher(subprocess_script._SubprocessScriptLauncher):
    launched: list[_JobLauncher] = []

    def _call_children_scripts(self) -> None:
        self._env_before = {k: os.environ.get(k) for k in DDP_ENV}
        _JobLauncher.launched.append(self)
        original = subprocess_script._hydra_subprocess_cmd
        subprocess_script._hydra_subprocess_cmd = rank_command  # looked up at call time
        try:
            super()._call_children_scripts()
        finally:
            subprocess_script._hydra_subprocess_cmd = original

    def finish(self, timeout: float = 300) -> None:
        for proc in self.procs:
            proc.wait(timeout=timeout)
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        for key, value in self._env_before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class HydraDDPStrategy(DDPStrategy):
    """Lightning's DDP, with ranks started per Hydra job (see the module docstring)."""

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if type(self._launcher) is subprocess_script._SubprocessScriptLauncher:
            self._launcher = _JobLauncher(self.cluster_environment, self.num_processes, self.num_nodes)


def finish_ddp_job() -> None:
    """After a job: wait for the ranks it started and reset DDP for the next job of a sweep."""
    while _JobLauncher.launched:
        _JobLauncher.launched.pop().finish()
