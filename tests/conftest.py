"""Shared test fixtures. The corpus lives in GPTLAB_DATA_DIR (a read-only shared mount)."""

import os
from pathlib import Path

import pytest

SHARED = Path(os.environ.get("GPTLAB_DATA_DIR", "data")).expanduser().resolve()
SALES_TEXTBOOK = SHARED / "sales_textbook.txt"


@pytest.fixture(scope="session")
def corpus_path() -> Path:
    """Absolute path of the shared sales_textbook.txt (tests may change directory)."""
    assert SALES_TEXTBOOK.is_file(), f"set GPTLAB_DATA_DIR to the folder of {SALES_TEXTBOOK.name}"
    return SALES_TEXTBOOK


@pytest.fixture(scope="session")
def corpus_text(corpus_path: Path) -> str:
    return corpus_path.read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# a real two-node SLURM cluster on this host (tests/slurm_cluster.py), for tests/test_slurm.py


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "slurm: runs jobs on a real two-node SLURM cluster on this host (root, slurm-wlm, munge)",
    )


@pytest.fixture(scope="session")
def slurm_cluster():
    """Bring up the two-node SLURM cluster (nodes n1, n2; partition debug) for the session.

    Yields the environment variables a SLURM client needs (SLURM_CONF); they are also set in
    os.environ, so every process the tests start (and every job, through sbatch/srun's
    --export=ALL) finds the cluster. Skips, with the reason, without root or without SLURM.
    A cluster this fixture started is stopped at the end; one already up is left up."""
    import slurm_cluster as cluster

    reason = cluster.unavailable()
    if reason:
        pytest.skip(reason)
    started = cluster.up()
    env = cluster.client_env()
    previous = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield env
    for key, value in previous.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if started:
        cluster.down()
