"""What the model can do, as it trains: downstream tasks scored at each validation (OLMo-core's
in-loop evaluator, on gptlab.training.downstream's scorer), logged to every logger and kept for
metrics.json (docs/training.md)."""

import math
import time

import lightning as L

from gptlab.data.tasks import load_tasks
from gptlab.errors import whole_number
from gptlab.training.downstream import TaskScore, aggregate, score_tasks

PREFIX = "downstream"  # the logged names: downstream/<task>/<score>, downstream/<aggregate>
LOGGED = ("acc", "acc_norm", "bpb", "centred")  # each task's, at each validation
COUNTED = {"n": "n", "chance": "random", "n_oov": "n_oov", "n_cut": "n_cut"}  # metrics.json's
AGGREGATED = ("core", "acc", "bpb")  # over the tasks, each weighing the same


class DownstreamScores(L.Callback):
    """At each validation but the sanity check, the first `max_items` items of each task (the
    same items every time: the tasks' fixed seeded order) scored by rank 0 in eval mode, their
    scores broadcast and logged by every rank: downstream/<task>/{acc,acc_norm,bpb,centred} and
    downstream/{core,acc,bpb}. Nothing random is drawn and the data's generators are not
    touched: the training batches are those of a run without it. The tasks are read when the
    callback is built, before the corpus and the model (a missing task: exit 2 at once), and
    tokenized once, at the first validation (the model's tokenizer and window)."""

    def __init__(
        self,
        tasks: list[str],
        data_dir: str,
        cache_dir: str,
        max_items: int | None = 100,
        batch_size: int = 32,
        num_shots: int = 0,
    ):
        self.max_items = whole_number("callbacks.downstream.max_items", max_items, none=True)
        self.batch_size = whole_number("callbacks.downstream.batch_size", batch_size)
        self.tasks = load_tasks(tasks, data_dir, cache_dir, num_shots)
        self.last: dict = {}  # the last validation's scores, as metrics.json holds them
        self.seconds = 0.0  # spent scoring over the run's life (its cost: scripts/benchmark)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        scores = None
        if trainer.is_global_zero:
            began = time.perf_counter()
            found = score_tasks(
                pl_module.model, pl_module.tokenizer, self.tasks, self.max_items, self.batch_size
            )
            self.seconds += time.perf_counter() - began
            scores = self.flat(found, trainer.global_step)
            scores[f"{PREFIX}/seconds"] = round(self.seconds, 3)
        scores = trainer.strategy.broadcast(scores, src=0)
        self.last = scores
        logged = {key: value for key, value in scores.items() if is_logged(key)}
        pl_module.log_dict(logged, sync_dist=False)  # alike on every rank: no reduction

    @staticmethod
    def flat(found: dict[str, TaskScore], step: int) -> dict:
        """The scores by their names (metrics.json's keys), the counts and the step with them."""
        scores = {}
        for task, score in found.items():
            values = score.as_dict()
            scores.update({f"{PREFIX}/{task}/{key}": values[key] for key in LOGGED})
            scores.update({f"{PREFIX}/{task}/{key}": values[of] for key, of in COUNTED.items()})
        overall = aggregate(found)
        scores.update({f"{PREFIX}/{key}": overall[key] for key in AGGREGATED})
        scores[f"{PREFIX}/step"] = step
        return scores

    def state_dict(self) -> dict:
        """Kept in checkpoints: a run resumed after its last step reports them again."""
        return {"last": self.last, "seconds": self.seconds}

    def load_state_dict(self, state_dict: dict) -> None:
        self.last = state_dict.get("last", {})
        self.seconds = state_dict.get("seconds", 0.0)


def is_logged(key: str) -> bool:
    """A score the loggers get (each task's LOGGED, the AGGREGATED), not a count."""
    parts = key.split("/")
    return parts[-1] in (LOGGED if len(parts) == 3 else AGGREGATED)


def downstream_results(trainer) -> dict:
    """The last validation's downstream scores for metrics.json (none without the callback);
    a score that is not a finite number is written as null."""
    results = {}
    for callback in trainer.callbacks:
        if isinstance(callback, DownstreamScores):
            results.update(callback.last)
    return {k: v if v is None or math.isfinite(v) else None for k, v in results.items()}
