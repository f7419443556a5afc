"""Shared test fixtures. The corpus lives in GPTLAB_DATA_DIR (a read-only shared mount)."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

SHARED = Path(os.environ.get("GPTLAB_DATA_DIR", "data")).expanduser().resolve()
SALES_TEXTBOOK = SHARED / "sales_textbook.txt"


# This test process's own signing key (gptlab.run.ownership), outside every run directory, set
# before any test module is imported: every process the tests start inherits it (some modules
# copy os.environ at import), so the runs they make are this "user's" own and no test touches the
# real user's key.
KEY_FOLDER = Path(tempfile.mkdtemp(prefix="gptlab-key-"))
os.environ["GPTLAB_KEY_FILE"] = str(KEY_FOLDER / "key")


def pytest_unconfigure(config) -> None:
    shutil.rmtree(KEY_FOLDER, ignore_errors=True)


@pytest.fixture(autouse=True)
def places(tmp_path):
    """Where this test's own calls into gptlab may write (gptlab.run.place admits every tool's
    places; a test calling a writer directly is no tool): its tmp_path. A tool the test runs in
    this process (helpers.run_main) starts with no places and admits its own."""
    from gptlab.run.place import PLACE

    PLACE.__init__()
    PLACE.roots.append(tmp_path)
    yield PLACE


@pytest.fixture(scope="session")
def corpus_path() -> Path:
    """Absolute path of the shared sales_textbook.txt (tests may change directory)."""
    assert SALES_TEXTBOOK.is_file(), f"set GPTLAB_DATA_DIR to the folder of {SALES_TEXTBOOK.name}"
    return SALES_TEXTBOOK


@pytest.fixture(scope="session")
def corpus_text(corpus_path: Path) -> str:
    return corpus_path.read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def finished(tmp_path_factory) -> Path:
    """One finished debug=fast run of this user's (20 steps, validation over the whole val split),
    made once per test process; a test that changes it works on a copy (helpers.own_copy)."""
    from helpers import check, run_main

    cwd = tmp_path_factory.mktemp("finished")
    args = ["debug=fast", "trainer.max_steps=20", "trainer.limit_val_batches=1.0"]
    check(run_main(*args, "hydra.run.dir=run", cwd=cwd))
    return cwd / "run"


# The files that take longest start first: the workers share the files (pytest-xdist
# --dist loadfile, in collection order: --no-loadscope-reorder, else xdist puts the files of most
# tests first), and a long file started last would leave one worker running it alone at the end
# of the suite (test_ddp and test_gpu_check did: few tests, a minute each).
LONGEST_FIRST = (  # measured: pytest --junitxml, each file's tests summed (2 cores, quiet)
    "test_search.py",
    "test_export.py",
    "test_slurm.py",
    "test_benchmark.py",
    "test_loggers.py",
    "test_import.py",
    "test_ddp.py",
    "test_resume.py",
    "test_sweep.py",
    "test_mixture.py",
    "test_lm_eval_check.py",
    "test_process.py",
    "test_scaling.py",
    "test_downstream_callback.py",
    "test_mixture_metrics.py",
    "test_gpu_check.py",
    "test_train.py",
    "test_tasks.py",
    "test_reader.py",
    "test_muon.py",
    "test_sources.py",
    "test_place.py",
    "test_branch.py",
    "test_mup.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable within a file


# ---------------------------------------------------------------------------------------------
# a real two-node SLURM cluster on this host (tests/slurm_cluster.py), for tests/test_slurm.py


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "slurm: runs jobs on a real two-node SLURM cluster on this host (root, slurm-wlm, munge)",
    )


@pytest.fixture(scope="session")
def slurm_cluster():
    """A two-node SLURM cluster (nodes n1, n2; partition debug) of this session's own.

    Its SLURM_CONF is set in os.environ, so every process the tests start (and every job,
    through sbatch/srun's --export=ALL) finds it. It lives in a private directory (mkdtemp: short
    enough for the unix sockets of munged and slurmd), on free ports, with its own munged; it is
    stopped and its directory removed whatever happens. Skips, with the reason, without root or
    without SLURM."""
    from slurm_cluster import Cluster, unavailable

    reason = unavailable()
    if reason:
        pytest.skip(reason)
    directory = Path(tempfile.mkdtemp(prefix="gptlab-slurm-"))
    cluster = Cluster(directory)
    try:
        cluster.up(stop_at_exit=True)
        with pytest.MonkeyPatch.context() as env:
            for key, value in cluster.client_env().items():
                env.setenv(key, value)
            yield cluster
    finally:
        cluster.down()
        shutil.rmtree(directory, ignore_errors=True)
