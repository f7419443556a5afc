"""gptlab-eval tasks=[...] (docs/downstream.md): the downstream scores of a checkpoint, a run or
a Hugging Face folder, the tasks read and checked before any model is built; one table."""

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from gptlab.cli.app import resolve_device
from gptlab.cli.eval_record import own_run_of, read_results, write_result
from gptlab.config.resolve import resolved
from gptlab.errors import whole_number
from gptlab.run import directory
from gptlab.run.place import PLACE


def evaluate_tasks(cfg: DictConfig) -> dict:
    """Score the model on the named tasks, read (and checked) before any model is built; print
    one table; write it beside an own run (else in the output dir); return it."""
    from gptlab.data.tasks import load_tasks

    settings = cfg.downstream
    max_items = whole_number("downstream.max_items", settings.max_items, 1, none=True)
    num_shots = whole_number("downstream.num_shots", settings.num_shots, 0)
    batch_size = whole_number("downstream.batch_size", settings.batch_size, 1)
    names = list(cfg.tasks) if OmegaConf.is_list(cfg.tasks) else [cfg.tasks]
    device = resolve_device(cfg.device)
    cfg = resolved(cfg)
    tasks = load_tasks(names, cfg.data.data_dir, cfg.data.cache_dir, num_shots)
    model, tokenizer, step, source, run_dir = load_any(cfg.ckpt_path)
    places = [PLACE.admit(run_dir, "ckpt_path", own=True)] if run_dir else []
    places.append(PLACE.run_dir or Path(cfg.output_dir))
    read_results(places[0] / directory.EVAL)  # a corrupt one is refused before the long part
    from gptlab.training.downstream import aggregate, score_tasks

    scores = score_tasks(model.to(device), tokenizer, tasks, max_items, batch_size)
    result = {
        "model": str(source),
        "step": step,
        "max_items": max_items,
        "num_shots": num_shots,
        "downstream": {name: score.as_dict() for name, score in scores.items()},
        "aggregate": aggregate(scores),
    }
    lines = [f"Model: {source} (step {step}), {num_shots}-shot", *task_table(scores, tasks)]
    label = f"{Path(source).name}: downstream, {num_shots}-shot, max_items {max_items}"
    lines += write_result(places, label, result)
    print("\n".join(lines), flush=True)
    return result


def task_table(scores: dict, tasks: list) -> list[str]:
    """One row a task, then the aggregate (CORE's mean centred accuracy) naming its parts."""
    from gptlab.sweep.tables import markdown_table
    from gptlab.training.downstream import aggregate

    header = ["task", "acc", "acc_norm", "bpb", "centred", "chance", "items", "oov", "cut"]
    rows = [
        [name, s.acc, s.acc_norm, s.bpb, s.centred, s.random, s.n, s.n_oov, s.n_cut]
        for name, s in scores.items()
    ]
    total = aggregate(scores)
    rows.append(["mean", total["acc"], None, total["bpb"], total["core"], None, None, None, None])
    sources = [f"{task.name}: {task.source}" for task in tasks]
    return [*markdown_table(header, rows, ".4f"), "", "Read from: " + "; ".join(sources)]


def load_any(path) -> tuple:
    """(the GPT in eval mode, its tokenizer, its step, what it was read from, an own run's
    directory or None): a checkpoint, a run directory, or a Hugging Face folder (config.json)."""
    from gptlab.run.checkpoints import find_checkpoint, load_model

    folder = Path(str(path or "")).expanduser()
    if str(path or "").strip() and folder.is_dir() and (folder / "config.json").is_file():
        from gptlab.data.tokenizer import Tokenizer
        from gptlab.model.config import GPTConfig
        from gptlab.model.meta import build_gpt
        from gptlab.run.hf_folder import read_folder

        trained = read_folder(folder)
        model = build_gpt(GPTConfig(**trained.model), trained.weights, f"ckpt_path: '{folder}'")
        return model.eval(), Tokenizer(**trained.tokenizer), 0, folder, None
    checkpoint = Path(find_checkpoint(path).absolute())
    model, tokenizer, step = load_model(checkpoint)
    return model, tokenizer, step, checkpoint, own_run_of(checkpoint)
