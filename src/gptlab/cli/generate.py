"""gptlab-generate: sample text from a checkpoint, streamed to stdout token by token (logs: stderr).
gptlab-generate ckpt_path=outputs/<date>/<time> prompt="The salesperson" num_samples=3"""

import codecs
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from itertools import chain

import hydra
from omegaconf import DictConfig

from gptlab.cli.app import resolve_device, run_hydra_app, run_task
from gptlab.config.resolvers import register
from gptlab.errors import ConfigError, check_whole_number

log = logging.getLogger("gptlab.generate")
register()  # the resolver of the folder a start saves its config in


def decode_stream(tokenizer, chunks: Iterable[list[int]]) -> Iterator[str]:
    """Model ids -> text, chunk by chunk. A character split over several tokens (an emoji, an
    accented letter) is held back until its last byte arrives, so every piece prints whole."""
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for ids in chunks:
        tiktoken_ids = ids if tokenizer.vocab is None else tokenizer.vocab[ids].tolist()
        yield utf8.decode(tokenizer.encoding.decode_bytes(tiktoken_ids))
    yield utf8.decode(b"", final=True)


def sample_texts(
    model,
    tokenizer,
    prompt: str,
    max_new_tokens: int = 100,
    temperature: float = 0.8,
    top_k: int | None = 50,
    num_samples: int = 1,
    seed: int = 0,
    write: Callable[[str], object] = lambda piece: None,
    use_cache: bool = True,
) -> list[str]:
    """`num_samples` continuations of `prompt` from one generator seeded with `seed`;
    use_cache: with a KV cache (the same text, faster)."""
    import torch

    prompt_ids = tokenizer.encode_prompt(prompt)  # an unknown token fails before any output
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    texts = [""] * num_samples
    for i in range(num_samples):
        if num_samples > 1:
            write(f"--- sample {i + 1} of {num_samples} ---\n")
        ids = torch.tensor([prompt_ids], device=device)  # [1, len(prompt)]
        args = (max_new_tokens, temperature, top_k, generator, use_cache)
        new = model.generate_stream(ids, *args)  # [1, 1] each
        for piece in decode_stream(tokenizer, chain([prompt_ids], (t[0].tolist() for t in new))):
            write(piece)
            texts[i] += piece
        write("\n")
    return texts


def generate(cfg: DictConfig) -> list[str]:
    """Check every argument, then load the checkpoint and stream its samples to stdout."""
    check_whole_number(cfg, "max_new_tokens", 1, "the number of tokens to generate")
    check_whole_number(cfg, "num_samples", 1, "the number of samples")
    check_whole_number(cfg, "seed", 0, "the random seed")
    if cfg.top_k is not None:
        check_whole_number(
            cfg, "top_k", 1, "sampling keeps the top_k most likely tokens (null keeps all)"
        )
    if type(cfg.temperature) not in (int, float) or cfg.temperature < 0:  # a bool is not one
        raise ConfigError(
            f"temperature={cfg.temperature!r}: it must be a number of 0 or more (0 is greedy: "
            "always the most likely token; 1 samples from the model's distribution as it is)."
        )
    if not isinstance(cfg.kv_cache, bool):
        raise ConfigError(
            f"kv_cache={cfg.kv_cache!r}: it must be true (keep each token's keys and values: "
            "faster) or false (run the whole window for every new token)."
        )
    device = resolve_device(cfg.device)
    from gptlab.run.checkpoints import find_checkpoint, load_model  # torch: after the checks

    path = find_checkpoint(cfg.ckpt_path)
    model, tokenizer, _ = load_model(path, map_location=device)
    start = time.perf_counter()
    write = partial(print, end="", flush=True)  # each piece as it comes
    args = (cfg.max_new_tokens, float(cfg.temperature), cfg.top_k, cfg.num_samples, cfg.seed)
    texts = sample_texts(model, tokenizer, cfg.prompt, *args, write=write, use_cache=cfg.kv_cache)
    seconds = time.perf_counter() - start
    tokens = cfg.max_new_tokens * cfg.num_samples
    log.info(
        "%d sample(s) from %s on %s, KV cache %s: %d new tokens in %.1f s (%.0f tokens/s)",
        cfg.num_samples,
        path,
        device,
        "on" if cfg.kv_cache else "off",
        tokens,
        seconds,
        tokens / max(seconds, 1e-9),
    )
    return texts


@hydra.main(version_base="1.3", config_path="pkg://gptlab.conf", config_name="generate")
def run_job(cfg: DictConfig) -> None:  # tests pass it a composed cfg
    run_task(generate, cfg, log)


def main() -> None:  # the console script gptlab-generate
    run_hydra_app(run_job, "gptlab-generate")


if __name__ == "__main__":
    main()
