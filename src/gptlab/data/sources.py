"""Where the text comes from: a text file, a folder, a glob, JSONL or Parquet files, or a Hugging
Face dataset. A corpus yields (text, new_document) pairs, read in blocks, never whole. Every source
is checked when found (a file's first bytes, first record, schema; a dataset's column), so bad input
fails before any hashing."""

import codecs
import glob
import gzip
import itertools
import json
from collections.abc import Iterator
from pathlib import Path

from gptlab.data.corpus import resolve_corpus
from gptlab.errors import ConfigError
from gptlab.files import sha256_of

BLOCK = 1 << 20  # bytes read at a time from a text file
HEAD = 1 << 16  # bytes of each text file checked before any long work
FOLDER_SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".parquet")  # what a folder contributes
ROWS = 1024  # rows of a dataset converted to Python strings at a time


def format_of(path: Path) -> str:
    """text, jsonl or parquet, by the file's name (anything else is read as text)."""
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz")):
        return "jsonl"
    return "parquet" if name.endswith(".parquet") else "text"


def is_many(path: str | None) -> bool:
    """A folder or a glob (many files), not a single file."""
    return bool(path) and (glob.has_magic(path) or Path(path).expanduser().is_dir())


def find_corpus(settings: dict) -> "Files | HFDataset":
    """A Hugging Face dataset (data.name), else data.path's files or data.url's download."""
    if settings["name"]:
        return HFDataset(settings["name"], settings["split"], settings["text_field"])
    path = settings["path"]
    if is_many(path):
        if settings["sha256"]:
            raise ConfigError(
                f"data.sha256 checks a single file, and data.path='{path}' names many. Set "
                "data.sha256=null."
            )
        return Files(find_files(path), settings["text_field"])
    single = resolve_corpus(settings["url"], path, settings["sha256"], settings["data_dir"])
    return Files([single], settings["text_field"], settings["sha256"])


def find_files(path: str) -> list[Path]:
    """The files of a folder or a glob, sorted."""
    where = Path(path).expanduser()
    if glob.has_magic(path):
        found = sorted(Path(p) for p in glob.glob(str(where), recursive=True) if Path(p).is_file())
        what = f"data.path='{path}': the glob matches no file"
    else:
        found = sorted(p for p in where.iterdir() if p.is_file() and is_corpus_file(p))
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


def is_corpus_file(path: Path) -> bool:
    return not path.name.startswith(".") and path.name.lower().endswith(FOLDER_SUFFIXES)


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


# ------------------------------------------------------------------ checks before any long work
def check_file(path: Path, text_field: str) -> None:
    checks = {"text": check_text, "jsonl": check_jsonl, "parquet": parquet_file}
    try:
        checks[format_of(path)](path, text_field)
    except OSError as e:
        raise ConfigError(
            f"Cannot read the corpus file '{path}' ({e.strerror or e}). Check its permissions."
        ) from e


def check_text(path: Path, _field: str) -> None:
    with open(path, "rb") as f:
        head = f.read(HEAD)
    if not head.strip() and path.stat().st_size <= HEAD:
        raise ConfigError(f"The corpus file '{path}' is empty. Point data.path at a text file.")
    check_block(path, head, 0, codecs.getincrementaldecoder("utf-8")(), final=False)


def check_block(path: Path, raw: bytes, offset: int, decoder, final: bool) -> str:
    """`raw` decoded, or a ConfigError naming the file and the offset of what is wrong."""
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise ConfigError(
            f"The corpus file '{path}' looks binary (it holds NUL bytes, the first at offset "
            f"{offset + nul}); use a UTF-8 text file."
        )
    try:
        return decoder.decode(raw, final)
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"The corpus file '{path}' is not UTF-8 text (bad byte at offset {offset + e.start}). "
            "Convert it to UTF-8, e.g. `iconv -t UTF-8`."
        ) from None


def open_jsonl(path: Path):
    return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")


def check_jsonl(path: Path, field: str) -> None:
    """Its first record."""
    try:
        first = next(jsonl_texts(path, field), None)
    except (EOFError, gzip.BadGzipFile) as e:
        raise ConfigError(f"The corpus file '{path}' is not a readable gzip file ({e}).") from e
    if first is None:
        raise ConfigError(
            f"The JSONL file '{path}' holds no record. Remove it or give another path."
        )


def record_text(path: Path, number: int, line: bytes, field: str) -> str:
    """The text of one JSONL record, or a ConfigError naming the file, line and field."""
    try:
        record = json.loads(line)
    except ValueError as e:
        raise ConfigError(
            f"The JSONL file '{path}', line {number}, is not JSON ({e}). Each line must be one "
            "JSON object."
        ) from None
    text = record.get(field) if isinstance(record, dict) else None
    if not isinstance(text, str):
        keys = ", ".join(record) if isinstance(record, dict) else type(record).__name__
        raise ConfigError(
            f"The JSONL file '{path}', line {number}, has no text field '{field}' (it holds: "
            f"{keys}). Set data.text_field to the field that holds the text."
        )
    return text


def parquet_file(path: Path, field: str):
    """The opened Parquet file, its column `field` checked to hold strings."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise ConfigError(f"The Parquet file '{path}' cannot be read ({e}).") from None
    kinds = {column.name: column.type for column in parquet.schema_arrow}
    check_text_column(f"The Parquet file '{path}'", field, kinds, is_arrow_text)
    return parquet


def is_arrow_text(kind) -> bool:
    import pyarrow as pa

    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def is_dataset_text(feature) -> bool:
    return getattr(feature, "dtype", None) in ("string", "large_string")


def check_text_column(where: str, field: str, kinds: dict, is_text) -> None:
    """Column `field` (`kinds`: each one's type) holds text, else a ConfigError naming `where`."""
    if field not in kinds:
        raise ConfigError(
            f"{where} has no column '{field}' (its columns: {', '.join(kinds)}). Set "
            "data.text_field to the column that holds the text."
        )
    if not is_text(kinds[field]):
        raise ConfigError(
            f"{where}: column '{field}' holds {kinds[field]}, not text. Set data.text_field to a "
            "string column."
        )


# ------------------------------------------------------------------ readers
def text_blocks(path: Path, _field: str) -> Iterator[tuple[str, bool]]:
    """One document, decoded as it is read (no newline translation, like bytes.decode)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(path, "rb") as f:
        while raw := f.read(BLOCK):
            yield check_block(path, raw, offset, decoder, final=False), offset == 0
            offset += len(raw)
    yield check_block(path, b"", offset, decoder, final=True), offset == 0


def jsonl_texts(path: Path, field: str) -> Iterator[tuple[str, bool]]:
    """One document per record."""
    with open_jsonl(path) as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                yield record_text(path, number, line, field), True


def parquet_texts(path: Path, field: str) -> Iterator[tuple[str, bool]]:
    """One document per row, a row group at a time."""
    parquet = parquet_file(path, field)
    for group in range(parquet.num_row_groups):
        column = parquet.read_row_group(group, columns=[field]).column(field)
        for row, text in enumerate(column.to_pylist()):
            if text is None:
                raise ConfigError(
                    f"The Parquet file '{path}': row {row} of row group {group} has no "
                    f"'{field}' (null). Drop such rows, or choose another data.text_field."
                )
            yield text, True
