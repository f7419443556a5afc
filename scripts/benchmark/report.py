"""The table as text, and the JSON of a benchmark run."""

from __future__ import annotations

import json
from pathlib import Path


def fmt(value) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.1f}"
    return str(value)


def header(info: dict) -> str:
    amx = {True: "AMX", False: "no AMX", None: "AMX unknown"}[info["cpu_has_amx"]]
    avx = {True: "AVX512-BF16", False: "no AVX512-BF16", None: "AVX512-BF16 unknown"}
    return (
        f"gptlab benchmark: {info['cpu_model']} ({amx}, {avx[info['cpu_has_avx512_bf16']]}), "
        f"{info['cpus_usable']} cores usable, threads={info['threads']}, torch {info['torch']}, "
        f"device {info['device']}"
    )


def render(rows: list[dict], info: dict) -> str:
    """The table as text: a header naming the machine, a line per row, then the ERROR rows."""
    columns = ("measurement", "value", "unit", "target", "status")
    lines = [
        [r["name"], fmt(r["value"]), r["unit"], r.get("target", ""), r.get("status", "")]
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(columns, *lines, strict=True)]
    out = [
        header(info),
        "  ".join(h.ljust(w) for h, w in zip(columns, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    for line in lines:
        out.append("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip())
    errors = [f"  {r['name']}: {r['error']}" for r in rows if r.get("error")]
    if errors:
        out += ["", "ERROR rows (their run failed):", *errors]
    return "\n".join(out)


def write_json(path: Path, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")
