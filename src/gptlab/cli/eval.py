"""gptlab-eval (usage: conf/eval.yaml): a checkpoint's exact val loss, perplexity and bits per
byte, by the run's own validation step on its own windows (split=test: its test step)."""

import logging
import math
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from gptlab import files
from gptlab.cli.app import resolve_device, run_hydra_app, run_task
from gptlab.config.schemas import register_configs
from gptlab.errors import ConfigError
from gptlab.run import directory, ownership, place
from gptlab.run.settings import WHERE, literal_node

log = logging.getLogger("gptlab.eval")
register_configs()  # the unique_dir resolver of the output directory


def read_results(path: Path) -> dict:
    """The results saved in `path` before ({} if none); anything else there is refused, not lost."""
    if not path.is_file() or path.is_symlink():  # never read through a link
        return {}
    saved = files.read_json(path)
    if not isinstance(saved, dict):
        raise ConfigError(
            f"'{path}' is not gptlab-eval's JSON record of results, so the new result cannot be "
            "added to it. Move it away (or delete it) and run gptlab-eval again."
        )
    return saved


def run_of(checkpoint: Path) -> tuple[Path | None, ownership.Manifest | None]:
    """The checkpoint's run directory (links not followed) and its manifest if it is the user's."""
    if checkpoint.parent.name != directory.CHECKPOINTS:
        return None, None
    run_dir = checkpoint.parent.parent
    try:
        return run_dir, ownership.check_run(run_dir)
    except ownership.ForeignDirectory as e:
        log.info(
            "'%s' is not a run directory of yours (%s): its settings are not read.", run_dir, e
        )
        return run_dir, None


def evaluate(cfg: DictConfig) -> dict:
    """Validate the checkpoint as its run did; print and write the result; return it."""
    device = resolve_device(cfg.device)
    import lightning as L

    from gptlab.data.datamodule import GPTDataModule
    from gptlab.run.checkpoints import find_checkpoint, read_trained
    from gptlab.run.logs import route_lightning_logs
    from gptlab.training.module import GPTModule

    route_lightning_logs()  # Lightning's messages as the run's, its known noise left out

    place.check_data_places(cfg.data.data_dir, cfg.data.cache_dir)
    checkpoint = Path(find_checkpoint(cfg.ckpt_path).absolute())
    run_dir, manifest = run_of(checkpoint)
    data, trainer_cfg = run_settings(manifest)
    given = OmegaConf.to_container(cfg.data, resolve=True)
    other = {k: v for k, v in given.items() if v is not None and k not in WHERE}
    if "path" in other or "url" in other:  # another text: none of the run's corpus, all of the text
        data.update(url=None, path=None, sha256=None, val_fraction=1.0, val_tokens=None)
    data.update(data_dir=cfg.data.data_dir, cache_dir=cfg.data.cache_dir)  # eval's, not the run's
    own = manifest is not None
    places = ([run_dir] if own else []) + [Path(cfg.output_dir)]
    read_results(places[0] / directory.EVAL)  # a corrupt one is refused before the long part
    split = check_split(cfg.split, data, other)
    trained = read_trained(checkpoint)
    module = GPTModule(model=trained.model, optim={}, tokenizer=trained.tokenizer)
    module.load_state_dict(trained.weights)
    most = module.config.context_length  # windows of the model's length unless the run or cfg says
    settings = {"context_length": most, **data, **other, "tokenizer": module.tokenizer_state}
    if settings["context_length"] > most:
        raise ConfigError(
            f"data.context_length={settings['context_length']}: the model reads at most "
            f"{most} tokens at a time; give that or less."
        )
    datamodule = GPTDataModule(**settings)
    own_data = own and not other
    trainer = L.Trainer(
        accelerator=device,
        devices=1,
        precision=trainer_cfg.get("precision") or "32-true",
        limit_val_batches=(trainer_cfg.get("limit_val_batches") if own_data else None) or 1.0,
        limit_test_batches=trainer_cfg.get("limit_test_batches") or 1.0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=cfg.output_dir,
    )  # not the cwd, where SLURM leaves hpc_ckpt files
    (trainer.test if split == "test" else trainer.validate)(module, datamodule, verbose=False)
    loss, bpb = (float(trainer.callback_metrics[f"{split}/{k}"]) for k in ("loss", "bpb"))
    result = {
        "checkpoint": str(checkpoint),
        "step": trained.step,
        "corpus": str(datamodule.corpus_path()),
        "val_fraction": datamodule.val_fraction,
        "context_length": datamodule.context_length,
        f"{split}_loss": loss,
        f"{split}_perplexity": math.exp(loss),
        f"{split}_bpb": bpb,
    }
    lines = [
        f"Checkpoint: {checkpoint} (step {result['step']})",
        f"Data: {f'the {split} split' if datamodule.val_fraction < 1 else 'all'} of "
        f"{result['corpus']}{'' if own or other else ' (default data settings: not your run)'}",
        f"{split} loss:  {' ' * (split == 'val')}{loss:.6f} nats per token",
        f"perplexity: {math.exp(loss):.4f}",
        f"bpb:        {bpb:.6f} bits per byte",
    ]
    lines += logged_line(run_dir, checkpoint, split, result["step"]) if own_data else []
    label = f"{checkpoint.name} on {result['corpus']} (val_fraction {datamodule.val_fraction})"
    label = label if split == "val" else f"{label}, test split"
    lines += write_result(places, label, result)
    print("\n".join(lines), flush=True)
    return result


def logged_line(run_dir: Path, checkpoint: Path, split: str, step: int) -> list[str]:
    """What the run itself logged for these weights, from its own metrics.json (read as data)."""
    from gptlab.sweep.stats import number

    metrics = files.read_json(directory.metrics_file(run_dir))
    metrics = metrics if isinstance(metrics, dict) else {}
    best = checkpoint == directory.best_checkpoint(run_dir)
    logged = {"val": ("best_val_loss", "final_val_loss"), "test": ("test_loss", None)}[split]
    key = logged[0] if best else logged[1]
    value = number(metrics.get(key))
    if value is None or (key == "final_val_loss" and step != metrics.get("steps")):
        return []
    return [f"The run logged {key} = {value:.6f} for these weights."]


def write_result(outs: list[Path], label: str, result: dict) -> list[str]:
    """Add the result to eval.json beside an own run, else (or read-only) in the output dir."""
    notes = []
    for out in outs:
        eval_file = out / directory.EVAL
        try:
            saved = read_results(eval_file)
            files.write_json(eval_file, {**saved, label: result})
            return [*notes, f"Written: {eval_file}"]
        except OSError as e:
            notes.append(f"Could not write {eval_file} ({e.strerror}).")
    return notes


def run_settings(manifest: ownership.Manifest | None) -> tuple[dict, dict]:
    """An own run's data and trainer settings from its latest recorded saved config, as literal
    data, never resolved (where data goes is eval's own); anyone else's run: none."""
    if manifest is None:
        return {}, {}
    recorded = manifest.data["files"]
    starts = [s for s in manifest.starts if f"{s}/{directory.SAVED_CONFIG}" in recorded]
    path = directory.saved_config(manifest.root, starts[-1]) if starts else None
    saved = files.read_yaml(path) if path is not None else None
    saved = saved if isinstance(saved, dict) else {}
    data, dropped = literal_node(saved.get("data"), "data")
    trainer, _ = literal_node(saved.get("trainer"), "trainer")
    dropped = [d for d in dropped if d.split(".")[-1] not in (*WHERE, "seed", "_target_")]
    if dropped:
        raise ConfigError(
            f"ckpt_path: the run's config '{path}' sets {', '.join(dropped)} to something other "
            "than a literal value (an interpolation or a node); gptlab-eval reads a run's "
            "settings as data and resolves nothing. Give the text to evaluate instead: "
            "data.path=/some/file.txt (or data.url=https://...)."
        )
    data = {k: v for k, v in data.items() if k not in (*WHERE, "seed", "_target_")}
    return data, trainer


def check_split(split: str, data: dict, other: dict) -> str:
    """The split to score; split=test needs the run's corpus and its data.test_fraction."""
    if split not in ("val", "test"):
        raise ConfigError(f"split={split!r}: choose val or test.")
    another_text = "path" in other or "url" in other
    if split == "test" and (another_text or not {**data, **other}.get("test_fraction")):
        raise ConfigError(
            "split=test: the test split is the one the run held out (data.test_fraction > 0 when "
            "it trained): it needs the run's corpus and its test_fraction (read from a run "
            "directory of yours, or given as data.test_fraction=...); here there is none. Train "
            "with data.test_fraction=0.1, or use split=val."
        )
    return split


@hydra.main(version_base="1.3", config_path="pkg://gptlab.conf", config_name="eval")
def run_job(cfg: DictConfig) -> dict:  # tests pass it a composed cfg
    return run_task(evaluate, cfg, log)


def main() -> None:  # the console script gptlab-eval
    run_hydra_app(run_job, "gptlab-eval")


if __name__ == "__main__":
    main()
