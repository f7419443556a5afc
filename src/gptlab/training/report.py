"""gptlab's own callbacks of a run, made once, and the end of the run (RunReport), told once, in
the process that trains rank 0 whatever the launch path: the test split, metrics.json, the
trackers' results and the report."""

import logging
import math
import os
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from omegaconf import OmegaConf

from gptlab import reader
from gptlab.data.mixture import AVERAGES
from gptlab.errors import ConfigError
from gptlab.run import directory
from gptlab.run.directory import SETTINGS, where
from gptlab.run.logs import SpawnedRank
from gptlab.run.place import PLACE
from gptlab.run.start import Branch
from gptlab.training.callbacks import (
    BranchCheckpoints,
    DivergenceGuard,
    FinalValidation,
    GracefulStop,
    RngState,
    ValidationStep,
)
from gptlab.training.downstream_callback import downstream_results
from gptlab.training.fitting import best_val_loss
from gptlab.training.pruning import pruning_result
from gptlab.training.run_stats import RunStats
from gptlab.training.trackers import StepLoggedBeforeSave, log_results

log = logging.getLogger("gptlab.train")


class RunReport(L.Callback):
    """At the end of fit, on rank 0: the test split, metrics.json, the loggers, the report."""

    def __init__(
        self,
        cfg: dict,
        run_dir: Path,
        stats: RunStats,
        overrides: list[str],
        swept: list[str],
        branch: Branch | None = None,
        rules: dict | None = None,
    ):
        self.cfg = cfg
        self.rules = rules or {}  # model.depth's: each derived key's value and rule's value
        self.run_dir = run_dir
        self.branched = branch  # a cooldown branch's trunk and step (its plan's)
        self.stats = stats
        self.overrides = overrides
        self.swept = swept  # the overrides its sweep varies: the trackers show them first

    def on_fit_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        sample = self.sample(pl_module)  # of the final weights, before the test loads the best
        metrics = merged(self.metrics(trainer, pl_module), self.test(trainer, pl_module))
        PLACE.write_json(directory.metrics_file(self.run_dir), metrics)
        log_results(trainer, OmegaConf.create(self.cfg), metrics, self.run_dir, self.swept)
        log.info("\n".join([*self.report(trainer, metrics), sample]))

    def metrics(self, trainer, pl_module) -> dict:
        """The run's results; a run resumed after its last step has its checkpoint's (RunStats)."""
        last = self.stats.last_validation
        final_loss = float(trainer.callback_metrics.get("val/loss", last.get("val/loss", math.nan)))
        final_bpb = float(trainer.callback_metrics.get("val/bpb", last.get("val/bpb", math.nan)))
        best = best_val_loss(trainer, pl_module)
        best = best if math.isfinite(best) else final_loss
        device = trainer.strategy.root_device
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
        tokens = trainer.global_step * self.stats.tokens_per_step
        rate = self.stats.rate(trainer.global_step, (self.stats.timed_from or 0, 0.0))
        mfu = self.stats.mfu(rate, trainer.world_size)
        names, average = pl_module.mixture()
        cfg = OmegaConf.create(self.cfg)
        train_tokens = 0
        if trainer.datamodule and names is None:
            train_tokens = len(trainer.datamodule.splits["train"])
        return {
            "best_val_loss": best,
            "final_val_loss": final_loss,
            "best_val_perplexity": math.exp(best) if math.isfinite(best) else math.inf,
            # bits per byte and nats per token differ by a constant factor over the same val text
            "best_val_bpb": best * final_bpb / final_loss if final_loss else math.nan,
            "final_val_bpb": final_bpb,
            "num_params": pl_module.model.num_params()["total"],
            "steps": trainer.global_step,
            "max_steps": trainer.max_steps,  # what it was set to train: a FLOP budget's steps
            "tokens_seen": tokens,
            "tokens_per_step": self.stats.tokens_per_step,
            "wall_seconds": round(self.stats.wall_seconds, 3),
            "tokens_per_sec": round(rate, 1),
            "flops_per_token": self.stats.flops_per_token,
            "mfu": None if mfu is None else round(mfu, 4),
            "device": f"{name} x{trainer.world_size}",
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "overrides": self.overrides,  # what a continued sweep recognises its finished jobs by
            "status": "ok",
            "depth": OmegaConf.select(cfg, "model.depth"),  # model.depth=N's rung, None without
            "depth_rules": self.rules,  # {key: {value, rule, derived}}: what the ladder checks
            "settings": {name: OmegaConf.select(cfg, key) for name, key in SETTINGS.items()},
            "val_curve": self.stats.val_curve,  # [step, wall seconds, val loss] per validation
            # what a scaling-law fit reads (docs/scaling.md)
            "flops_budget": self.cfg.get("flops_budget"),
            "train_flops": self.stats.flops_per_token * tokens,
            "scaling_params": pl_module.model.scaling_params(),
            "epochs": tokens / train_tokens if train_tokens else None,
            **downstream_results(trainer),  # the last validation's, where the callback is on
            **self.mixture(trainer, pl_module, names, average),
            **pruning_result(trainer),  # "status": "pruned" when an Optuna pruner stopped it
            **self.branch(trainer),
        }

    def mixture(self, trainer, pl_module, names: list[str] | None, average: str) -> dict:
        """A mixture's values per source and of both averages: at the best val/loss (best.ckpt's),
        at the last validation, and each source's epochs (those trained; those planned)."""
        if names is None:
            return {}
        metrics = trainer.callback_metrics
        last = self.stats.last_validation
        final = {k: metrics.get(k, last.get(k)) for k in last if k.count("/") == 2}
        best = {k[len("best/") :]: v for k, v in metrics.items() if k.startswith("best/val/")}
        best = best or pl_module.best_val_metrics  # resumed after its last step: its checkpoint's
        datamodule = trainer.datamodule
        trained = datamodule.planned_epochs(trainer.global_step, trainer.world_size)
        planned = datamodule.planned_epochs(trainer.max_steps, trainer.world_size)
        # each source's share of the planned train tokens (staged weights: over all stages)
        planned_tokens = {
            name: planned[name] * datamodule.mixture.train_tokens[name] for name in names
        }
        total = sum(planned_tokens.values())
        epochs = {
            "sources": {
                name: {
                    "share": planned_tokens[name] / total if total else None,
                    "epochs": trained[name],
                    "planned_epochs": planned[name],
                }
                for name in names
            }
        }
        result = {"val_average": average, "sources": {n: {} for n in names}, "averages": {}}
        result = merged(result, per_source(best, "val", "best_val", names))
        result = merged(result, per_source(final, "val", "final_val", names))
        result = merged(result, epochs)
        # the most repeated source's: what a scaling fit's warning reads
        result["epochs"] = max(trained.values())
        # exact: a macro average's bpb is no constant factor of its loss, as one val text's is
        best_bpb = result["averages"].get(average, {}).get("best_val_bpb")
        result["best_val_bpb"] = math.nan if best_bpb is None else best_bpb
        return result

    def branch(self, trainer) -> dict:
        """A cooldown branch: its trunk and step; its own FLOPs (train_flops adds the trunk's
        share up to that step, counted at the branch's tokens per step)."""
        if self.branched is None:
            return {}
        step = self.branched.step
        own = (trainer.global_step - step) * self.stats.tokens_per_step
        return {
            "branched_from": {"run_dir": str(self.branched.trunk), "step": step},
            "branch_train_flops": self.stats.flops_per_token * own,
        }

    def test(self, trainer, pl_module) -> dict:
        """best.ckpt (else the final weights) on the whole test split, on rank 0 alone: a
        mixture's on each source's (its values under "sources" and "averages")."""
        datamodule = trainer.datamodule
        if datamodule is None or datamodule.test_fraction == 0 or trainer.global_step == 0:
            return {}
        best = directory.best_checkpoint(self.run_dir)
        scored = "the final weights"
        if best.is_file():
            pl_module.load_state_dict(reader.load_checkpoint(best)["state_dict"])
            scored = f"{directory.CHECKPOINTS}/{best.name}"
        names, average = pl_module.mixture()
        loaders = [datamodule.windows_of("test", source=name) for name in names or [None]]
        with trainer.precision_plugin.test_step_context():
            scores = pl_module.score(loaders, names, average)
        loss, bpb = scores["test/loss"], scores["test/bpb"]
        log.info("Test loss %.4f (%.3f bits per byte) of %s.", loss, bpb, scored)
        return {"test_loss": loss, "test_bpb": bpb, **per_source(scores, "test", "test", names)}

    def sample(self, pl_module) -> str:
        try:
            return f"Sample: {pl_module.sample(self.cfg['sample_prompt'], max_new_tokens=40)!r}"
        except ConfigError as e:
            return f"No sample: {e}"

    def report(self, trainer, m: dict) -> list[str]:
        """Its tokens over its seconds: a branch's own (from its step), not its trunk's too."""
        first = self.stats.timed_from or 0
        steps = f"{m['steps']} steps"
        if first:
            steps += f" ({m['steps'] - first} of them this branch's, from step {first})"
        tokens = (m["steps"] - first) * m["tokens_per_step"]
        wall = m["wall_seconds"]
        seconds = f"{wall:.1f}" if wall < 10 else f"{wall:.0f}"
        lines = [
            f"Done: {steps}, {tokens:,} tokens in {seconds} s "
            f"({m['tokens_per_sec']:,.0f} tokens/s on {m['device']}).",
            f"Best val loss {m['best_val_loss']:.4f} (perplexity {m['best_val_perplexity']:.1f}, "
            f"{m['best_val_bpb']:.3f} bits per byte), final {m['final_val_loss']:.4f}.",
            f"Run directory: {self.run_dir}",
        ]
        if trainer.checkpoint_callback is not None and trainer.checkpoint_callback.best_model_path:
            lines.append(f"Best checkpoint: {trainer.checkpoint_callback.best_model_path}")
        for logger in trainer.loggers:  # where its events are: the run, or a folder shared by
            if isinstance(logger, TensorBoardLogger):  # runs (each one a TensorBoard run there)
                inside = where(logger.log_dir).is_relative_to(where(self.run_dir))
                logdir = self.run_dir if inside else where(logger.root_dir)
                lines.append(f"TensorBoard: tensorboard --logdir {logdir}")
        return lines


def per_source(values: dict, split: str, key: str, names: list[str] | None) -> dict:
    """{"sources": {source: {`key`_loss, `key`_bpb}}, "averages": {micro: ..., macro: ...}} from
    a mixture's `split`/<name>/loss and /bpb values; {} for one source."""
    if names is None:
        return {}
    found = {}
    for metric, value in values.items():
        parts = metric.split("/")
        if len(parts) == 3 and parts[0] == split:
            found.setdefault(parts[1], {})[f"{key}_{parts[2]}"] = float(value)
    return {
        "sources": {name: found.get(name, {}) for name in names},
        "averages": {name: found.get(name, {}) for name in AVERAGES},
    }


def merged(metrics: dict, more: dict) -> dict:
    """`metrics` with `more`'s keys, a mixture's tables (sources, averages) merged by name."""
    result = {**metrics, **more}
    for table in ("sources", "averages"):
        if table in metrics and table in more:
            names = {**metrics[table], **more[table]}
            result[table] = {
                n: {**metrics[table].get(n, {}), **more[table].get(n, {})} for n in names
            }
    return result


def run_callbacks(
    cfg,
    run_dir: Path,
    stats: RunStats,
    length,
    overrides: list[str],
    swept: list[str],
    branch,
    rules: dict,
) -> list[L.Callback]:
    """gptlab's own callbacks of a run, in the order Lightning calls them: its `stats` first,
    the run's end (RunReport, told its job's overrides, those its sweep varies and model.depth's
    `rules`) last."""
    return [
        SpawnedRank(run_dir),
        stats,
        StepLoggedBeforeSave(),
        ValidationStep(),
        FinalValidation(),
        GracefulStop(),
        RngState(),
        DivergenceGuard(),
        BranchCheckpoints(length.branch_steps, str(run_dir)),
        RunReport(OmegaConf.to_container(cfg), run_dir, stats, overrides, swept, branch, rules),
    ]
