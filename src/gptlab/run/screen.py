"""A run's first screen: the config tree (saved as config_tree.log), the model, its directory."""

import io
import logging
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.tree import Tree

from gptlab.data.windows import every_window
from gptlab.model.gpt import GPT
from gptlab.run import directory, place
from gptlab.run.place import PLACE

log = logging.getLogger("gptlab.train")
GROUPS = ("data", "model", "optim", "trainer", "callbacks", "logger", "paths")


class ScreenDumper(yaml.SafeDumper):
    """YAML as a person reads it: a large whole float as written (flops_budget=4e10: 4e+10, not
    40000000000.0); .hydra/config.yaml keeps the exact value."""


def represent_float(dumper: yaml.SafeDumper, value: float) -> yaml.ScalarNode:
    if value.is_integer() and abs(value) >= 1e6:
        return dumper.represent_scalar("tag:yaml.org,2002:str", f"{value:g}")  # read plain
    return dumper.represent_float(value)


ScreenDumper.add_representer(float, represent_float)


def as_yaml(settings: dict) -> str:
    return yaml.dump(settings, Dumper=ScreenDumper, sort_keys=False, allow_unicode=True)


def config_tree(cfg: DictConfig) -> Tree:
    """The composed config, a branch per group, unset keys hidden."""
    tree = Tree("config", guide_style="dim")
    rest = {k: v for k, v in cfg.items() if k not in GROUPS}
    for name, node in [*((g, cfg[g]) for g in GROUPS if g in cfg), ("(top level)", rest)]:
        settings = {
            k: v
            for k, v in OmegaConf.to_container(OmegaConf.create(node), resolve=True).items()
            if v is not None
        }  # unset keys (null) stay in .hydra/config.yaml
        tree.add(f"[bold]{name}[/bold]").add(as_yaml(settings).rstrip() if settings else "{}")
    return tree


def scored_val_tokens(
    datamodule, limit: int | float, world_size: int, source: str | None = None
) -> int:
    """The val tokens a validation scores (of a mixture's source): of each rank's share of the
    windows, the batches trainer.limit_val_batches keeps (an int: that many, a float: that
    fraction, as Lightning)."""
    T = datamodule.context_length
    batches = every_window(datamodule.evaluated("val", source), T, datamodule.batch_size)
    shares = [batches[rank::world_size] for rank in range(world_size)]
    kept = [s[: limit if isinstance(limit, int) else int(len(s) * limit)] for s in shares]
    return T * sum(len(batch) for share in kept for batch in share)


def corpus_line(datamodule, trainer, source: str | None = None) -> str:
    """`<corpus>: N tokens (train, val, test); a validation covers ...`, of a source."""
    train, val, test = (len(datamodule.part(split, source)) for split in ("train", "val", "test"))
    covered = datamodule.evaluated("val", source)
    limit = trainer.limit_val_batches
    scored = scored_val_tokens(datamodule, limit, trainer.world_size, source)
    what = f"{'all' if covered == val else 'the first'} {covered:,} val tokens"
    if scored < scored_val_tokens(datamodule, 1.0, trainer.world_size, source):
        what = f"{scored:,} of the {val:,} val tokens (trainer.limit_val_batches={limit})"
    return (
        f"{datamodule.corpus(source).describe()}: "
        f"{datamodule.token_store(source).meta['count']:,} tokens (train {train:,}, val {val:,}, "
        f"test {test:,}); a validation covers {what}"
    )


AVERAGES = {
    "micro": "the micro average (per token, over every source's val tokens)",
    "macro": "the macro average (the mean of the sources' val losses)",
}


def mixture_lines(datamodule, trainer) -> list[str]:
    """A mixture: its sources, each one's weight and epochs in this run, val/loss's average."""
    steps, ranks = trainer.max_steps, trainer.world_size
    epochs = datamodule.planned_epochs(steps, ranks)
    stages = datamodule.mixture.starts
    average = AVERAGES[datamodule.settings.val_average]
    staged = "" if len(stages) == 1 else f" (staged: from steps {', '.join(map(str, stages))})"
    lines = [
        f"Data: a mixture of {len(epochs)} sources, {len(datamodule.splits['train']):,} train "
        f"tokens; val/loss (best.ckpt, early stopping) is {average} (data.val_average); "
        f"weights at step 0{staged}:"
    ]
    shares = datamodule.mixture.shares_at(0)
    for source, share in zip(datamodule.source_names, shares, strict=True):
        lines.append(
            f"  {source}: {corpus_line(datamodule, trainer, source)}; weight {share:.3f}, "
            f"{epochs[source]:.2f} epochs of its train split in {steps:,} steps"
        )
    return lines


def data_lines(cfg: DictConfig, datamodule, trainer) -> list[str]:
    """The corpus (a mixture's sources), how much of val a validation covers, and a sample
    prompt it cannot encode."""
    if datamodule is None:
        return []
    if datamodule.source_names is None:
        lines = [f"Data: {corpus_line(datamodule, trainer)}"]
    else:
        lines = mixture_lines(datamodule, trainer)
    prompts = {cfg.get("sample_prompt"), OmegaConf.select(cfg, "callbacks.text_sample.prompt")}
    for prompt in sorted(p for p in prompts if isinstance(p, str)):
        if not datamodule.tokenizer.can_encode(prompt):
            lines.append(
                f"Sample prompt {prompt!r}: this corpus's vocabulary cannot encode it, so text "
                "samples are skipped (set sample_prompt to text of the corpus)."
            )
    return lines


def print_first_screen(
    cfg: DictConfig, model: GPT, output_dir: Path, datamodule, trainer, knob: list[str]
) -> None:
    """The config tree (saved; not printed in a sweep's jobs), what model.depth derived and what
    was given (`knob`), the data, model and run dir."""
    tree = config_tree(cfg)
    if output_dir.is_dir():
        console = Console(file=io.StringIO(), width=110, color_system=None)
        console.print(tree)
        PLACE.write_text(output_dir / directory.CONFIG_TREE, console.file.getvalue())
    if not place.in_multirun():
        Console(stderr=True, width=110).print(tree)
    if datamodule is not None:  # data.max_epochs: refused before anything is trained
        datamodule.check_epochs(trainer.max_steps, trainer.world_size)
    for line in [*knob, *data_lines(cfg, datamodule, trainer)]:
        log.info(line)
    log.info("\n".join([model_line(model), f"Run directory: {output_dir}"]))


def counted(n: int, what: str) -> str:
    """`1 block`, `4 blocks`, `3,771 tokens`."""
    return f"{n:,} {what}" if n == 1 else f"{n:,} {what}s"


def model_line(model: GPT) -> str:
    """`GPT: 254,048 parameters (d_model 32, 2 heads, 1 block, context 32, vocab 3,771)`, and
    under μP its base width (and depth), the shape its learning rate was tuned at."""
    c = model.config
    line = (
        f"GPT: {counted(model.num_params()['total'], 'parameter')} (d_model {c.d_model:,}, "
        f"{counted(c.num_heads, 'head')}, {counted(c.num_blocks, 'block')}, context "
        f"{c.context_length:,}, vocab {c.vocab_size:,})"
    )
    if c.parametrization != "mup":
        return line
    base = f"base width {c.base_width:,}"
    if c.base_depth:
        base += f", base depth {c.base_depth:,}"
    return f"{line}\nμP on: {base} (model.parametrization=mup; docs/model.md)"
