"""A Hugging Face dataset as a corpus (data=hf): read through the `datasets` library, with its
own cache and its offline mode (HF_DATASETS_OFFLINE=1). One document per row of the split."""

import itertools
from collections.abc import Iterator

from gptlab.data.sources import check_text_column
from gptlab.errors import ConfigError

ROWS = 1024  # rows converted to Python strings at a time


def is_text(feature) -> bool:
    return getattr(feature, "dtype", None) in ("string", "large_string")


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
        check_text_column(f"data.name='{name}'", text_field, self.dataset.features, is_text)

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
