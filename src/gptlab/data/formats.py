"""The corpus's file formats, each checked before any long work (a text file's first block as
UTF-8, a JSONL file's first record, a Parquet file's schema) and read in blocks, never whole:
(text, new_document) pairs."""

import codecs
import gzip
import json
from collections.abc import Iterator
from pathlib import Path

from gptlab.errors import ConfigError

BLOCK = 1 << 20  # bytes read at a time from a text file


def format_of(path: Path) -> str:
    """text, jsonl or parquet, by the file's name (anything else is read as text)."""
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz")):
        return "jsonl"
    return "parquet" if name.endswith(".parquet") else "text"


def check_file(path: Path, field: str) -> None:
    """Before any long work: a Parquet file's schema, else what its reader gives first (a text
    file's first block, a JSONL file's first record)."""
    kind = format_of(path)
    try:
        if kind == "parquet":
            parquet_file(path, field)
            return
        first = next(READERS[kind](path, field), None)
    except (EOFError, gzip.BadGzipFile) as e:
        raise ConfigError(f"The corpus file '{path}' is not a readable gzip file ({e}).") from e
    except OSError as e:
        raise ConfigError(
            f"Cannot read the corpus file '{path}' ({e.strerror or e}). Check its permissions."
        ) from e
    if first is None:
        raise ConfigError(
            f"The JSONL file '{path}' holds no record. Remove it or give another path."
        )
    if not first[0].strip() and path.stat().st_size <= BLOCK:
        raise ConfigError(f"The corpus file '{path}' is empty. Point data.path at a text file.")


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
    check_text_column(f"The Parquet file '{path}'", field, parquet.schema_arrow)
    return parquet


def check_text_column(where: str, field: str, schema) -> None:
    """Column `field` of an Arrow `schema` holds text, else a ConfigError naming `where`."""
    import pyarrow as pa

    if field not in schema.names:
        raise ConfigError(
            f"{where} has no column '{field}' (its columns: {', '.join(schema.names)}). Set "
            "data.text_field to the column that holds the text."
        )
    kind = schema.field(field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise ConfigError(
            f"{where}: column '{field}' holds {kind}, not text. Set data.text_field to a "
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
    with (gzip.open if path.name.lower().endswith(".gz") else open)(path, "rb") as f:
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


READERS = {"text": text_blocks, "jsonl": jsonl_texts, "parquet": parquet_texts}
