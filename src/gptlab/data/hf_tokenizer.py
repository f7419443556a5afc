"""A tiktoken encoding as a `transformers` tokenizer with the same ids (docs/export.md): its
byte-level BPE rebuilt by transformers' own TikTokenConverter from tiktoken's ranks."""

import functools
import re

from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter, bytes_to_unicode

from gptlab.data.tokenizer import load_encoding, no_downloads

END_OF_TEXT = "<|endoftext|>"
INTERVAL = r"\{\d+(?:,\d*)?\}"  # {m,n}
ATOM = r"\\p\{\w+\}|\\.|\[(?:\\.|[^\]\\])*\]|[^\\()|]"  # \p{..}, an escape, a [..] set, a character


@functools.lru_cache(maxsize=2)
def encoding_spec(name: str) -> dict:
    """tiktoken's own description of an encoding (its plugin interface): pattern, ranks, specials;
    from its cache only."""
    from tiktoken_ext.openai_public import ENCODING_CONSTRUCTORS

    load_encoding(name, offline=True)  # a missing cache: gptlab's one paragraph
    with no_downloads():
        return ENCODING_CONSTRUCTORS[name]()


def oniguruma(pattern: str) -> str:
    """tiktoken's pattern as the tokenizers library's engine, Oniguruma, reads it alike: it takes
    `?+`, `*+` and `++` as possessive, as tiktoken's fancy-regex does, but `X{1,3}+` as `X{1,3}`
    repeated (so "2024" was one piece, not "202", "4"); an atomic group `(?>X{1,3})` is the
    possessive interval in both engines."""
    atomic = re.sub(rf"({ATOM})({INTERVAL})\+", r"(?>\1\2)", pattern)
    if re.search(INTERVAL + r"\+", atomic):  # an interval on a group: not an atom this rewrites
        raise ValueError(f"a possessive interval Oniguruma would misread: {pattern}")
    return atomic


class RanksConverter(TikTokenConverter):
    """TikTokenConverter reading the ranks (and the special tokens, at their ids) given to it."""

    def __init__(self, spec: dict):
        specials = spec["special_tokens"]
        super().__init__(pattern=oniguruma(spec["pat_str"]), extra_special_tokens=list(specials))
        self.ranks = {**spec["mergeable_ranks"], **{t.encode(): i for t, i in specials.items()}}

    def load_tiktoken_bpe(self, tiktoken_url: str) -> dict[bytes, int]:
        return self.ranks


@functools.lru_cache(maxsize=2)
def converted(name: str):
    """The tokenizers.Tokenizer of `name` (seconds to build: once per process)."""
    return RanksConverter(encoding_spec(name)).converted()


def to_transformers(name: str, context_length: int) -> PreTrainedTokenizerFast:
    """tiktoken's `name` as a fast tokenizer of a model reading `context_length` tokens; its
    end-of-text token, if any, as bos, eos and pad (GPT-2's), padding on the left (a decoder's).
    Text is encoded as gptlab encodes it (tiktoken's encode_ordinary): a special token's string
    in it is plain text (`split_special_tokens`, saved in tokenizer_config.json); the special
    ids still decode to their strings."""
    end = END_OF_TEXT if END_OF_TEXT in encoding_spec(name)["special_tokens"] else None
    tokens = dict(bos_token=end, eos_token=end, pad_token=end, padding_side="left")
    return PreTrainedTokenizerFast(
        tokenizer_object=converted(name),
        model_max_length=context_length,
        split_special_tokens=True,
        **tokens,
    )


def vocab_of(name: str) -> dict[str, int]:
    """The encoding's vocabulary as a byte-level BPE names its tokens (a tokenizer.json's)."""
    spec = encoding_spec(name)
    byte_encoder = bytes_to_unicode()
    vocab = {
        "".join(byte_encoder[b] for b in token): i for token, i in spec["mergeable_ranks"].items()
    }
    return {**vocab, **spec["special_tokens"]}
