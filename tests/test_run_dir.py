"""The run directory: its layout, how a file is written, what a resume replays, and the crash
windows around a run's end, with one finished debug=fast run copied per test. Where tools may
write is tests/test_place.py's; what a directory from anyone else can do, tests/test_own.py's."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from helpers import check, own_copy, read_metrics, run_main
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from gptlab import files, reader
from gptlab.run import directory
from gptlab.run.overrides import quote
from gptlab.run.start import continues, plan_argv

FAST = ["debug=fast", "trainer.max_steps=20"]
SECRET = "s3cr3t-gptlab-token"


@pytest.fixture
def copy(finished, tmp_path) -> Path:
    """The finished run, the user's own at a place of this test's."""
    return own_copy(finished, tmp_path / "handed" / "run")


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# ------------------------------------------------------------------ unit: the layout and its checks


def test_the_layout_lives_in_one_place(tmp_path):
    assert directory.last_checkpoint(tmp_path) == tmp_path / "checkpoints" / "last.ckpt"
    assert directory.best_checkpoint(tmp_path) == tmp_path / "checkpoints" / "best.ckpt"
    assert directory.metrics_file(tmp_path) == tmp_path / "metrics.json"
    assert directory.saved_config(tmp_path) == tmp_path / ".hydra" / "config.yaml"
    later = directory.later_start_subdir()
    assert later.startswith(".hydra/resume-") and later != directory.later_start_subdir()


def test_a_start_continues_with_resume_or_a_requeue_and_a_last_checkpoint(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    resume, fresh = OmegaConf.create({"resume": "x"}), OmegaConf.create({"resume": None})
    assert not continues(resume, tmp_path)  # nothing to continue from
    directory.last_checkpoint(tmp_path).parent.mkdir()
    directory.last_checkpoint(tmp_path).write_bytes(b"ckpt")
    assert continues(resume, tmp_path)
    assert not continues(fresh, tmp_path)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert continues(fresh, tmp_path)


def test_write_text_replaces_a_symlink_and_leaves_its_target(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.json").symlink_to(outside)
    files.write_text(tmp_path / "run" / "metrics.json", "{}\n")
    assert outside.read_text() == "precious"
    assert not (tmp_path / "run" / "metrics.json").is_symlink()
    assert (tmp_path / "run" / "metrics.json").read_text() == "{}\n"
    assert reader.read_json(tmp_path / "run" / "metrics.json") == {}
    (tmp_path / "link.json").symlink_to(tmp_path / "run" / "metrics.json")
    assert reader.read_json(tmp_path / "link.json") is None  # never read through a link


def test_a_write_follows_the_umask_and_a_failed_one_leaves_nothing(tmp_path):
    previous = os.umask(0o022)
    try:
        files.write_text(tmp_path / "a.json", "{}")
        assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644
        os.umask(0o077)
        files.write_text(tmp_path / "b.json", "{}")
        assert (tmp_path / "b.json").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(previous)
    with pytest.raises(ZeroDivisionError), files.atomic(tmp_path / "c.json") as f:
        f.write("half")
        raise ZeroDivisionError
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json"]


@pytest.mark.parametrize(
    "text", ["plain", "it's", "a\\b", "ends\\", "\\'", "${oc.env:HOME}", "\\${x}", "'\"${", ""]
)
def test_a_quoted_string_reads_back_as_itself(text):
    """Hydra resolves `${` inside quoted strings too: quote() escapes it with the quotes."""
    parsed = OverridesParser.create().parse_override(f"key={quote(text)}")
    assert OmegaConf.create({"key": parsed.value()}).key == text


def test_a_resume_replays_the_latest_starts_overrides_but_how_it_was_started(copy, tmp_path):
    later = copy / ".hydra" / "resume-2026-01-01_00-00-00-aaaa"
    later.mkdir()
    (later / "overrides.yaml").write_text("- debug=fast\n- ckpt_path=/x\n- trainer.max_steps=30\n")
    argv = plan_argv(["gptlab-train", f"resume={copy}", "seed=3"])
    assert argv[1:] == [
        f"hydra.run.dir='{copy}'",
        "debug=fast",
        "trainer.max_steps=30",
        "seed=3",
        f"resume='{copy}'",
    ]


def test_a_fresh_run_into_a_finished_run_is_refused(copy, tmp_path):
    before = tree_bytes(copy)
    result = run_main(*FAST, f"hydra.run.dir={copy}", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "already holds a run" in result.stderr and "resume=" in result.stderr
    assert "Traceback" not in result.stderr
    assert tree_bytes(copy) == before  # checkpoints, metrics and .hydra/ byte-identical


def test_checkpoints_go_where_resume_looks_not_to_a_setting(tmp_path):
    result = run_main(*FAST, "callbacks.last_checkpoint.dirpath=/tmp/x", cwd=tmp_path)
    assert result.returncode == 2
    assert "dirpath" in result.stderr
    assert not list(tmp_path.rglob("*.ckpt"))


# ------------------------------------------------------------------------------- crash windows


def finite_metrics(run_dir: Path) -> dict:
    metrics = read_metrics(run_dir)
    numbers = [v for v in metrics.values() if isinstance(v, float)]
    assert numbers and all(math.isfinite(v) for v in numbers), metrics
    return metrics


def test_killed_before_metrics_json_resume_restores_them(finished, tmp_path):
    """The window between the final checkpoint and metrics.json (a kill at the end of a run), as
    the issue names it: metrics.json of a finished run deleted, then resume=; in a directory
    whose name Hydra's grammar would misread."""
    run_dir = own_copy(finished, tmp_path / "it's a run")
    (run_dir / "metrics.json").unlink()
    check(run_main(f"resume={run_dir}", cwd=tmp_path))
    whole = read_metrics(finished)
    restored = finite_metrics(run_dir)
    for key in ("best_val_loss", "final_val_loss", "best_val_bpb", "final_val_bpb"):
        assert abs(restored[key] - whole[key]) <= 1e-6, key
    assert restored["tokens_seen"] == whole["tokens_seen"] > 0
    assert restored["steps"] == whole["steps"] == 20


def test_a_directory_named_with_an_interpolation_is_refused_clearly(finished, tmp_path):
    run_dir = own_copy(finished, tmp_path / "run ${oc.env:GPTLAB_TEST_SECRET}")
    before = tree_bytes(run_dir)
    result = run_main(f"resume={run_dir}", cwd=tmp_path, env={"GPTLAB_TEST_SECRET": SECRET})
    assert result.returncode == 2 and "Rename the directory" in result.stderr
    assert "Traceback" not in result.stderr and SECRET not in result.stderr
    assert tree_bytes(run_dir) == before


def test_a_sweep_job_killed_before_metrics_json_is_repaired_by_resume(tmp_path):
    sweep = tmp_path / "sweep"
    grid = ["-m", *FAST, "trainer.max_steps=10", "model.num_heads=1,2", f"hydra.sweep.dir={sweep}"]
    check(run_main(*grid, cwd=tmp_path))
    whole = read_metrics(sweep / "0")
    kept = (sweep / "1" / "metrics.json").read_bytes()
    (sweep / "0" / "metrics.json").unlink()

    refused = run_main(*grid, cwd=tmp_path)  # the same sweep again, fresh: refused
    assert refused.returncode == 2 and "already holds a run, sweep or store" in refused.stderr
    check(run_main(f"resume={sweep}", cwd=tmp_path))
    repaired = finite_metrics(sweep / "0")
    assert repaired["status"] == "ok"
    assert abs(repaired["best_val_loss"] - whole["best_val_loss"]) <= 1e-6
    assert (sweep / "1" / "metrics.json").read_bytes() == kept  # the finished job was kept
    assert "2 ok, 0 failed" in (sweep / "summary.md").read_text()


# -------------------------------------------------------------------------------- small items


def assert_one_output_folder(cwd: Path, tool: str) -> None:
    """The tool's outputs/<tool>/<date>/<time>, holding its output; no empty folder elsewhere."""
    assert os.listdir(cwd / "outputs") == [tool]
    folders = [p for p in (cwd / "outputs").rglob("*") if p.is_dir() and p.name != ".hydra"]
    leaves = [p for p in folders if not any(q.is_dir() and q.name != ".hydra" for q in p.iterdir())]
    assert len(leaves) == 1 and any(leaves[0].iterdir()), folders


def test_inspect_leaves_no_empty_run_folders(finished, tmp_path):
    check(
        run_main(f"ckpt_path={finished}", "tensorboard=false", tool="gptlab-inspect", cwd=tmp_path)
    )
    assert_one_output_folder(tmp_path, "inspect")
