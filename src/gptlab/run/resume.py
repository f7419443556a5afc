"""What a start's checkpoint or folder gives the task (its plan: gptlab.run.start): an own
checkpoint that Lightning restores whole (a run or sweep continued, an own run's checkpoint, a
branch's trunk), or weights that start a new run at step 0 (anyone else's checkpoint, a Hugging
Face folder's; docs/security.md)."""

import logging
from typing import NamedTuple

from gptlab.errors import ConfigError
from gptlab.run.checkpoints import Trained, read_trained
from gptlab.run.start import BRANCH, CONTINUED, FOREIGN_CHECKPOINT, INIT_FROM, Plan

log = logging.getLogger(__name__)


class Start(NamedTuple):
    """Where a run starts from. `whole`: an own checkpoint, `ckpt_path`, that Lightning restores
    whole (trainer.fit(ckpt_path=...): the run's own last.ckpt, or another own run's, which goes
    on in this one). Else `trained`'s weights start a new run at step 0: a checkpoint of anyone
    else's (ckpt_path=), or a Hugging Face folder's (init_from=, its architecture too)."""

    ckpt_path: str | None = None
    whole: bool = False
    trained: Trained | None = None  # the checkpoint's or the folder's: settings (weights)

    @property
    def step(self) -> int | None:
        """The step Lightning restores (a resumed TensorBoard log drops what came after it)."""
        return self.trained.step if self.whole else None

    @property
    def source(self) -> str:
        """What its weights come from, as an error names it."""
        return f"ckpt_path: '{self.ckpt_path}'" if self.ckpt_path else "init_from"

    @property
    def init(self) -> Trained | None:
        """A folder's or a foreign checkpoint's weights, loaded into a new run's model."""
        return None if self.whole else self.trained


def starting_point(plan: Plan, data) -> Start:
    """The checkpoint `plan` starts from, read (its tensors only where they are data), or the
    folder init_from reads (checked against the `data` config): before any data."""
    if plan.kind == INIT_FROM:
        from gptlab.run.hf_folder import read_folder

        log.info("Starting from the weights of init_from=%s", plan.init_from)
        return Start(trained=read_folder(plan.init_from, data))
    if plan.checkpoint is None:
        return Start()
    if plan.kind in CONTINUED:
        log.info("Continuing from %s", plan.checkpoint)
    whole = plan.kind != FOREIGN_CHECKPOINT  # continued as it was, or anyone's weights as data
    trained = read_trained(plan.checkpoint, tensors=not whole)
    if plan.kind == BRANCH and trained.step != plan.branch.step:
        raise ConfigError(
            f"branch_step={plan.branch.step}: '{plan.checkpoint}' holds step {trained.step}, "
            "not the step its name says: it was renamed or damaged. Give another branch_step."
        )
    return Start(str(plan.checkpoint), whole, trained)
