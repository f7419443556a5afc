"""The corpus's file formats, each checked before any long work (a text file's first bytes as
UTF-8, a JSONL file's first record, a Parquet file's schema) and read in blocks, never whole:
(text, new_document) pairs."""

import codecs
import gzip
import json
from collections.abc import Iterator
from pathlib import Path

from gptlab.errors import ConfigError

BLOCK = 1 << 20  # bytes read at a time from a text file
HEAD = 1 << 16  # bytes of each text file checked before any long work


def format_of(path: Path) -> str:
    """text, jsonl or parquet, by the file's name (anything else is read as text)."""
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz")):
        return "jsonl"
    return "parquet" if name.endswith(".parquet") else "text"


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
