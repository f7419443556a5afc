"""A sweep's downstream scores, as the in-loop callback (gptlab.training.downstream_callback)
wrote them to each job's metrics.json: their columns in summary.csv and summary_configs.csv, and
summary.md's table, each score over its seeds with its interval, and an accuracy that cannot be
told from chance marked so (gptlab.sweep.stats.at_chance)."""

from gptlab.sweep.stats import at_chance, group_configurations, job_values, number, wilson_interval
from gptlab.sweep.tables import Seeds, format_estimate, markdown_table

PREFIX = "downstream/"  # metrics.json's keys: downstream/<task>/<score>, downstream/<aggregate>
SCORES = ("acc", "acc_norm", "bpb", "centred")  # each task's, at each validation
ACCURACIES = ("acc", "acc_norm")  # the scores with a chance level
AGGREGATES = ("core", "acc", "bpb")  # means over the tasks (core: of the centred accuracies)
AT_CHANCE = "at chance"  # the mark of a score whose interval holds chance


def task_names(rows: list[dict]) -> list[str]:
    """The tasks scored in any job, in the order first seen."""
    names = {}
    for row in rows:
        for key in row:
            parts = str(key).split("/")
            if len(parts) == 3 and f"{parts[0]}/" == PREFIX and parts[2] in SCORES:
                names[parts[1]] = None
    return list(names)


def score_keys(rows: list[dict]) -> list[str]:
    """The scores a configuration's statistics cover: the aggregates, then each task's."""
    keys = [PREFIX + name for name in AGGREGATES]
    keys += [f"{PREFIX}{task}/{score}" for task in task_names(rows) for score in SCORES]
    return [key for key in keys if any(number(row.get(key)) is not None for row in rows)]


def chance_of(jobs: list[dict], task: str) -> tuple[float | None, int | None]:
    """A task's chance level and items scored, as its first ok job recorded them."""
    for job in jobs:
        chance = number(job.get(f"{PREFIX}{task}/chance"))
        if job["status"] == "ok" and chance is not None:
            return chance, int(number(job.get(f"{PREFIX}{task}/n")) or 0)
    return None, None


def marks(jobs: list[dict]) -> dict[str, bool]:
    """downstream/<task>/<accuracy>_at_chance of jobs alike but for the seed (or one job)."""
    marked = {}
    for task in task_names(jobs):
        chance, n = chance_of(jobs, task)
        for score in ACCURACIES:
            values = job_values(jobs, f"{PREFIX}{task}/{score}")
            if chance is not None and values:
                marked[f"{PREFIX}{task}/{score}_at_chance"] = at_chance(chance, values, n)
    return marked


def job_columns(rows: list[dict]) -> list[str]:
    """summary.csv's downstream columns: the scores, items, chance level and marks jobs have."""
    columns = score_keys(rows)
    for task in task_names(rows):
        columns += [f"{PREFIX}{task}/{key}" for key in ("n", "chance", "n_oov", "n_cut")]
        columns += [f"{PREFIX}{task}/{score}_at_chance" for score in ACCURACIES]
    return [column for column in columns if any(row.get(column) is not None for row in rows)]


def config_columns(rows: list[dict]) -> list[str]:
    """summary_configs.csv's downstream columns (its jobs' `rows`): each score's mean, std and
    ci95 over the seeds, the marks."""
    columns = [f"{key}_{stat}" for key in score_keys(rows) for stat in ("mean", "std", "ci95")]
    tasks = task_names(rows)
    return columns + [f"{PREFIX}{t}/{score}_at_chance" for t in tasks for score in ACCURACIES]


def score_cell(jobs: list[dict], task: str | None, score: str) -> str:
    """A score over the jobs' seeds: "mean ± ci95" (Student-t), one job's accuracy with Wilson's
    interval over its items "acc [lo, hi]"; marked AT_CHANCE where chance lies within."""
    key = f"{PREFIX}{task}/{score}" if task else PREFIX + score
    values = job_values(jobs, key)
    if not values:
        return ""
    seeds = Seeds.of(values)
    chance, n = chance_of(jobs, task) if task else (None, None)
    if len(values) == 1 and score in ACCURACIES and n:
        text = format_estimate(seeds.mean, wilson_interval(seeds.mean, n))
    else:
        text = seeds.estimate()
    if task and score in ACCURACIES and chance is not None and at_chance(chance, values, n):
        text += f" ({AT_CHANCE})"
    if not task and score == "core" and every_task_at_chance(jobs):
        text += f" ({AT_CHANCE}: every task)"
    return text


def every_task_at_chance(jobs: list[dict]) -> bool:
    found = marks(jobs)
    accuracy = [value for key, value in found.items() if key.endswith("/acc_at_chance")]
    return bool(accuracy) and all(accuracy)


def downstream_section(rows: list[dict], knobs: list[str]) -> list[str]:
    """summary.md's downstream table: per configuration (its seeds) or per job, per task."""
    tasks = task_names(rows)
    if not tasks:
        return []
    ok = [row for row in rows if row["status"] == "ok"]
    if "seed" in knobs:
        groups = group_configurations(ok, knobs)
        head, seeds = "configuration", "over its seeds (Student-t)"
    else:
        groups = {row["job"]: [row] for row in ok}
        head, seeds = "job", "over the items (Wilson's interval) for one job"
    table = []
    for name, jobs in groups.items():
        for task in tasks:
            chance, n = chance_of(jobs, task)
            cells = [score_cell(jobs, task, score) for score in SCORES]
            if any(cells):
                table.append([name, task, n, chance, *cells])
        table.append([name, "(mean over tasks)", "", "", *aggregate_cells(jobs)])
    return [
        "## Downstream tasks",
        "",
        "The last validation's scores of the in-loop callback (docs/training.md): accuracy by "
        "summed and by per-byte log-likelihood, bits per byte of the gold continuation, accuracy "
        f"centred on chance; 95% intervals {seeds}. '{AT_CHANCE}': chance lies within the "
        "accuracy's interval over its seeds or over its items (no evidence that the model does "
        "better than guessing).",
        "",
        *markdown_table([head, "task", "items", "chance", *SCORES], table, ".4g"),
        "",
    ]


def aggregate_cells(jobs: list[dict]) -> list[str]:
    """The means over tasks, in SCORES' columns: accuracy, bits per byte, the centred
    accuracy (CORE's figure)."""
    acc, bpb, core = (score_cell(jobs, None, key) for key in ("acc", "bpb", "core"))
    return [acc, "", bpb, core]
