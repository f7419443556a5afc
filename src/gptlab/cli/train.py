"""gptlab-train: the start planned (`resume=` and `branch_from=` turned into the overrides they
replay: gptlab.run.start), then Hydra composes the command line and gptlab.cli.fit trains; torch
and Lightning load only in the task, so a mistake is reported at once."""

import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from gptlab.cli.app import run_hydra_app, run_task
from gptlab.config.knob import provenance
from gptlab.config.schemas import register_configs
from gptlab.errors import ConfigError
from gptlab.exits import BAD_INPUT
from gptlab.run.start import plan_argv, plan_of

log = logging.getLogger("gptlab.train")
register_configs()


@hydra.main(version_base="1.3", config_path="pkg://gptlab.conf", config_name="train")
def run_job(cfg: DictConfig) -> float:
    """Bad input: one paragraph and exit code 2, or in a multirun a failed job and the sweep on."""
    from gptlab.run.place import in_multirun

    if not in_multirun():
        return run_task(one_run, cfg, log)
    from gptlab.cli.fit import train
    from gptlab.sweep.jobs import sweep_job  # torch and Lightning: only now

    return sweep_job(train, cfg)


def one_run(cfg: DictConfig) -> float:
    """A single run: model.depth's rules checked (before torch loads), its start planned in its
    run directory (gptlab.run.start), then trained."""
    provenance(cfg)
    from gptlab.cli.fit import train

    return train(cfg, plan_of(cfg, Path(cfg.paths.output_dir)))


def main() -> None:
    """The console script gptlab-train."""
    try:
        sys.argv = plan_argv(sys.argv)
    except ConfigError as e:
        print(f"gptlab-train: {e}", file=sys.stderr)
        sys.exit(BAD_INPUT)
    run_hydra_app(run_job, "gptlab-train")


if __name__ == "__main__":
    main()
