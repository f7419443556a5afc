"""What a model may ask of this machine's memory, checked on torch's meta device before it is
built (a run's settings, or a file's: docs/security.md)."""

from gptlab import reader
from gptlab.errors import ConfigError


def available_memory() -> int | None:
    """Bytes of memory this machine can still give (Linux's MemAvailable), None where unknown."""
    for line in (reader.read_bytes("/proc/meminfo") or b"").decode().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def memory_needed(model, batch_size: int = 1) -> int:
    """An estimate of a GPT's bytes (on the meta device): weights, tables, one forward pass."""
    c = model.config
    tensors = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    activations = batch_size * c.context_length * (c.vocab_size + 16 * c.d_model * c.num_blocks)
    if c.attention == "manual":
        activations += batch_size * c.num_heads * c.context_length**2 * c.num_blocks
    return tensors + 4 * activations


def check_memory(model, batch_size: int, where: str) -> None:
    needed, available = memory_needed(model, batch_size), available_memory()
    if available is not None and needed > available:
        c = model.config
        raise ConfigError(
            f"{where}: the model needs about {needed / 2**30:,.1f} GiB (d_model {c.d_model}, "
            f"{c.num_blocks} blocks, context_length {c.context_length}, vocabulary "
            f"{c.vocab_size:,}, batch {batch_size}), more than the {available / 2**30:,.1f} GiB "
            "this machine has available. Make it smaller (model.d_model, model.num_blocks, "
            "data.context_length, data.batch_size) or run it on a larger machine."
        )
