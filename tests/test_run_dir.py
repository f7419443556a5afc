"""The run directory as untrusted input, and the crash windows around it: one finished debug=fast
run, copied per test, planted with what a stranger's directory could hold (overrides that climb
out of the config tree, a secret in a URL, a moved output dir, symlinks), then resumed or
evaluated by the real console scripts. Each test checks that nothing ran, leaked or changed."""

from __future__ import annotations

import http.server
import importlib.resources
import json
import math
import os
import shutil
import threading
from pathlib import Path

import pytest
import yaml
from helpers import check, read_metrics, run_cli, run_main
from hydra.core.override_parser.overrides_parser import OverridesParser

from gptlab.errors import ConfigError
from gptlab.run import directory
from gptlab.run.settings import checked, literal, literal_node, replayable

FAST = ["debug=fast", "trainer.max_steps=20"]
SECRET = "s3cr3t-gptlab-token"


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """One finished run for the module; tests work on copies of it."""
    cwd = tmp_path_factory.mktemp("finished")
    check(run_cli(*FAST, "hydra.run.dir=run", cwd=cwd))
    return cwd / "run"


@pytest.fixture
def copy(finished, tmp_path) -> Path:
    run_dir = tmp_path / "handed" / "run"
    shutil.copytree(finished, run_dir)
    return run_dir


@pytest.fixture
def server():
    """A real HTTP server on a free port that records every request path (and answers 404)."""
    paths: list[str] = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            paths.append(self.path)
            self.send_error(404)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1], paths
    httpd.shutdown()
    httpd.server_close()


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# ------------------------------------------------------------------ unit: the layout and its checks


def test_the_layout_lives_in_one_place(tmp_path):
    assert directory.last_checkpoint(tmp_path) == tmp_path / "checkpoints" / "last.ckpt"
    assert directory.best_checkpoint(tmp_path) == tmp_path / "checkpoints" / "best.ckpt"
    assert directory.metrics_file(tmp_path) == tmp_path / "metrics.json"
    assert directory.saved_config(tmp_path) == tmp_path / ".hydra" / "config.yaml"
    assert directory.staging_path(tmp_path / "last.ckpt") == tmp_path / ".last.ckpt.tmp"


def test_a_start_continues_with_resume_or_a_requeue_and_a_last_checkpoint(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    assert not directory.continues(tmp_path, resume="x")  # nothing to continue from
    directory.last_checkpoint(tmp_path).parent.mkdir()
    directory.last_checkpoint(tmp_path).write_bytes(b"ckpt")
    assert directory.continues(tmp_path, resume="x")
    assert not directory.continues(tmp_path, resume=None)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert directory.continues(tmp_path, resume=None)
    assert directory.holds_run(tmp_path)
    with pytest.raises(ConfigError, match="resume="):
        directory.refuse_fresh_run_over(tmp_path)


def test_write_text_replaces_a_symlink_and_leaves_its_target(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.json").symlink_to(outside)
    directory.write_text(tmp_path / "run" / "metrics.json", "{}\n")
    assert outside.read_text() == "precious"
    assert not (tmp_path / "run" / "metrics.json").is_symlink()
    assert (tmp_path / "run" / "metrics.json").read_text() == "{}\n"


def test_secure_removes_stale_files_replaces_linked_files_refuses_linked_folders(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / ".last.ckpt.tmp").write_bytes(b"half a checkpoint")
    (run / "train.log").symlink_to(outside)
    directory.secure(run)
    assert not (run / "checkpoints" / ".last.ckpt.tmp").exists()
    assert not (run / "train.log").exists() and outside.read_text() == "precious"
    (run / "tensorboard").symlink_to(tmp_path)
    with pytest.raises(ConfigError, match="tensorboard"):
        directory.secure(run)


# ------------------------------------------------------------ unit: recorded settings, as data


@pytest.mark.parametrize(
    "override",
    [
        "experiment=../../../../tmp/x/evil",
        "experiment=no_such_option",
        "logger=[tensorboard,../../x]",
        "paths.output_dir=/elsewhere",
        "trainer.default_root_dir=/elsewhere",
        "data.url=http://127.0.0.1:1/${oc.env:SECRET}/book.txt",
        "data.url='${oc.env:SECRET}'",
        "+callbacks.x._target_=builtins.print",
        "callbacks.text_sample._target_=builtins.print",
        "trainer.profiler={_target_:builtins.print}",
        "hydra.callbacks.x._target_=builtins.open",
        "~callbacks.text_sample",
        "model.d_model=${oc.decode:'64'}",
        'sample_prompt="a\\\'b"',
    ],
)
def test_a_recorded_setting_that_is_not_data_is_dropped(override):
    assert checked(override) == (None, override)


@pytest.mark.parametrize(
    ("override", "value"),
    [
        ("trainer.max_steps=35", 35),
        ("model.dropout=0.1", 0.1),
        ("optim.lr=1e-3", 0.001),
        ("trainer.deterministic=true", True),
        ("trainer.gradient_clip_val=null", None),
        ("data.url=https://example.org/a.txt", "https://example.org/a.txt"),
        ("data.path='/data/my file.txt'", "/data/my file.txt"),
        ('sample_prompt="It\'s a deal"', "It's a deal"),
        ("debug=fast", "fast"),
        ("logger=[tensorboard,csv]", ["tensorboard", "csv"]),
    ],
)
def test_a_literal_is_re_emitted_so_that_hydra_reads_the_same_value(override, value):
    kept, dropped = checked(override)
    assert dropped is None
    assert OverridesParser.create().parse_override(kept).value() == value


def test_resume_and_ckpt_path_are_not_re_applied_and_not_named(capsys):
    assert replayable(["resume=/a", "ckpt_path=/b", "seed=3"], "here") == ["seed=3"]
    assert capsys.readouterr().err == ""
    assert replayable(["seed=3", "paths.output_dir=/x", "experiment=../e"], "here") == ["seed=3"]
    [line] = capsys.readouterr().err.splitlines()
    assert "paths.output_dir=/x" in line and "experiment=../e" in line


def test_a_saved_config_node_keeps_only_literals():
    node = {"url": "http://h/${oc.env:S}/b.txt", "batch_size": 8, "x": {"_target_": "os.system"}}
    assert literal_node(node, "data") == ({"batch_size": 8}, ["data.url", "data.x"])
    assert literal("'${oc.env:S}'") is None


# ------------------------------------------------------------- planted run directories, resumed


def plant_evil_experiment(tmp_path: Path) -> tuple[str, Path]:
    """A real YAML outside the config tree whose hydra.callbacks would create a marker file."""
    marker = tmp_path / "PWNED"
    evil = tmp_path / "x" / "evil.yaml"
    evil.parent.mkdir()
    evil.write_text(
        "# @package _global_\n"
        f"hydra:\n  callbacks:\n    evil:\n      _target_: builtins.open\n"
        f"      file: {marker}\n      mode: w\n"
    )
    experiment_dir = importlib.resources.files("gptlab.conf") / "experiment"
    climb = "../" * (len(Path(str(experiment_dir)).parts) - 1)  # up to /
    return f"experiment={climb}{str(evil.with_suffix(''))[1:]}", marker


def test_a_planted_run_directory_is_resumed_as_data(copy, tmp_path, server):
    port, requests = server
    traversal, marker = plant_evil_experiment(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    planted = [
        *FAST,
        "trainer.max_steps=24",
        traversal,
        f"paths.output_dir={elsewhere}",
        f"data.url=http://127.0.0.1:{port}/${{oc.env:GPTLAB_TEST_SECRET}}/book.txt",
        "+callbacks.evil._target_=builtins.print",
    ]
    (copy / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(planted))
    result = run_cli(f"resume={copy}", cwd=tmp_path, env={"GPTLAB_TEST_SECRET": SECRET})
    check(result)
    dropped = [line for line in result.stderr.splitlines() if "not re-applying" in line]
    assert len(dropped) == 1 and "4 setting(s)" in dropped[0]
    assert traversal in dropped[0] and "paths.output_dir" in dropped[0]
    assert not marker.exists()  # the evil experiment's hydra.callbacks never ran
    assert requests == []  # no request at all, so none that carries the secret
    assert not elsewhere.exists()
    assert read_metrics(copy)["steps"] == 24  # the run went on, in its own directory
    assert SECRET not in (copy / "train.log").read_text()


def test_eval_reads_a_runs_config_as_data(copy, tmp_path, server):
    port, requests = server
    config = yaml.safe_load((copy / ".hydra" / "config.yaml").read_text())
    config["data"]["url"] = f"http://127.0.0.1:{port}/${{oc.env:GPTLAB_TEST_SECRET}}/book.txt"
    (copy / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    result = run_cli(
        f"ckpt_path={copy}", tool="gptlab-eval", cwd=tmp_path, env={"GPTLAB_TEST_SECRET": SECRET}
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "data.url" in result.stderr and "Traceback" not in result.stderr
    assert requests == []
    assert SECRET not in result.stdout + result.stderr
    assert not (copy / "eval.json").exists()


def plant_links(run_dir: Path, names: list[str], tmp_path: Path) -> dict[Path, bytes]:
    """Each name in the run dir a symlink to a file outside it; {target: its bytes}."""
    outside = {}
    for name in names:
        target = tmp_path / f"outside-{Path(name).name}"
        target.write_text(f'{{"precious": "{name}"}}\n')
        outside[target] = target.read_bytes()
        (run_dir / name).unlink(missing_ok=True)
        (run_dir / name).symlink_to(target)
    return outside


def test_symlinks_in_a_run_directory_are_never_written_through(copy, tmp_path):
    """resume= of the finished run (it trains nothing: it rewrites its logs and metrics.json),
    then gptlab-eval, each with symlinks planted under the names they write."""
    before = read_metrics(copy)
    written = ["metrics.json", "train.log", "config_tree.log", "checkpoints/.last.ckpt.tmp"]
    outside = plant_links(copy, written, tmp_path)
    check(run_cli(f"resume={copy}", cwd=tmp_path))
    outside.update(plant_links(copy, ["eval.json"], tmp_path))
    check(run_cli(f"ckpt_path={copy}", tool="gptlab-eval", cwd=tmp_path))

    for target, content in outside.items():
        assert target.read_bytes() == content, target  # neither overwritten nor appended to
    [label] = json.loads((copy / "eval.json").read_text())  # its own file, not the planted one
    assert "best.ckpt" in label
    assert not (copy / "checkpoints" / ".last.ckpt.tmp").exists()  # the stale file is gone
    assert not any(p.is_symlink() for p in copy.rglob("*"))
    after = finite_metrics(copy)  # resume= of a finished run: the same results, all finite
    for key in ("best_val_loss", "final_val_loss", "final_val_bpb", "tokens_seen", "steps"):
        assert after[key] == before[key], key
    assert_one_output_folder(tmp_path, "eval")  # gptlab-eval left no empty run folders


def test_a_fresh_run_into_a_finished_run_is_refused(copy, tmp_path):
    before = tree_bytes(copy)
    result = run_main(*FAST, f"hydra.run.dir={copy}", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"resume={copy}" in result.stderr and "Traceback" not in result.stderr
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
    run_dir = tmp_path / "it's a run"
    shutil.copytree(finished, run_dir)
    (run_dir / "metrics.json").unlink()
    check(run_cli(f"resume={run_dir}", cwd=tmp_path))
    whole = read_metrics(finished)
    restored = finite_metrics(run_dir)
    for key in ("best_val_loss", "final_val_loss", "best_val_bpb", "final_val_bpb"):
        assert abs(restored[key] - whole[key]) <= 1e-6, key
    assert restored["tokens_seen"] == whole["tokens_seen"] > 0
    assert restored["steps"] == whole["steps"] == 20


def test_a_directory_named_with_an_interpolation_is_refused_clearly(finished, tmp_path):
    run_dir = tmp_path / "run ${oc.env:GPTLAB_TEST_SECRET}"
    shutil.copytree(finished, run_dir)
    before = tree_bytes(run_dir)
    result = run_main(f"resume={run_dir}", cwd=tmp_path, env={"GPTLAB_TEST_SECRET": SECRET})
    assert result.returncode == 2 and "Rename it" in result.stderr
    assert "Traceback" not in result.stderr and SECRET not in result.stderr
    assert tree_bytes(run_dir) == before


def test_a_sweep_job_killed_before_metrics_json_is_repaired_by_resume(tmp_path):
    sweep = tmp_path / "sweep"
    grid = ["-m", *FAST, "trainer.max_steps=10", "model.num_heads=1,2", f"hydra.sweep.dir={sweep}"]
    check(run_cli(*grid, cwd=tmp_path))
    whole = read_metrics(sweep / "0")
    kept = (sweep / "1" / "metrics.json").read_bytes()
    (sweep / "0" / "metrics.json").unlink()

    refused = run_main(*grid, cwd=tmp_path)  # the same sweep again, fresh: refused
    assert refused.returncode == 2 and f"resume={sweep}" in refused.stderr
    check(run_cli(f"resume={sweep}", cwd=tmp_path))
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
        run_cli(f"ckpt_path={finished}", "tensorboard=false", tool="gptlab-inspect", cwd=tmp_path)
    )
    assert_one_output_folder(tmp_path, "inspect")
