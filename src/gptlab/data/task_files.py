"""A task's files from someone else (docs/downstream.md), read bounded as gptlab.reader reads a
run's: an Arrow stream (a `datasets` save_to_disk shard) and a gzip of JSON lines (OLMo's
rendered requests), each within bytes, rows and nesting before anything is built from it."""

import os
from pathlib import Path

from gptlab import reader

MAX_TABLE = 256 << 20  # a task's Arrow file (HellaSwag's validation split: 11 MB)
MAX_ROWS = 1 << 20  # a task's items (HellaSwag's: 10,042)
MAX_TYPE_DEPTH = 4  # a task's columns: strings, lists of them, a struct of such lists
MAX_JSONL = 64 << 20  # a task's decompressed requests.jsonl.gz (LAMBADA's: 8 MB)


def type_depth(arrow_type) -> int:
    """How deeply an Arrow type nests (lists, structs): a schema is walked before any data."""
    deepest, todo = 0, [(arrow_type, 1)]
    while todo:
        node, level = todo.pop()
        deepest = max(deepest, level)
        todo += [(node.field(i).type, level + 1) for i in range(node.num_fields)]
    return deepest


def read_arrow(path: str | Path, rows: int = MAX_ROWS, limit: int = MAX_TABLE):
    """An Arrow IPC stream file (a `datasets` save_to_disk shard) as a pyarrow Table, bounded:
    a regular file of at most `limit` bytes, its schema at most MAX_TYPE_DEPTH deep, read batch by
    batch up to `rows` rows, each batch's offsets validated against its buffers (a crafted offset
    reads nothing outside them). ValueError says what is wrong."""
    import pyarrow as pa

    with reader.open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise ValueError(f"it holds {size:,} bytes (at most {limit:,} are read)")
        try:
            stream = pa.ipc.open_stream(pa.BufferReader(f.read(limit)))
            deepest = max((type_depth(field.type) for field in stream.schema), default=0)
            if deepest > MAX_TYPE_DEPTH:
                raise ValueError(f"its columns nest {deepest} deep (at most {MAX_TYPE_DEPTH})")
            batches, count = [], 0
            for batch in stream:
                count += batch.num_rows
                if count > rows:
                    raise ValueError(f"it holds more than {rows:,} rows")
                batch.validate(full=True)
                batches.append(batch)
        except pa.ArrowException as e:
            raise ValueError(f"it is not an Arrow stream ({reader.first_line(e)})") from None
    return pa.Table.from_batches(batches, schema=stream.schema)


def read_jsonl_gz(path: str | Path, lines: int = MAX_ROWS, limit: int = MAX_JSONL) -> list:
    """A gzip of JSON lines (OLMo's requests.jsonl.gz) as a list, bounded: at most `limit`
    bytes once decompressed (a gzip bomb stops there), `lines` lines, each line at most
    reader.MAX_NODES values and reader.MAX_DEPTH deep. ValueError says what is wrong."""
    import gzip

    with reader.open_regular(path) as f, gzip.GzipFile(fileobj=f) as unzipped:
        try:
            raw = unzipped.read(limit + 1)
        except (OSError, EOFError) as e:
            raise ValueError(f"it is not a whole gzip file ({e})") from None
    if len(raw) > limit:
        raise ValueError(f"it holds more than {limit:,} bytes decompressed")
    rows = raw.splitlines()
    if len(rows) > lines:
        raise ValueError(f"it holds more than {lines:,} lines")
    parsed = []
    for number, row in enumerate(rows, 1):
        try:
            data = reader.parse_json(row)
        except ValueError as e:
            raise ValueError(f"its line {number} is not JSON ({e})") from None
        if reader.depth(data) > reader.MAX_DEPTH:
            raise ValueError(f"its line {number} nests more than {reader.MAX_DEPTH} deep")
        parsed.append(data)
    return parsed
