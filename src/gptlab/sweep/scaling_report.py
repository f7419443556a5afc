"""scaling.json, scaling.md and scaling.png of a sweep (gptlab.sweep.scaling fits them); with too
few points, scaling.md says what is missing and the rest of the sweep's summary stands."""

import logging
from pathlib import Path

from gptlab.run.place import PLACE
from gptlab.sweep import scaling
from gptlab.sweep.scaling import REPEATED_EPOCHS, TooFewPoints, as_json, fit_sweep
from gptlab.sweep.scaling_plot import write_scaling_plot
from gptlab.sweep.stats import DRAWS, MIN_DRAWS, number
from gptlab.sweep.tables import format_estimate, markdown_table

log = logging.getLogger(__name__)


def verdict_line(fit: dict) -> str:
    if fit["identified"]:
        return "**Identified.**"
    return f"**Not identified:** {'; '.join(fit['why_not'])}. Not extrapolated in the plot."


def estimate(fit: dict, name: str, spec: str = ".3g") -> str:
    """A fitted value with its interval, or "not identified" (a number from such a fit, e.g.
    a = -6.31e-16, would read as a finding)."""
    if not fit["identified"]:
        return "not identified"
    return format_estimate(fit[name], fit["ci95"][name], spec)


def approach2_lines(fit: dict) -> list[str]:
    rows = []
    for o in fit["optima"]:
        edge = "edge: the best job (no minimum among these sizes)" if o["edge"] else ""
        ci = format_estimate(o["L_opt"], o.get("L_opt_ci95"))
        cells = [f"{o['C']:.3g}", o["sizes"], f"{o['N_opt']:,.0f}", f"{o['D_opt']:,.0f}"]
        rows.append([*cells, ci, edge])
    return [
        "### Approach 2: a parabola per IsoFLOP budget",
        "",
        f"N_opt ∝ C^a with a = {estimate(fit, 'a')}; D_opt ∝ C^b with b = {estimate(fit, 'b')} "
        f"(95% bootstrap over jobs within each budget, {fit['draws_used']} draws).",
        "",
        verdict_line(fit),
        "",
        *markdown_table(
            ["budget C (FLOPs)", "sizes", "N_opt", "D_opt", "L_opt (95% CI)", ""], rows
        ),
        "",
    ]


def approach3_lines(law: dict) -> list[str]:
    rows = [
        [name, estimate(law, name, ".4g")]
        for name in ("E", "A", "alpha", "B", "beta", "a")
        if law[name] is not None
    ]
    return [
        "### Approach 3: L(N, D) = E + A / N^alpha + B / D^beta",
        "",
        "Huber loss (delta 1e-3) on log L, L-BFGS from a grid of starts (Besiroglu et al. "
        f"2024); 95% bootstrap intervals over jobs ({law['draws_used']} draws). "
        "a = beta / (alpha + beta): the allocation it implies, N_opt ∝ C^a.",
        "",
        verdict_line(law),
        "",
        *markdown_table(["parameter", "fit (95% CI)"], rows),
        "",
    ]


def holdout_lines(held: dict | None) -> list[str]:
    if held is None:
        return ["Held out: needs at least 3 budgets (2 left to refit on).", ""]
    lines = [
        "### The largest budget held out",
        "",
        f"Refitted without budget {held['budget']:.3g} FLOPs, approach 3 predicts its best job "
        f"(job {held['job']}: N {held['N']:,.0f}, D {held['D']:,.0f}) at loss "
        f"{held['predicted']:.4f}; measured {held['measured']:.4f}: relative error "
        f"{held['relative_error']:+.2%}.",
    ]
    if "approach2" in held:
        two = held["approach2"]
        lines.append(
            f"Approach 2 refitted predicts N_opt {two['predicted_N_opt']:,.0f} there; the "
            f"budget's own parabola puts it at {two['measured_N_opt']:,.0f} "
            f"({two['relative_error']:+.1%})."
        )
    return [*lines, ""]


def repeated_lines(fit: dict) -> list[str]:
    repeated, total = fit["repeated_data_points"], len(fit["points"])
    most = max((p["epochs"] or 0 for p in fit["points"]), default=0)
    if not repeated:
        return [f"No job trained past {REPEATED_EPOCHS} epochs of the train split.", ""]
    return [
        f"**Repeated data:** {repeated} of {total} jobs trained past {REPEATED_EPOCHS} epochs of "
        f"the train split (the most: {most:.1f}; hollow markers in the plot): D counts tokens "
        "that are not all new, so the data term and b describe this corpus's repeated regime and "
        "the law extrapolated overstates what more of its tokens buy (docs/scaling.md).",
        "",
    ]


def configuration_lines(name: str, fit: dict) -> list[str]:
    lines = [f"## {name}", "", *repeated_lines(fit)]
    if fit["notes"]:
        lines += [*(f"- {note}" for note in fit["notes"]), ""]
    approaches = approach2_lines(fit["approach2"]) + approach3_lines(fit["approach3"])
    return lines + approaches + holdout_lines(fit["holdout"])


def comparison_lines(fits: dict) -> list[str]:
    compared = {name: fit for name, fit in fits.items() if "vs_first" in fit}
    if len(compared) < 2:
        return []
    first = next(iter(compared))
    rows = []
    for name, fit in compared.items():
        for row in fit["vs_first"]:
            gap = "" if name == first else format_estimate(row["gap"], row["gap_ci95"], "+.4f")
            shown = format_estimate(row["L_opt"], row["L_opt_ci95"])
            rows.append([f"{row['C']:.3g}", name, shown, gap])
    rows.sort(key=lambda r: float(r[0]))
    return [
        "## Configurations along the compute-optimal frontier",
        "",
        f"Each configuration's loss at its own optimum per budget (approach 2's parabola), with "
        f"its 95% bootstrap interval, and the gap to {first} (< 0: better).",
        "",
        *markdown_table(
            ["budget C (FLOPs)", "configuration", "L_opt (95% CI)", f"gap to {first}"], rows
        ),
        "",
    ]


def flops_lines(flops: dict) -> list[str]:
    """What the sweep's jobs spent, a trunk once however many branches it has."""
    line = f"Training FLOPs spent by the finished jobs: {flops['spent']:.3g}"
    if flops["branches"]:
        share = flops["spent"] / flops["as_separate_runs"] if flops["as_separate_runs"] else 0
        line += (
            f", {flops['branches']} of them cooldown branches, each trunk counted once: "
            f"{share:.0%} of the {flops['as_separate_runs']:.3g} its points would cost as "
            "separate runs"
        )
    return [line + ".", ""]


def report_lines(result: dict, sweep_dir: Path, head: list[str]) -> list[str]:
    fits, least = result["configurations"], scaling.POINTS_PER_PARAMETER
    lines = [
        f"# Scaling laws: {sweep_dir}",
        "",
        *(f"- {line}" for line in head),
        "",
        f"L = {result['metric']}, N = scaling_params, D = tokens_seen, C = flops_per_token x "
        "tokens_seen; a budget: jobs clustered in log C (a jump over 10% starts the next). A fit "
        f"is identified with {least} points per parameter ({least * 3} sizes a budget, {least * 5} "
        f"jobs), {MIN_DRAWS} of {DRAWS} bootstrap draws, and no optimum at an edge, parameter at a "
        "bound or interval of zero width or over a decade (docs/scaling.md).",
        "",
        *flops_lines(result["flops"]),
        "![IsoFLOP curves, N_opt and the loss against compute](scaling.png)",
        "",
    ]
    if result["errors"]:
        lines += [*(f"- Not fitted: {message}" for message in result["errors"].values()), ""]
    lines += comparison_lines(fits)
    for name, fit in fits.items():
        lines += configuration_lines(name, fit)
    return lines


def headline(result: dict) -> str:
    """Each configuration's allocation exponent a, or why its fit is not identified."""
    heads = []
    for name, fit in result["configurations"].items():
        parts = []
        for label, one in (("approach 2", fit["approach2"]), ("approach 3", fit["approach3"])):
            if one["identified"]:
                parts.append(f"a = {round(one['a'], 2) + 0.0:.2f} ({label})")  # + 0.0: no -0.00
            else:
                parts.append(f"{label} not identified ({'; '.join(one['why_not'])})")
        heads.append(f"{name}: N_opt ∝ C^a, " + ", ".join(parts))
    return "Scaling laws (scaling.md, scaling.json, scaling.png): " + "; ".join(heads) + "."


def write_scaling(
    rows: list[dict], knobs: list[str], where: tuple[Path, Path], metric: str, first, smoke: list
) -> str:
    """scaling.json, .md (`smoke`, the summary's warning, under its headline), .png in `out`; the
    headline. TooFewPoints, once scaling.md holds its message alone, when nothing can be fitted."""
    sweep_dir, out = where
    try:
        result = fit_sweep(rows, knobs, metric, first=first)
    except TooFewPoints as e:
        text = "\n".join([f"# Scaling laws: {sweep_dir}", "", *smoke, f"No scaling fit: {e}"])
        PLACE.write_text(out / "scaling.md", text + "\n")
        raise
    PLACE.write_json(out / "scaling.json", as_json(result))
    head = [headline(result), *smoke]
    PLACE.write_text(out / "scaling.md", "\n".join(report_lines(result, sweep_dir, head)) + "\n")
    write_scaling_plot(result, out / "scaling.png")
    return head[0]


def scaling_section(
    rows: list[dict], knobs: list[str], where: tuple, requested: bool, metric: str, first, smoke
) -> tuple[str | None, str | None]:
    """scaling.* when `requested` or a job set flops_budget: the headline's line and, when
    requested and there were too few points, what is missing (raised once summary.md is written)."""
    budgeted = any(number(row.get("flops_budget")) is not None for row in rows)
    if not requested and not budgeted:
        return None, None
    try:
        return write_scaling(rows, knobs, where, metric, first, smoke), None
    except TooFewPoints as e:
        log.warning("No scaling fit: %s", e)
        return f"No scaling fit: {e}", str(e) if requested else None
    except Exception as e:  # a sweep's own summary must not be lost to its fit
        if requested:
            raise
        log.exception("The scaling fit failed")
        return f"No scaling fit: it failed ({type(e).__name__}: {e}).", None
