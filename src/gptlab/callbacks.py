"""Lightning callbacks: throughput and run statistics, text samples in TensorBoard."""

from __future__ import annotations

import logging
import time

import lightning as L
import torch
from lightning.fabric.utilities.throughput import get_available_flops
from lightning.pytorch.loggers import TensorBoardLogger

log = logging.getLogger(__name__)


def flops_per_token(config) -> float:
    """Training FLOPs per token: 6 per weight (forward + backward) plus attention's T·d terms."""
    d, layers, ctx = config.d_model, config.num_blocks, config.context_length
    weights = layers * (4 + 2 * config.ffn_mult) * d * d + d * config.vocab_size  # blocks + head
    return 6 * weights + 12 * layers * ctx * d


class RunStats(L.Callback):
    """Tokens seen, training time and tokens/s (model FLOPs utilisation on GPUs).

    Validation time is left out of the rate; wall time covers the whole fit.
    """

    def __init__(self):
        self.tokens_seen = 0
        self.train_seconds = 0.0
        self.wall_seconds = 0.0
        self.last_val_step = -1
        self._fit_start = self._window_start = 0.0
        self._wall_before = 0.0  # wall time of the runs this one resumes
        self._window_tokens = 0
        self._peak_flops: float | None = None

    def on_fit_start(self, trainer, pl_module) -> None:
        self._fit_start = time.perf_counter()
        if trainer.strategy.root_device.type == "cuda":
            dtype = torch.bfloat16 if "bf16" in str(trainer.precision) else torch.float32
            self._peak_flops = get_available_flops(trainer.strategy.root_device, dtype)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not self._window_start:
            self._window_start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        tokens = batch[0].numel() * trainer.world_size
        self.tokens_seen += tokens
        self._window_tokens += tokens
        if trainer.global_step % trainer.log_every_n_steps == 0:
            self._close_window(pl_module)

    def _close_window(self, pl_module) -> None:
        elapsed = time.perf_counter() - self._window_start
        if not self._window_start or elapsed <= 0 or not self._window_tokens:
            return
        self.train_seconds += elapsed
        rate = self._window_tokens / elapsed
        pl_module.log("train/tokens_per_sec", rate)
        if self._peak_flops:
            mfu = rate * flops_per_token(pl_module.config) / (self._peak_flops * pl_module.trainer.world_size)
            pl_module.log("train/mfu", mfu)
        self._window_start, self._window_tokens = time.perf_counter(), 0

    def on_validation_start(self, trainer, pl_module) -> None:
        if self._window_start:  # validation inside fit: pause the training clock
            self.train_seconds += time.perf_counter() - self._window_start
            self._window_start = 0.0

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.last_val_step = trainer.global_step
        self._window_tokens = 0

    def on_fit_end(self, trainer, pl_module) -> None:
        if self._window_start:
            self.train_seconds += time.perf_counter() - self._window_start
            self._window_start = 0.0
        self.wall_seconds = self._wall_before + time.perf_counter() - self._fit_start

    def state_dict(self) -> dict:
        """Carried in checkpoints, so a resumed run reports totals over its whole life."""
        wall = self._wall_before + time.perf_counter() - self._fit_start
        return {"tokens_seen": self.tokens_seen, "train_seconds": self.train_seconds, "wall_seconds": wall}

    def load_state_dict(self, state_dict: dict) -> None:
        self.tokens_seen = state_dict["tokens_seen"]
        self.train_seconds = state_dict["train_seconds"]
        self._wall_before = state_dict["wall_seconds"]

    @property
    def tokens_per_sec(self) -> float:
        return self.tokens_seen / self.train_seconds if self.train_seconds else 0.0


class TextSample(L.Callback):
    """After each validation, a sample for a fixed prompt goes to TensorBoard's Text tab."""

    def __init__(self, prompt: str = "The salesperson", max_new_tokens: int = 40,
                 temperature: float = 0.8, top_k: int | None = 50):
        self.prompt, self.max_new_tokens = prompt, max_new_tokens
        self.temperature, self.top_k = temperature, top_k

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        text = pl_module.sample(self.prompt, self.max_new_tokens, self.temperature, self.top_k)
        log.debug("step %d sample: %s", trainer.global_step, text)
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                # two trailing spaces: a Markdown line break, so newlines survive in the Text tab
                logger.experiment.add_text("samples", text.replace("\n", "  \n"), trainer.global_step)
