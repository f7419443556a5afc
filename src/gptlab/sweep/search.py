"""The summary of an Optuna search (hparams_search=optuna): the study's trials counted by how they
ended, the best trial or the Pareto front, the parameter importances and the optimisation history,
drawn with Optuna's own matplotlib plots. SweepSummary adds them to summary.md and summary.png."""

import io
import logging
import warnings
from pathlib import Path
from typing import Any

from gptlab import reader
from gptlab.run import directory, ownership
from gptlab.run.directory import where
from gptlab.run.place import PLACE
from gptlab.sweep.tables import markdown_table

log = logging.getLogger(__name__)


def storage_url(storage: str | None, sweep_dir: Path) -> str:
    """The storage given on the command line, else the sweep directory's SQLite file (never one a
    directory names)."""
    return storage or f"sqlite:///{sweep_dir.resolve() / 'optuna.db'}"


def study_of(sweep_dir: Path) -> Any:
    """The sweep's Optuna study, where its multirun.yaml says it lives; None for other sweeps,
    and for a directory that is not the user's own (its storage is never opened)."""
    saved = reader.read_yaml(sweep_dir / directory.MULTIRUN)
    for key in ("hydra", "sweeper"):
        saved = saved.get(key) if isinstance(saved, dict) else None
    if not isinstance(saved, dict) or "study_name" not in saved:  # optuna is not even imported
        return None
    if not ownership.owner(where(sweep_dir)).own:
        return None
    import optuna

    try:
        url = storage_url(saved.get("storage"), sweep_dir)
        return optuna.load_study(study_name=str(saved["study_name"]), storage=url)
    except KeyError:  # no such study in the storage
        return None


def counts(study: Any) -> dict[str, int]:
    """Trials by state: complete, pruned, failed, interrupted (a killed search's, run again by
    resume=) and unfinished (running or waiting: a search under way)."""
    trials = study.get_trials(deepcopy=False)
    rerun = {t.user_attrs.get("rerun_of") for t in trials}
    states = ["rerun" if t.number in rerun else t.state.name.lower() for t in trials]
    found = {state: states.count(state) for state in ("complete", "pruned", "fail", "rerun")}
    return {**found, "unfinished": len(states) - sum(found.values())}


def objectives(study: Any) -> list[str]:
    return list(study.user_attrs.get("gptlab_objectives") or ["objective"])


def first_objective(study: Any) -> Any:
    """Optuna's `target` for the plots and importances: none for one objective, else the first."""
    return None if len(study.directions) == 1 else (lambda t: t.values[0])


def best_lines(study: Any) -> list[str]:
    """The best trial; with several objectives, the Pareto front (study.best_trials) as a table."""
    names = objectives(study)
    if len(study.directions) == 1:
        best = study.best_trial
        return [
            f"- Best trial: {best.number} (job {best.user_attrs.get('job')}): {names[0]} "
            f"{best.value:.4f}, parameters {best.params}."
        ]
    front = sorted(study.best_trials, key=lambda t: t.values)
    rows = [[t.number, t.user_attrs.get("job"), *t.values, t.params] for t in front]
    header = ["trial", "job", *names, "parameters"]
    return ["", f"### Pareto front ({', '.join(names)})", "", *markdown_table(header, rows)]


def importances(study: Any) -> dict[str, float]:
    """fANOVA importance of each parameter for the first objective; empty when too few trials."""
    import optuna

    try:
        return optuna.importance.get_param_importances(study, target=first_objective(study))
    except (ValueError, RuntimeError) as e:  # fewer than two complete trials, nothing varied
        log.info("No parameter importances: %s", e)
        return {}


def add_plots(study: Any, png: Path, with_importances: bool) -> None:
    """Append Optuna's optimisation history and parameter importances (pyplot figures of its own,
    drawn as images) below summary.png's plot."""
    import matplotlib.image
    import matplotlib.pyplot as plt
    import optuna
    import optuna.visualization.matplotlib as plots
    from matplotlib.figure import Figure

    target, name = first_objective(study), objectives(study)[0]
    images = [matplotlib.image.imread(png)]
    # Optuna's plots set pyplot's style (ggplot) for the whole process: undone on leaving
    with warnings.catch_warnings(), plt.rc_context():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        axes = [plots.plot_optimization_history(study, target=target, target_name=name)]
        if with_importances:
            axes.append(plots.plot_param_importances(study, target=target, target_name=name))
        for ax in axes:
            buffer = io.BytesIO()
            ax.figure.set_size_inches(8, 3.6)
            ax.figure.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
            plt.close(ax.figure)
            buffer.seek(0)
            images.append(matplotlib.image.imread(buffer, format="png"))
    heights = [image.shape[0] for image in images]
    width = max(image.shape[1] for image in images)
    fig = Figure(figsize=(width / 80, sum(heights) / 80))
    for ax, image in zip(fig.subplots(len(images), 1, height_ratios=heights), images, strict=True):
        ax.imshow(image)
        ax.set_axis_off()
    fig.subplots_adjust(left=0, right=1, top=1, bottom=0, hspace=0)
    PLACE.save_figure(fig, png, dpi=80)


def search_summary(sweep_dir: Path, png: Path) -> list[str]:
    """summary.md's Optuna section (its plots added to `png`); none for other sweeps."""
    study = study_of(sweep_dir)
    if study is None:
        return []
    n = counts(study)
    lines = [
        "",
        f"## Optuna study '{study.study_name}'",
        "",
        f"- Trials: {n['complete']} complete, {n['pruned']} pruned, {n['fail']} failed"
        + (f", {n['rerun']} interrupted and run again" if n["rerun"] else "")
        + (f", {n['unfinished']} running or waiting" if n["unfinished"] else "")
        + ".",
    ]
    if not n["complete"]:
        return lines
    lines += best_lines(study)
    found = importances(study)
    if found:
        rows = [[name, float(value)] for name, value in found.items()]
        lines += ["", *markdown_table(["parameter", "importance"], rows, ".3f")]
    add_plots(study, png, with_importances=bool(found))
    return lines
