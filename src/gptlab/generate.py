"""gptlab-generate: sample text from a checkpoint, streamed to the terminal token by token.

    gptlab-generate ckpt_path=outputs/<date>/<time> prompt="The salesperson" num_samples=3

The checkpoint alone rebuilds the model and its tokenizer. Samples go to stdout (with a
`--- sample i of n ---` line before each when there are several), logs to stderr. The
arguments are checked before torch is imported, so a bad one fails within a second.
"""

from __future__ import annotations

import codecs
import logging
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import hydra
from omegaconf import DictConfig

from gptlab.errors import ConfigError, check_whole_number, main_or_exit, run_or_exit

if TYPE_CHECKING:
    import torch

    from gptlab.data.tokenizer import Tokenizer
    from gptlab.module import GPTModule

log = logging.getLogger("gptlab.generate")
DEVICES = ("auto", "cpu", "cuda")


# ---------------------------------------------------------------- arguments
def check_args(cfg: DictConfig) -> None:
    """Every sampling argument, checked before any heavy work."""
    check_whole_number(cfg, "max_new_tokens", 1, "the number of tokens to generate")
    check_whole_number(cfg, "num_samples", 1, "the number of samples")
    check_whole_number(cfg, "seed", 0, "the random seed")
    temperature = cfg.temperature
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
        raise ConfigError(
            f"temperature={temperature!r}: it must be a number of 0 or more (0 is greedy: always the "
            "most likely token; 1 samples from the model's distribution as it is)."
        )
    if cfg.top_k is not None:
        check_whole_number(cfg, "top_k", 1, "sampling keeps the top_k most likely tokens (null keeps all)")
    check_device(cfg.device)


def check_device(device) -> None:
    if device not in DEVICES:
        raise ConfigError(f"device={device!r}: choose one of {', '.join(DEVICES)}.")


def resolve_device(device: str) -> str:
    """auto -> cuda when available, else cpu; cuda without a GPU is a ConfigError."""
    import torch

    check_device(device)
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda: torch sees no CUDA device here. Use device=cpu or device=auto.")
    return device


# ---------------------------------------------------------------- decoding and sampling
class StreamDecoder:
    """Model ids -> text, one token at a time. A character split over several tokens (an emoji,
    an accented letter) is held back until its last byte arrives, so every piece prints whole."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, ids: list[int]) -> str:
        tiktoken_ids = [int(i) for i in (ids if self.tokenizer.vocab is None else self.tokenizer.vocab[ids])]
        return self._utf8.decode(self.tokenizer.encoding.decode_bytes(tiktoken_ids))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


def stream_sample(module: GPTModule, prompt_ids: list[int], max_new_tokens: int, temperature: float,
                  top_k: int | None, generator: torch.Generator, write: Callable[[str], object]) -> str:
    """One sample, each piece passed to `write` as soon as it is decoded; returns the whole text."""
    import torch

    decoder = StreamDecoder(module.tokenizer)
    pieces = [decoder.push(prompt_ids)]
    write(pieces[0])
    ids = torch.tensor([prompt_ids], device=module.device)  # [1, len(prompt)]
    for next_ids in module.model.generate_stream(ids, max_new_tokens, temperature, top_k, generator):
        pieces.append(decoder.push(next_ids[0].tolist()))
        write(pieces[-1])
    pieces.append(decoder.flush())
    write(pieces[-1])
    return "".join(pieces)


def sample_texts(module: GPTModule, prompt: str, max_new_tokens: int = 100, temperature: float = 0.8,
                 top_k: int | None = 50, num_samples: int = 1, seed: int = 0,
                 write: Callable[[str], object] | None = None) -> list[str]:
    """`num_samples` continuations of `prompt`, drawn in turn from one generator seeded with `seed`."""
    import torch

    prompt_ids = module.tokenizer.encode_prompt(prompt)
    generator = torch.Generator(device=module.device).manual_seed(seed)
    texts = []
    for i in range(num_samples):
        if write is not None and num_samples > 1:
            write(f"--- sample {i + 1} of {num_samples} ---\n")
        texts.append(stream_sample(module, prompt_ids, max_new_tokens, temperature, top_k, generator,
                                   write or (lambda _: None)))
        if write is not None:
            write("\n")
    return texts


def write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


# ---------------------------------------------------------------- the tool
def generate(cfg: DictConfig) -> list[str]:
    check_args(cfg)
    from gptlab.checkpoints import find_checkpoint, load_module  # torch and Lightning: after the checks

    path = find_checkpoint(cfg.ckpt_path)
    device = resolve_device(cfg.device)
    module = load_module(path, map_location=device)
    module.tokenizer.encode_prompt(cfg.prompt)  # an unknown token fails before anything is printed
    log.info("Sampling from %s on %s", path, device)
    start = time.perf_counter()
    texts = sample_texts(module, cfg.prompt, cfg.max_new_tokens, float(cfg.temperature), cfg.top_k,
                         cfg.num_samples, cfg.seed, write=write_stdout)
    seconds = time.perf_counter() - start
    tokens = cfg.max_new_tokens * cfg.num_samples
    log.info("%d sample(s), %d new tokens in %.1f s (%.0f tokens/s)", cfg.num_samples, tokens, seconds,
             tokens / max(seconds, 1e-9))
    return texts


def run_job(cfg: DictConfig) -> None:
    """The Hydra task: bad input ends in one clear paragraph and exit code 2."""
    run_or_exit(generate, cfg, log)


@hydra.main(version_base="1.3", config_path="pkg://gptlab.conf", config_name="generate")
def hydra_main(cfg: DictConfig) -> None:
    run_job(cfg)


def main() -> None:
    """Console entry point `gptlab-generate`."""
    main_or_exit(hydra_main, "gptlab-generate")


if __name__ == "__main__":
    main()
