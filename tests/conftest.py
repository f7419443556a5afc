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
# a real two-node SLURM cluster on this host (tests/slurm_cluster.py): tests/test_slurm.py


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "slurm: runs jobs on a real two-node SLURM cluster on this host (root, slurm-wlm, munge)",
    )
