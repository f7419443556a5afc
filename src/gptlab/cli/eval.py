"""gptlab-eval (usage: conf/eval.yaml): a checkpoint's exact val loss, perplexity and bits per
byte, by the run's own validation step on its own windows (split=test: its test step); with
tasks=[...], its downstream scores instead, of a checkpoint, a run or a Hugging Face folder
(docs/downstream.md)."""

import logging
import math
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from gptlab import reader
from gptlab.cli.app import resolve_device, run_hydra_app, run_task
from gptlab.cli.eval_record import own_run_of, read_results, write_result
from gptlab.cli.eval_tasks import evaluate_tasks
from gptlab.config.resolve import resolved
from gptlab.config.schemas import register_configs
from gptlab.errors import ConfigError
from gptlab.run import directory
from gptlab.run.directory import saved_by_latest_start
from gptlab.run.place import PLACE, STORE_KEYS, WHERE_KEYS

log = logging.getLogger("gptlab.eval")
register_configs()  # the unique_dir resolver of the output directory


def evaluate(cfg: DictConfig) -> dict:
    """Validate the checkpoint as its run did; print and write the result; return it."""
    if cfg.get("tasks"):
        return evaluate_tasks(cfg)
    device = resolve_device(cfg.device)
    from gptlab.run.checkpoints import find_checkpoint
    from gptlab.run.logs import route_lightning_logs

    route_lightning_logs()  # Lightning's messages as the run's, its known noise left out
    cfg = resolved(cfg)
    checkpoint = Path(find_checkpoint(cfg.ckpt_path).absolute())
    run_dir = own_run_of(checkpoint)
    data, trainer_cfg = run_settings(run_dir)
    given = OmegaConf.to_container(cfg.data)
    other = {k: v for k, v in given.items() if v is not None and k not in STORE_KEYS}
    if other:  # the run's limit on validation batches is for its own data
        trainer_cfg.pop("limit_val_batches", None)
    if "path" in other or "url" in other:  # another text: none of the run's corpus, all of the text
        data.update(url=None, path=None, sha256=None, val_fraction=1.0, val_tokens=None)
    data.update(data_dir=cfg.data.data_dir, cache_dir=cfg.data.cache_dir)  # eval's, not the run's
    places = [PLACE.admit(run_dir, "ckpt_path", own=True)] if run_dir else []
    places.append(PLACE.run_dir or Path(cfg.output_dir))
    read_results(places[0] / directory.EVAL)  # a corrupt one is refused before the long part
    split = check_split(cfg.split, data, other)
    result, datamodule = score(checkpoint, split, {**data, **other}, trainer_cfg, device)
    own = run_dir is not None
    lines = [
        f"Checkpoint: {checkpoint} (step {result['step']})",
        f"Data: {f'the {split} split' if datamodule.val_fraction < 1 else 'all'} of "
        f"{result['corpus']}{'' if own or other else ' (default data settings: not your run)'}",
        f"{f'{split} loss:':<12}{result[f'{split}_loss']:.6f} nats per token",
        f"perplexity: {result[f'{split}_perplexity']:.4f}",
        f"bpb:        {result[f'{split}_bpb']:.6f} bits per byte",
    ]
    lines += source_table(result, split)
    if own and not other:  # the run's own logged figure beside it
        lines += logged_line(run_dir, checkpoint, split, result["step"])
    label = f"{checkpoint.name} on {result['corpus']} (val_fraction {datamodule.val_fraction})"
    label = label if split == "val" else f"{label}, test split"
    lines += write_result(places, label, result)
    print("\n".join(lines), flush=True)
    return result


def score(checkpoint: Path, split: str, data: dict, trainer_cfg: dict, device: str):
    """(the result, the data module): the checkpoint's weights, bounded, on its own windows."""
    import lightning as L

    from gptlab.data.datamodule import GPTDataModule
    from gptlab.run.checkpoints import load_model
    from gptlab.training.module import GPTModule

    model, tokenizer, step = load_model(checkpoint)
    tokenizer_state = tokenizer.state_dict()
    module = GPTModule(model, optim={}, tokenizer=tokenizer_state)
    most = module.config.context_length  # windows of the model's length unless the run or cfg says
    settings = {"context_length": most, **data, "tokenizer": module.tokenizer_state}
    if settings["context_length"] > most:
        raise ConfigError(
            f"data.context_length={settings['context_length']}: the model reads at most "
            f"{most} tokens at a time; give that or less."
        )
    datamodule = GPTDataModule(**settings)
    trainer = L.Trainer(
        accelerator=device,
        devices=1,
        precision=trainer_cfg.get("precision") or "32-true",
        limit_val_batches=trainer_cfg.get("limit_val_batches") or 1.0,
        limit_test_batches=trainer_cfg.get("limit_test_batches") or 1.0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=PLACE.run_dir,
    )  # not the cwd, where SLURM leaves hpc_ckpt files
    (trainer.test if split == "test" else trainer.validate)(module, datamodule, verbose=False)
    from gptlab.training.report import per_source

    metrics = {name: float(value) for name, value in trainer.callback_metrics.items()}
    loss, bpb = metrics[f"{split}/loss"], metrics[f"{split}/bpb"]
    names = datamodule.source_names
    result = {
        "checkpoint": str(checkpoint),
        "step": step,
        "corpus": corpus_of(datamodule),
        "val_fraction": datamodule.val_fraction,
        "context_length": datamodule.context_length,
        f"{split}_loss": loss,
        f"{split}_perplexity": math.exp(loss),
        f"{split}_bpb": bpb,
    }
    if names is not None:  # a mixture's: each source's values, and both averages
        result["val_average"] = datamodule.settings.val_average
        result.update(per_source(metrics, split, split, names))
    return result, datamodule


def corpus_of(datamodule) -> str:
    """The corpus file (or folder, glob, dataset); a mixture's: each source's, by name."""
    names = datamodule.source_names
    if names is None:
        return str(datamodule.corpus_path())
    return ", ".join(f"{name}: {datamodule.corpus_path(name)}" for name in names)


def source_table(result: dict, split: str) -> list[str]:
    """A mixture's loss and bpb of each source and of both averages, one line each."""
    if "sources" not in result:
        return []
    rows = {**result["sources"], **result["averages"]}
    width = max(len(name) for name in rows) + 2
    average = f"{split} loss above: the {result['val_average']} average"
    lines = [f"{'source':<{width}}{'loss':>10}{'bpb':>11}   ({average})"]
    for name, values in rows.items():
        lines.append(
            f"{name:<{width}}{values[f'{split}_loss']:>10.6f}{values[f'{split}_bpb']:>11.6f}"
        )
    return lines


def logged_line(run_dir: Path, checkpoint: Path, split: str, step: int) -> list[str]:
    """What the run itself logged for these weights, from its own metrics.json (read as data)."""
    from gptlab.sweep.stats import number

    metrics = reader.read_json(directory.metrics_file(run_dir))
    metrics = metrics if isinstance(metrics, dict) else {}
    best = checkpoint == directory.best_checkpoint(run_dir)
    logged = {"val": ("best_val_loss", "final_val_loss"), "test": ("test_loss", None)}[split]
    key = logged[0] if best else logged[1]
    value = number(metrics.get(key))
    if value is None or (key == "final_val_loss" and step != metrics.get("steps")):
        return []
    sources = metrics.get("sources")
    logged_sources = []
    for name, values in (sources if isinstance(sources, dict) else {}).items():
        source_value = number(values.get(key)) if isinstance(values, dict) else None
        if source_value is not None:
            logged_sources.append(f"{name} {source_value:.6f}")
    each = f" ({', '.join(logged_sources)})" if logged_sources else ""
    return [f"The run logged {key} = {value:.6f}{each} for these weights."]


def run_settings(run_dir: Path | None) -> tuple[dict, dict]:
    """An own run's data and trainer settings from its latest start's saved config, as literal
    values (where its data lay is eval's own to say; nothing is resolved); anyone else's: none."""
    saved = saved_by_latest_start(run_dir, directory.SAVED_CONFIG) if run_dir else None
    saved = saved if isinstance(saved, dict) else {}
    found = [literal(saved.get(group)) for group in ("data", "trainer")]
    unresolved = [f"data.{k}" for k, v in found[0].items() if isinstance(v, str) and "${" in v]
    if unresolved:
        raise ConfigError(
            f"ckpt_path: the run's config sets {', '.join(unresolved)} by an interpolation, which "
            "gptlab-eval does not resolve from a saved config. Give the text to evaluate instead: "
            "data.path=/some/file.txt (or data.url=https://...)."
        )
    return found[0], found[1]


def literal(node) -> dict:
    """A saved config node's settings, but where it wrote and how it was built and seeded."""
    node = node if isinstance(node, dict) else {}
    return {k: v for k, v in node.items() if k not in (*WHERE_KEYS, "seed", "_target_")}


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
