"""Corpora beyond one text file, on real files: a folder, a glob, JSONL (plain and gzip), Parquet
(real pyarrow) and a Hugging Face dataset (real `datasets`, offline, from a local folder of
Parquet files). Each trains with debug=fast; each kind of bad input exits 2 with one paragraph
naming the file or field, and writes no checkpoint."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiktoken
from helpers import check, read_metrics, run_cli, run_main

from gptlab.data.datamodule import GPTDataModule
from gptlab.errors import ConfigError

FAST = ("debug=fast", "trainer.max_steps=4", "trainer.val_check_interval=4", "logger=none")
SKIPPED = "Sample prompt 'The salesperson': this corpus's vocabulary cannot encode it"


@pytest.fixture(scope="module")
def corpora(tmp_path_factory, corpus_text) -> dict[str, Path]:
    """The book as many documents (its paragraphs), in every format; one folder lowercased, so
    its compact vocabulary lacks "The" (the default sample prompt's first token)."""
    root = tmp_path_factory.mktemp("corpora")
    docs = [line for line in corpus_text.splitlines() if line.strip()]
    half = len(docs) // 2
    books = root / "books"
    books.mkdir()
    (books / "b.txt").write_text("\n".join(docs[half:]).lower(), encoding="utf-8")
    (books / "a.txt").write_text("\n".join(docs[:half]).lower(), encoding="utf-8")
    (books / "notes.md").write_text("not read: a folder gives its .txt files", encoding="utf-8")
    (books / ".hidden.txt").write_text("not read either", encoding="utf-8")
    lines = "".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in enumerate(docs))
    (root / "docs.jsonl").write_text(lines, encoding="utf-8")
    (root / "docs.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    table = pa.table({"id": list(range(len(docs))), "text": docs})
    pq.write_table(table, root / "docs.parquet", row_group_size=200)  # several row groups
    hub = root / "hub" / "data"
    hub.mkdir(parents=True)
    pq.write_table(table.slice(0, half), hub / "train-00000-of-00002.parquet")
    pq.write_table(table.slice(half), hub / "train-00001-of-00002.parquet")
    return {"root": root, "books": books, "hub": hub.parent, "docs": docs}


def joined_ids(docs: list[str]) -> np.ndarray:
    """tiktoken ids of the documents joined with the end-of-text token, compact-mapped."""
    encoding = tiktoken.get_encoding("cl100k_base")
    ids = []
    for i, doc in enumerate(docs):
        ids += ([encoding.eot_token] if i else []) + encoding.encode_ordinary(doc)
    ids = np.asarray(ids)
    return np.searchsorted(np.unique(ids), ids)


def tokens_of(tmp_path: Path, **settings) -> np.ndarray:
    module = GPTDataModule(url=None, sha256=None, cache_dir=str(tmp_path / "cache"), **settings)
    module.setup("fit")
    return np.concatenate([module.splits["train"], module.splits["val"]])


def test_a_folder_and_a_glob_read_their_files_in_sorted_order(corpora, tmp_path):
    books = corpora["books"]
    expected = joined_ids([(books / n).read_text(encoding="utf-8") for n in ("a.txt", "b.txt")])
    assert np.array_equal(tokens_of(tmp_path, path=str(books)), expected)
    assert np.array_equal(tokens_of(tmp_path, path=str(books / "*.txt")), expected)
    assert len(list((tmp_path / "cache").iterdir())) == 1  # the same content: the same store


@pytest.mark.parametrize("name", ["docs.jsonl", "docs.jsonl.gz", "docs.parquet"])
def test_jsonl_and_parquet_give_one_document_per_record(corpora, tmp_path, name):
    got = tokens_of(tmp_path, path=str(corpora["root"] / name))
    assert np.array_equal(got, joined_ids(corpora["docs"]))


def bad_inputs(root: Path) -> dict[str, tuple[list[str], str]]:
    """name: (overrides, what the message must say)."""
    (root / "empty").mkdir()
    (root / "binary.txt").write_bytes(b"text\x00\x01\x02 then binary")
    (root / "latin1.txt").write_bytes("caf\u00e9 cr\u00e8me".encode("latin-1"))
    (root / "nofield.jsonl").write_text('{"body": "some text"}\n', encoding="utf-8")
    pq.write_table(pa.table({"body": ["some text"]}), root / "nocolumn.parquet")
    pq.write_table(pa.table({"text": [1, 2]}), root / "numbers.parquet")
    (root / "hub").mkdir()
    pq.write_table(pa.table({"text": ["some text"]}), root / "hub" / "train-00000-of-00001.parquet")
    text = "data=text_file"
    return {
        "empty folder": ([text, f"data.path={root / 'empty'}"], "the folder holds no"),
        "empty glob": ([text, f"data.path={root / 'empty'}/*.txt"], "matches no file"),
        "binary": ([text, f"data.path={root / 'binary.txt'}"], "NUL bytes"),
        "not UTF-8": ([text, f"data.path={root / 'latin1.txt'}"], "not UTF-8"),
        "JSONL field": ([text, f"data.path={root / 'nofield.jsonl'}"], "no text field 'text'"),
        "Parquet column": ([text, f"data.path={root / 'nocolumn.parquet'}"], "no column 'text'"),
        "Parquet numbers": ([text, f"data.path={root / 'numbers.parquet'}"], "int64, not text"),
        "dataset column": (
            ["data=hf", f"data.name={root / 'hub'}", "data.text_field=body"],
            "has no column 'body' (its columns: text)",
        ),
        "dataset offline": (["data=hf", "data.name=nobody/no-such-dataset"], "could not be loaded"),
    }


def test_bad_input_exits_2_naming_the_file_or_field_and_writes_no_checkpoint(tmp_path):
    env = {"HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    for name, (overrides, phrase) in bad_inputs(tmp_path).items():
        run = tmp_path / "runs" / name.replace(" ", "-")
        result = run_main(*overrides, f"hydra.run.dir={run}", cwd=tmp_path, env=env)
        assert result.returncode == 2, (name, result.stderr[-2000:])
        assert phrase in result.stderr and "Traceback" not in result.stderr, name
        where = overrides[-1].split("=", 1)[1]
        assert where.split("/")[-1] in result.stderr, name  # the file, glob or dataset named
        assert not list(run.rglob("*.ckpt")), name


def test_a_checksum_names_a_single_file(corpora, tmp_path):
    with pytest.raises(ConfigError, match="data.sha256 checks a single file"):
        GPTDataModule(path=str(corpora["books"]), sha256="ab" * 32).prepare_data()


# ------------------------------------------------------------------ real runs
def train(tmp_path: Path, *overrides: str, env: dict | None = None):
    """In this process; in a new one where `env` is given (datasets reads HF_HOME at import)."""
    args = (*FAST, *overrides, "hydra.run.dir=run")
    if env:
        result = check(run_cli(*args, cwd=tmp_path, env=env))
    else:
        result = check(run_main(*args, cwd=tmp_path))
    assert read_metrics(tmp_path / "run")["steps"] == 4
    return result


def test_a_folder_trains_and_a_prompt_it_cannot_encode_skips_the_samples(corpora, tmp_path):
    """The lowercased books lack "The": the run says so once on its first screen, warns at its
    first text sample, and trains to the end."""
    result = train(tmp_path, "data=text_file", f"data.path={corpora['books']}")
    out = result.stderr
    assert out.count(SKIPPED) == 1 and "No text sample for prompt 'The salesperson'" in out
    assert "Data: 2 files" in out and "a validation covers 1,024 of the " in out  # 4 x 8 x 32


def test_a_parquet_file_trains(corpora, tmp_path):
    """A glob and JSONL take the same path into training (their reading is tested above)."""
    result = train(tmp_path, "data=text_file", f"data.path={corpora['root'] / 'docs.parquet'}")
    assert "Tokenizing" in result.stderr and "Wrote token store" in result.stderr


def test_a_hugging_face_dataset_from_a_local_folder_trains_offline(corpora, tmp_path):
    env = {"HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    result = train(tmp_path, "data=hf", f"data.name={corpora['hub']}", env=env)
    assert f"Data: {corpora['hub']} (train, {len(corpora['docs']):,} rows)" in result.stderr
    assert list((tmp_path / "hf").rglob("*.arrow"))  # datasets' own cache, not gptlab's
