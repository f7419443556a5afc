"""Whether a sweep's verdicts can be findings: jobs that are debug runs (debug=fast, ...) or spend
half their steps or more in the learning-rate warmup only show that the sweep runs. Which
configuration learns faster over a few dozen steps says little about a real run's (a 20-step
ablation ranks RoPE worse, the reverse of 600 steps)."""

from typing import Any

from gptlab.run.overrides import split_override
from gptlab.run.settings import saved_value
from gptlab.sweep.stats import number


def short_horizon(cfg: Any, overrides: list[str], max_steps: Any = None) -> str | None:
    """Why a job (its saved config, its overrides, the steps it was set to train: a FLOP budget's
    when metrics.json records them, else the config's) is a smoke test: `debug=<option>`, or
    its steps against its warmup; None for a real run."""
    debug = [value for key, value in map(split_override, overrides) if key == "debug"]
    if debug:
        return f"debug={debug[-1]}"
    steps = number(max_steps if max_steps is not None else saved_value(cfg, "trainer.max_steps"))
    warmup = number(saved_value(cfg, "optim.warmup_steps"))
    if steps and warmup and steps <= 2 * warmup:
        return f"{steps:.0f} steps for a {warmup:.0f}-step warmup"
    return None


def smoke_test_note(rows: list[dict]) -> str | None:
    """The headline's warning when some of the sweep's jobs are smoke tests (short_horizon)."""
    reasons = [row["_horizon"] for row in rows if row.get("_horizon")]
    if not reasons:
        return None
    kinds = ", ".join(dict.fromkeys(reasons))
    return (
        f"A smoke test, not a finding: {len(reasons)} of {len(rows)} jobs are debug runs or "
        f"spend half their steps or more in warmup ({kinds}). Their verdicts show only that the "
        "sweep runs; compare configurations on full runs (no debug=, trainer.max_steps well "
        "beyond optim.warmup_steps)."
    )
