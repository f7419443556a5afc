"""The one model a file's or a run's settings ask for, built once: on torch's meta device first
(nothing allocated) and bounded there (its weights' names and shapes, its tables, memory), then
given memory in place (GPT.materialise): the file's weights copied in, or for a new run the very
numbers GPT(config) draws."""

import torch

from gptlab.errors import ConfigError
from gptlab.model.config import GPTConfig
from gptlab.model.gpt import GPT
from gptlab.process import available_memory

TABLE_SLACK = 256 << 20  # bytes of tables a file's model may hold beyond the weights it carries


def build_gpt(config: GPTConfig, weights: dict, where: str, batch_size: int = 1) -> GPT:
    """The GPT `config` asks for, GPT.__init__ run once: `weights` (a state dict of its own,
    under `model.`; {}: a new model's draws) fit its names and shapes; what settings alone size
    (tables, a mask) stays within TABLE_SLACK of those weights; the whole, with one forward pass
    of `batch_size` windows, within the memory available. `where` names the file in an error."""
    with torch.device("meta"):
        model = GPT(config)
    check_names(model, weights, where)
    tables = sum(b.numel() * b.element_size() for b in model.buffers())
    storages = {t.untyped_storage().data_ptr(): t for t in weights.values()}
    carried = sum(t.untyped_storage().nbytes() for t in storages.values())
    if weights and tables > carried + TABLE_SLACK:
        raise ConfigError(
            f"{where}: model.context_length={config.context_length} asks for "
            f"{tables / 2**20:,.0f} MiB of tables beside far smaller weights."
        )
    c = config  # its tensors, and one forward pass of `batch_size` windows (activations)
    needed = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    needed += 4 * batch_size * c.context_length * (c.vocab_size + 16 * c.d_model * c.num_blocks)
    if c.attention == "manual":
        needed += 4 * batch_size * c.num_heads * c.context_length**2 * c.num_blocks
    available = available_memory()
    if available is not None and needed > available:
        raise ConfigError(
            f"{where}: the model needs about {needed / 2**30:,.1f} GiB (batch {batch_size}), "
            f"more than the {available / 2**30:,.1f} GiB this machine has available. Make it "
            "smaller (model.d_model, model.num_blocks, data.context_length, data.batch_size)."
        )
    return model.materialise(weights)


def check_names(model: GPT, weights: dict, where: str) -> None:
    """`weights` name each of the model's tensors, each of its shape, and nothing else."""
    if not weights:
        return
    wanted = {k: list(t.shape) for k, t in model.state_dict().items()}
    given = {k.removeprefix("model."): list(t.shape) for k, t in weights.items()}
    reasons = [f"{k} is missing" for k in wanted if k not in given]
    reasons += [f"{k} is not the model's" for k in given if k not in wanted]
    reasons += [
        f"{k} has shape {given[k]}, the model's is {wanted[k]}"
        for k in wanted
        if k in given and given[k] != wanted[k]
    ]
    if reasons:
        more = f" (and {len(reasons) - 3} more)" if len(reasons) > 3 else ""
        raise ConfigError(
            f"{where} does not hold this model's weights: {'; '.join(reasons[:3])}{more}."
        )
