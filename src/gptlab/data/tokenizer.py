"""tiktoken encodings, optionally narrowed to a compact vocabulary (docs/data.md): model id i is
tiktoken id `vocab[i]`. Checkpoints store `vocab`, so they alone can encode and decode prompts."""

import contextlib
from unittest import mock

import numpy as np
import tiktoken
import tiktoken.load

from gptlab.errors import ConfigError


def check_encoding(name: str) -> None:
    """An unknown name fails at once, listing the known ones (not tiktoken's bare KeyError)."""
    known = tiktoken.list_encoding_names()
    if name not in known:
        raise ConfigError(
            f"data.encoding: '{name}' is not a tiktoken encoding. Choose one of: "
            f"{', '.join(known)}."
        )


def no_downloads():
    """While it lasts, tiktoken's fetch of a file its cache lacks fails at once."""
    return mock.patch.object(tiktoken.load, "read_file", side_effect=OSError("no downloads"))


def load_encoding(name: str, offline: bool = False) -> tiktoken.Encoding:
    """tiktoken's encoding, downloaded once into its cache unless `offline` (a checkpoint's)."""
    check_encoding(name)
    try:
        with no_downloads() if offline else contextlib.nullcontext():
            return tiktoken.get_encoding(name)
    except Exception as e:  # network errors come from requests, cache errors from tiktoken
        if offline:
            raise ConfigError(
                f"The checkpoint's tokenizer is the tiktoken encoding '{name}', whose files are "
                "not on this machine, and gptlab downloads nothing a checkpoint names. Fetch it "
                f'once yourself where there is a network (python -c "import tiktoken; '
                f"tiktoken.get_encoding('{name}')\", with TIKTOKEN_CACHE_DIR as here)."
            ) from None
        raise ConfigError(
            f"data.encoding: tiktoken could not load '{name}' ({e.__class__.__name__}: {e}). It "
            "downloads its files once and caches them; without a network, point "
            "TIKTOKEN_CACHE_DIR at a folder that holds the cached files."
        ) from e


def check_state(state) -> str | None:
    """What is wrong with a tokenizer's state read from a file (a checkpoint's, a token store's),
    or None: a tiktoken encoding already on this machine (nothing a file names is downloaded)
    and, for a compact vocabulary, a sorted list of its ids."""
    if not isinstance(state, dict) or set(state) != {"encoding", "vocab"}:
        return "no tokenizer settings"
    encoding, vocab = state["encoding"], state["vocab"]
    if encoding not in tiktoken.list_encoding_names():
        return f"an unknown tiktoken encoding {encoding!r}"
    size = load_encoding(encoding, offline=True).n_vocab
    if vocab is not None:
        ordered = isinstance(vocab, list) and all(type(i) is int for i in vocab)
        ordered = ordered and all(0 <= a < b for a, b in zip(vocab, vocab[1:], strict=False))
        if not ordered or not vocab or vocab[-1] >= size:
            return "a compact vocabulary that is not a sorted list of token ids"
    return None


def unseen_tokens_error(encoding, ids) -> ConfigError:
    """The error of text whose tiktoken `ids` a compact vocabulary has never seen."""
    pieces = sorted({encoding.decode([int(t)]) for t in ids})
    return ConfigError(
        f"The text holds {len(pieces)} token(s) the compact vocabulary has never seen "
        f"({', '.join(repr(p) for p in pieces[:10])}). Use text made of the corpus's "
        "tokens, or train with data.compact_vocab=false (the whole tiktoken vocabulary)."
    )


class Tokenizer:
    """Text <-> model ids. `vocab` is None for the full tiktoken vocabulary."""

    def __init__(self, encoding: str, vocab: list[int] | np.ndarray | None = None):
        self.encoding = load_encoding(encoding)
        self.vocab = None if vocab is None else np.asarray(vocab, dtype=np.int64)  # sorted

    @classmethod
    def fit(cls, encoding: str, token_ids: np.ndarray, compact: bool) -> "Tokenizer":
        """Build the tokenizer for a tokenized corpus: compact keeps the ids that occur."""
        return cls(encoding, np.unique(token_ids) if compact else None)

    @property
    def vocab_size(self) -> int:
        return self.encoding.max_token_value + 1 if self.vocab is None else len(self.vocab)

    def encode_tiktoken(self, text: str) -> np.ndarray:
        """Raw tiktoken ids; special-token text is treated as plain text."""
        return np.asarray(self.encoding.encode_ordinary(text), dtype=np.uint32)

    def encode(self, text: str) -> list[int]:
        ids = self.encode_tiktoken(text)
        if self.vocab is None:
            return ids.tolist()
        idx = np.searchsorted(self.vocab, ids)
        missing = self.vocab[np.minimum(idx, len(self.vocab) - 1)] != ids
        if missing.any():
            raise unseen_tokens_error(self.encoding, ids[missing])
        return idx.tolist()

    def encode_prompt(self, prompt) -> list[int]:
        """Model ids of a prompt; an empty prompt starts from a newline token."""
        text = "" if prompt is None else str(prompt)
        try:
            return self.encode(text or "\n")
        except ConfigError as e:
            raise ConfigError(f"prompt={text!r}: {e}") from None

    def decode(self, ids) -> str:
        ids = np.asarray(ids, dtype=np.int64)
        if self.vocab is not None:
            ids = self.vocab[ids]
        return self.encoding.decode(ids.tolist())

    def can_encode(self, text: str) -> bool:
        """Whether every token of `text` is in the vocabulary (else text samples skip it)."""
        try:
            self.encode(text)
        except ConfigError:
            return False
        return True

    def token_bytes(self) -> np.ndarray:
        """UTF-8 bytes of each model id's token (0 for unused ids and the end-of-text token): a loss
        in nats per token becomes bits per byte, comparable across tokenizers."""
        ids = range(self.vocab_size) if self.vocab is None else self.vocab.tolist()
        special = {self.encoding.encode_single_token(t) for t in self.encoding.special_tokens_set}
        lengths = np.zeros(len(ids), dtype=np.int64)
        for i, token in enumerate(ids):
            if token not in special:
                with contextlib.suppress(KeyError):  # an id tiktoken leaves unused
                    lengths[i] = len(self.encoding.decode_single_token_bytes(int(token)))
        return lengths

    def state_dict(self) -> dict:
        """Plain types only, so checkpoints load with torch.load(weights_only=True); Tokenizer(**it)
        is the tokenizer again."""
        vocab = None if self.vocab is None else self.vocab.tolist()
        return {"encoding": self.encoding.name, "vocab": vocab}
