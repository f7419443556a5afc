"""Where the text comes from: a text file, a folder, a glob, JSONL or Parquet files, or a Hugging
Face dataset. A corpus yields (text, new_document) pairs, read in blocks, never whole. Every source
is checked when found (a file's first bytes, first record, schema; a dataset's column), so bad input
fails before any hashing."""

import glob
import itertools
from collections.abc import Iterator
from pathlib import Path

from gptlab.data.config import DataConfig
from gptlab.data.corpus import resolve_corpus
from gptlab.data.formats import (
    check_file,
    check_text_column,
    format_of,
    is_dataset_text,
    jsonl_texts,
    parquet_texts,
    text_blocks,
)
from gptlab.errors import ConfigError
from gptlab.reader import sha256_of

FOLDER_SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".parquet")  # what a folder contributes
ROWS = 1024  # rows of a dataset converted to Python strings at a time


def is_many(path: str | None) -> bool:
    """A folder or a glob (many files), not a single file."""
    return bool(path) and (glob.has_magic(path) or Path(path).expanduser().is_dir())


def find_corpus(settings: DataConfig) -> "Files | HFDataset":
    """A Hugging Face dataset (data.name), else data.path's files or data.url's download."""
    if settings.name:
        return HFDataset(settings.name, settings.split, settings.text_field)
    path = settings.path
    if is_many(path):
        if settings.sha256:
            raise ConfigError(
                f"data.sha256 checks a single file, and data.path='{path}' names many. Set "
                "data.sha256=null."
            )
        return Files(find_files(path), settings.text_field)
    single = resolve_corpus(
        settings.url, path, settings.sha256, settings.data_dir, file_name=settings.file_name
    )
    return Files([single], settings.text_field, settings.sha256)


def find_files(path: str) -> list[Path]:
    """The files of a folder or a glob, sorted."""
    where = Path(path).expanduser()
    if glob.has_magic(path):
        found = sorted(Path(p) for p in glob.glob(str(where), recursive=True) if Path(p).is_file())
        what = f"data.path='{path}': the glob matches no file"
    else:
        named = (p for p in where.iterdir() if p.name.lower().endswith(FOLDER_SUFFIXES))
        found = sorted(p for p in named if p.is_file() and not p.name.startswith("."))
        what = (
            f"data.path='{path}': the folder holds no {', '.join(FOLDER_SUFFIXES)} file "
            "(subfolders are not read; a glob such as 'folder/**/*.txt' reads them)"
        )
    if not found:
        raise ConfigError(
            f"{what}. Check the path (relative paths are taken from '{Path.cwd()}') or unset "
            "data.path to download data.url."
        )
    return found


class Files:
    """A corpus of local files, read in sorted order; documents joined by the tokenizer."""

    def __init__(self, paths: list[Path], text_field: str, sha256: str | None = None):
        self.paths = paths
        self.text_field = text_field
        self.known_sha256 = sha256  # of the single file, verified already (resolve_corpus)
        for path in paths:
            check_file(path, text_field)

    def describe(self) -> str:
        first = self.paths[0]
        return str(first) if len(self.paths) == 1 else f"{len(self.paths)} files ({first}, ...)"

    def identity(self) -> list[dict]:
        """What the token store is keyed by: each file's format, field and content."""
        known = self.known_sha256 if len(self.paths) == 1 else None
        return [
            {
                "path": str(path),
                "format": format_of(path),
                "text_field": None if format_of(path) == "text" else self.text_field,
                "bytes": path.stat().st_size,
                "sha256": known or sha256_of(path),
            }
            for path in self.paths
        ]

    def total_bytes(self) -> int | None:
        """The bytes of text to tokenize when every file is plain text (a progress bar's end)."""
        if any(format_of(p) != "text" for p in self.paths):
            return None
        return sum(p.stat().st_size for p in self.paths)

    def documents(self) -> Iterator[tuple[str, bool]]:
        readers = {"text": text_blocks, "jsonl": jsonl_texts, "parquet": parquet_texts}
        for path in self.paths:
            yield from readers[format_of(path)](path, self.text_field)


class HFDataset:
    """data.name (a hub id or a local folder), data.split, data.text_field."""

    def __init__(self, name: str, split: str, text_field: str):
        try:
            import datasets
        except ImportError:
            raise ConfigError(
                f"data.name='{name}': reading a Hugging Face dataset needs the datasets library. "
                "Install it with `pip install 'gptlab[hf]'`, or give a local file as data.path."
            ) from None
        self.name = name
        self.split = split
        self.text_field = text_field
        try:
            self.dataset = datasets.load_dataset(name, split=split)
        except Exception as e:  # the hub, the cache and the builders each raise their own
            raise ConfigError(
                f"data.name='{name}' (split '{split}'): the Hugging Face dataset could not be "
                f"loaded ({e.__class__.__name__}: {e}). Check the name and data.split; offline "
                "(HF_DATASETS_OFFLINE=1) it must be in the datasets cache (HF_HOME) already, or "
                "be a local folder."
            ) from None
        check_text_column(f"data.name='{name}'", text_field, self.dataset.features, is_dataset_text)

    def describe(self) -> str:
        return f"{self.name} ({self.split}, {self.dataset.num_rows:,} rows)"

    def identity(self) -> list[dict]:
        """With the fingerprint `datasets` computes from its cache files: a changed dataset gets a
        store of its own."""
        from datasets.fingerprint import generate_fingerprint

        return [
            {
                "hf": self.name,
                "split": self.split,
                "text_field": self.text_field,
                "rows": self.dataset.num_rows,
                "fingerprint": generate_fingerprint(self.dataset),
            }
        ]

    def total_bytes(self) -> None:
        return None

    def documents(self) -> Iterator[tuple[str, bool]]:
        batches = self.dataset.select_columns([self.text_field]).iter(batch_size=ROWS)
        texts = itertools.chain.from_iterable(batch[self.text_field] for batch in batches)
        for row, text in enumerate(texts):
            if text is None:
                raise ConfigError(
                    f"data.name='{self.name}': row {row} has no '{self.text_field}' (null). "
                    "Filter such rows out, or choose another data.text_field."
                )
            yield text, True
