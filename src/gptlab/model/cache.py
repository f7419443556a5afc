"""A KV cache: one block's keys and values of the tokens generated so far, so that each new token
is run through the model alone instead of the whole window again (nanoGPT PR#76, nanochat's
engine). One per block; GPT.generate_stream makes them and refills them when the window slides."""

import torch


class KVCache:
    """Rows [0, length) of two buffers [batch, num_heads, context_length, head_size]."""

    def __init__(self, context_length: int):
        self.context_length = context_length
        self.keys: torch.Tensor | None = None  # made on the first append: the prompt's batch
        self.values: torch.Tensor | None = None
        self.length = 0  # tokens held: the position of the next one

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new tokens' k, v [batch, num_heads, T, head_size]; return every token's
        keys and values so far, [batch, num_heads, length + T, head_size] each."""
        if self.keys is None:
            batch, num_heads, _, head_size = k.shape
            self.keys = k.new_empty(batch, num_heads, self.context_length, head_size)
            self.values = v.new_empty(batch, num_heads, self.context_length, head_size)
        start, self.length = self.length, self.length + k.shape[2]
        self.keys[:, :, start : self.length] = k
        self.values[:, :, start : self.length] = v
        return self.keys[:, :, : self.length], self.values[:, :, : self.length]
