"""The console's progress bar: Lightning's, counting optimizer steps up to max_steps."""

from lightning.pytorch.callbacks import TQDMProgressBar


class StepProgressBar(TQDMProgressBar):
    """Lightning's TQDM bar counting steps up to max_steps: a resume keeps its total and ETA."""

    def on_train_start(self, trainer, *args) -> None:
        super().on_train_start(trainer, *args)
        self.count_steps(trainer)  # a resume mid-epoch starts no epoch

    def on_train_epoch_start(self, trainer, *args) -> None:
        super().on_train_epoch_start(trainer, *args)
        self.count_steps(trainer)

    def count_steps(self, trainer) -> None:
        if trainer.max_steps > 0 and self.train_progress_bar is not None:
            bar = self.train_progress_bar
            bar.reset(total=trainer.max_steps)
            bar.initial = trainer.global_step  # the rate and ETA count this start's steps only
            bar.n = trainer.global_step
            bar.set_description(self.train_description)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.max_steps <= 0:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            return
        bar = self.train_progress_bar
        step = trainer.global_step
        if bar is None or bar.disable or not self.refresh_rate:
            return
        if step % self.refresh_rate == 0 or step >= trainer.max_steps:
            bar.update(step - bar.n)
            bar.set_postfix(self.get_metrics(trainer, pl_module))

    def get_metrics(self, trainer, pl_module) -> dict:
        """Without the logger's version (v_num): a sweep job's is its name, cut to four letters."""
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics
