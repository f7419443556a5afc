"""The targets, the table's rows from the measurements, and each row's verdict."""

from __future__ import annotations

import math

BF16 = "trainer.precision=bf16-mixed"

TARGETS = {  # id: (comparison, threshold, what is compared)
    "speedup_vs_reference": (">=", 2.0, "experiment=reference train steps/s / reference loop's"),
    "lightning_overhead_pct": ("<=", 10.0, "bare loop steps/s / Lightning steps/s - 1, in %"),
    "startup_s": ("<=", 6.0, "spawn of gptlab-train debug=fast to its first train/loss record"),
    "time_to_reference_loss_fraction": (
        "<=",
        0.1,
        "default run's time to the reference's final val loss / reference run's wall time",
    ),
    "default_peak_rss_mb": ("<=", 1000.0, "peak RSS of the default run, MB (1e6 bytes)"),
    "busy_quiet_ratio": (
        ">=",
        0.45,
        "default run's tokens/s with one CPU-bound competitor / quiet",
    ),
    # the largest corpus of row 7 (400 MB of text; --quick: a tiny one)
    "corpus_tokenize_vs_bare": ("<=", 1.3, "tokenization (cold - warm) / bare tiktoken"),
    "corpus_peak_rss_mb": ("<=", 1500.0, "peak RSS of the cold and the warm run, MB"),
    "corpus_store_bytes_per_byte": ("<=", 0.5, "token store bytes / text bytes"),
    "generation_cache_speedup": (
        ">=",
        5.0,
        "d_model 512 x 8 blocks, batch 1: generation tokens/s with the KV cache / without",
    ),
}
CASES = {  # the targets of the cases run alone: --downstream (row 10)
    "downstream_cost_pct": (
        "<=",
        10.0,
        "callbacks=downstream's scoring seconds / the default run's training seconds, in %",
    ),
}


def target_verdict(target_id: str, value) -> str:
    """PASS when `value` meets the target, FAIL when it does not or there is no number."""
    if not isinstance(value, (int, float)) or math.isnan(value):
        return "FAIL"
    op, threshold, _ = {**TARGETS, **CASES}[target_id]
    met = value >= threshold if op == ">=" else value <= threshold
    return "PASS" if met else "FAIL"


def row(row_id: str, name: str, value, unit: str, target_id=None, detail="", error=None) -> dict:
    entry = {"id": row_id, "name": name, "value": value, "unit": unit, "detail": detail}
    if target_id:
        op, threshold, _ = {**TARGETS, **CASES}[target_id]
        entry["target"] = f"{op} {threshold:g}"
        entry["status"] = target_verdict(target_id, value)
    if error:
        entry["status"] = "ERROR"
        entry["error"] = error
    return entry


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else math.nan


def speed_rows(reference_loop: dict, gptlab: dict) -> list[dict]:
    """The reference loop against gptlab-train experiment=reference, the same steps."""
    return [
        row(
            "reference_loop_steps_per_s",
            "reference-style loop: train steps/s",
            reference_loop["train_steps_per_s"],
            "steps/s",
            detail=f"{reference_loop['steps']} steps, estimate_loss excluded",
        ),
        row(
            "gptlab_reference_steps_per_s",
            "gptlab-train experiment=reference: train steps/s",
            gptlab["train_steps_per_s"],
            "steps/s",
            detail="metrics.json tokens_per_sec / tokens per step, validation excluded",
        ),
        row(
            "speedup_vs_reference",
            "speed-up, train steps only",
            ratio(gptlab["train_steps_per_s"], reference_loop["train_steps_per_s"]),
            "x",
            "speedup_vs_reference",
        ),
        row(
            "speedup_incl_validation",
            "speed-up, validation included (informative)",
            ratio(gptlab["steps_per_s_incl_val"], reference_loop["steps_per_s_incl_eval"]),
            "x",
            detail="each side with its own validation: exact val split every 50 steps against "
            "2x20 batches every 20",
        ),
    ]


def precision_rows(setting: str, fp32: dict, bf16: dict) -> list[dict]:
    """fp32 against bf16-mixed: steps/s of each, their ratio, the final val loss each reaches."""
    error = bf16.get("error")
    key = setting.replace("=", "_").replace(" ", "_")
    after = f"after {fp32['steps']} steps"

    def bf16_value(name: str):
        return None if error else bf16[name]

    return [
        row(
            f"{key}_fp32_steps_per_s",
            f"{setting}, fp32: train steps/s",
            fp32["train_steps_per_s"],
            "steps/s",
        ),
        row(
            f"{key}_bf16_steps_per_s",
            f"{setting}, bf16-mixed: train steps/s",
            bf16_value("train_steps_per_s"),
            "steps/s",
            detail=BF16,
            error=error,
        ),
        row(
            f"{key}_bf16_vs_fp32",
            f"{setting}: bf16-mixed / fp32 steps/s",
            None if error else ratio(bf16["train_steps_per_s"], fp32["train_steps_per_s"]),
            "x",
            error=error,
        ),
        row(
            f"{key}_fp32_val_loss",
            f"{setting}, fp32: final val loss {after}",
            fp32["final_val_loss"],
            "nats",
        ),
        row(
            f"{key}_bf16_val_loss",
            f"{setting}, bf16-mixed: final val loss {after}",
            bf16_value("final_val_loss"),
            "nats",
            error=error,
        ),
    ]


def overhead_rows(overhead: dict) -> list[dict]:
    return [
        row(
            "bare_steps_per_s",
            "gptlab GPT, bare PyTorch loop: steps/s",
            overhead["bare"]["train_steps_per_s"],
            "steps/s",
        ),
        row(
            "lightning_steps_per_s",
            "gptlab GPT under Lightning (gptlab-train): steps/s",
            overhead["lightning"]["train_steps_per_s"],
            "steps/s",
        ),
        row(
            "lightning_overhead_pct",
            "Lightning overhead at batch 4 x context 16",
            overhead["overhead_pct"],
            "%",
            "lightning_overhead_pct",
        ),
    ]


def default_run_rows(startup: dict, default: dict, reach: dict) -> list[dict]:
    """Start-up, the default run's memory, and its time to the reference's final val loss."""
    reached = reach["default_seconds"]
    return [
        row(
            "startup_s",
            "start-up to first train/loss record (median)",
            startup["seconds"],
            "s",
            "startup_s",
        ),
        row(
            "default_peak_rss_mb",
            "peak RSS of the default run",
            default["peak_rss_mb"],
            "MB",
            "default_peak_rss_mb",
        ),
        row(
            "reference_val_loss",
            "reference's final val loss",
            reach["reference_val_loss"],
            "nats",
            detail=reach["source"],
        ),
        row(
            "default_time_to_reference_loss_s",
            "default run: time to that val loss",
            reached,
            "s",
            detail="command start to the first val/loss at or below it; n/a: not reached",
        ),
        row(
            "reference_wall_s",
            "reference run wall time",
            reach["reference_wall_s"],
            "s",
            detail=reach["reference_wall_source"],
        ),
        row(
            "time_to_reference_loss_fraction",
            "time to reference loss / reference wall time",
            None if reached is None else reached / reach["reference_wall_s"],
            "",
            "time_to_reference_loss_fraction",
        ),
    ]


def busy_rows(busy: dict) -> list[dict]:
    return [
        row(
            "quiet_tokens_per_s",
            "default run as shipped, quiet: tokens/s",
            busy["quiet"]["tokens_per_sec"],
            "tokens/s",
            detail=f"{busy['quiet']['steps']} steps, no num_threads (torch's default)",
        ),
        row(
            "busy_tokens_per_s",
            "... with one CPU-bound competitor: tokens/s",
            busy["busy"]["tokens_per_sec"],
            "tokens/s",
            detail=f"competitor held {busy['competitor']['cores']:.2f} cores meanwhile",
        ),
        row("busy_quiet_ratio", "busy / quiet tokens/s", busy["ratio"], "", "busy_quiet_ratio"),
    ]


def corpus_rows(corpus: dict | None, default: dict) -> list[dict]:
    """Row 7, per size of text: bare tiktoken, gptlab's tokenization, their ratio, peak memory
    and the store's size; the largest size is judged. Then training tokens/s on its store."""
    if not corpus:
        return []
    rows = []
    for size in corpus["sizes"]:
        judged = size is corpus["sizes"][-1]
        tag = f"{size['megabytes']:.3g} MB"
        key = f"corpus_{size['megabytes']:.3g}mb"
        rate = f"{size['tokenize_mb_per_s']:.1f} MB/s"
        for name, label, value, unit, target in (
            ("bare_s", "bare tiktoken read + batch-encode, all cores", "bare", "s", None),
            ("tokenize_s", f"gptlab tokenization, cold - warm ({rate})", "tokenize_s", "s", None),
            ("tokenize_vs_bare", "tokenization / bare tiktoken", "tokenize_vs_bare", "x", 1),
            ("peak_rss_mb", "peak RSS of the cold and warm runs", "peak_rss_mb", "MB", 1),
            ("store_bytes_per_byte", "store bytes / text byte", "store_bytes_per_text_byte", "", 1),
        ):
            number = size["bare"]["seconds"] if value == "bare" else size[value]
            target_id = f"corpus_{name}" if judged and target else None
            rows.append(
                row(target_id or f"{key}_{name}", f"corpus {tag}: {label}", number, unit, target_id)
            )
    big = corpus["sizes"][-1]["warm"]
    rows.append(
        row(
            "corpus_tokens_per_s_vs_book",
            "training tokens/s on the largest store / the default run's on the book",
            ratio(big["tokens_per_sec"], default["tokens_per_sec"]),
            "x",
            detail=f"{big['steps']} steps against {default['steps']}, validation excluded",
        )
    )
    return rows


def all_rows(results: dict, info: dict) -> list[dict]:
    """Every row of the table, from the measurements."""
    cpu = row(
        "cpu_bf16",
        "CPU bf16 instructions (/proc/cpuinfo flags)",
        info["cpu_bf16"],
        "",
        detail=f"{info['cpu_model']}; amx_bf16/amx_tile: AMX, avx512_bf16: AVX512-BF16",
    )
    ablations = [
        row("ablation", f"  variant: {a['variant']}", a["overhead_pct"], "% overhead")
        for a in results.get("ablations", [])
        if "overhead_pct" in a
    ]
    return [
        cpu,
        *speed_rows(results["reference_loop"], results["gptlab_reference"]),
        *precision_rows(
            "experiment=reference", results["gptlab_reference"], results["gptlab_reference_bf16"]
        ),
        *overhead_rows(results["overhead"]),
        *default_run_rows(
            results["startup"], results["default_run"], results["time_to_reference_loss"]
        ),
        *precision_rows("default run", results["default_run"], results["default_run_bf16"]),
        *busy_rows(results["busy_machine"]),
        *corpus_rows(results.get("corpus"), results["default_run"]),
        *ablations,
    ]
