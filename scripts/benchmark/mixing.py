"""Row 9, a data mixture's cost: the book as one source against the same text as a mixture of two
sources of half its size each (its two halves, cut at a line, mixed in proportion to their
tokens), so that the model, the batches' size and the tokens are the same and only the data path
differs:

- end to end: `gptlab-train data=text_file data.path=<book>` and the same run with
  data.sources={first: <half 1>, second: <half 2>}, alternating, the best of each kept; the cost
  is one's training steps/s over the other's, minus 1 (the issue's bound: 5% of a step);
- the batches alone: bare_batches.py draws the same number of training batches from each run's
  data module (no model), so the time the mixing adds to a batch is seen without the model's
  noise, as a share of the single-source run's step.

--quick skips the row (the suite's benchmark test stays short; tests/test_mixture.py checks the
rows from known measurements and runs the bare side)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .processes import run_child
from .runs import Setup, best_of, train_run
from .table import ratio, row

BARE_BATCHES = Path(__file__).resolve().parent / "bare_batches.py"
OVERRIDES = ["logger=none", "callbacks=none", "trainer.limit_val_batches=1"]
BATCHES = 20_000  # drawn by bare_batches.py from each side's data module


def halves(book: Path, folder: Path) -> tuple[Path, Path]:
    """The book's two halves, cut at the first line break after its middle character."""
    folder.mkdir(parents=True, exist_ok=True)
    text = book.read_text(encoding="utf-8")
    cut = text.index("\n", len(text) // 2) + 1
    paths = folder / "half-1.txt", folder / "half-2.txt"
    for path, part in zip(paths, (text[:cut], text[cut:]), strict=True):
        path.write_text(part, encoding="utf-8")
    return paths


def sides(book: Path, folder: Path) -> dict[str, list[str]]:
    """The overrides of each side: one source, and the mixture of its halves."""
    first, second = halves(book, folder)
    sources = f"{{first:{{path:'{first}'}},second:{{path:'{second}'}}}}"
    return {
        "single": ["data=text_file", f"data.path={book}"],
        "mixture": ["data=text_file", "data.path=null", f"data.sources={sources}"],
    }


def bare_batches(setup: Setup, run_dir: str, name: str, batches: int) -> dict:
    out = setup.workdir / f"{name}.json"
    command = [sys.executable, str(BARE_BATCHES), run_dir, "--batches", str(batches)]
    run_child([*command, "--out", str(out)], setup.workdir, name)
    return json.loads(out.read_text())


def mixing_stage(setup: Setup, book: Path, steps: int, repeats: int) -> dict:
    """Both sides, alternating `repeats` times, the best of each; then the batches alone."""
    runs = {"single": [], "mixture": []}
    overrides = sides(book, setup.workdir / "mixing")
    for i in range(repeats):
        for side, given in overrides.items():
            command = [*given, f"trainer.max_steps={steps}", *OVERRIDES]
            runs[side].append(train_run(setup, f"mixing-{side}-{i}", command))
    best = {side: best_of(found) for side, found in runs.items()}
    bare = {
        side: bare_batches(setup, best[side]["run_dir"], f"mixing-bare-{side}", BATCHES)
        for side in best
    }
    return {"runs": best, "bare": bare}


def mixing_rows(mixing: dict | None) -> list[dict]:
    """The cost end to end (judged), and the batches' own extra time as a share of a step."""
    if not mixing:
        return []
    single, mixture = mixing["runs"]["single"], mixing["runs"]["mixture"]
    extra = mixing["bare"]["mixture"]["seconds_per_batch"]
    extra -= mixing["bare"]["single"]["seconds_per_batch"]
    step = 1.0 / single["train_steps_per_s"]
    return [
        row(
            "mixing_cost_pct",
            "a two-source mixture's cost: one source's train steps/s / the mixture's - 1",
            100.0 * (ratio(single["train_steps_per_s"], mixture["train_steps_per_s"]) - 1.0),
            "% of a step",
            detail=f"the issue's bound: 5%; the book against its two halves mixed, "
            f"{single['steps']} steps each, the best of {len(single['all_steps_per_s'])}",
        ),
        row(
            "mixing_batch_cost_pct",
            "  the batches alone: the mixture's extra time per batch / one source's step",
            100.0 * extra / step,
            "% of a step",
            detail=f"{extra * 1e6:.1f} us per batch, bare_batches.py",
        ),
    ]
