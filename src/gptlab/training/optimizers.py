"""`optim=muon`: Muon for the blocks' matrices and AdamW for everything else, held as one
optimizer so that Lightning trains it like AdamW alone (two would each count in global_step,
Lightning issue #17958: docs/model.md)."""

import math

import torch


class Muon(torch.optim.Muon):
    """torch's Muon (its arguments, checks, groups and state) whose Newton-Schulz iteration runs
    in float32 on CPU: torch's casts to bfloat16, 10-40x slower than float32 on a CPU without
    bf16 instructions (docs/model.md). On CUDA it runs in bfloat16, as torch's does."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - momentum)
                update = p.grad.lerp(buf, momentum) if group["nesterov"] else buf
                dtype = torch.bfloat16 if p.is_cuda else torch.float32  # torch's on CUDA
                update = orthogonalise(
                    update, group["ns_coefficients"], group["ns_steps"], group["eps"], dtype
                )
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(update.to(p.dtype), alpha=-lr * shape_factor(p.shape, group["adjust_lr_fn"]))
        return loss


def orthogonalise(
    grad: torch.Tensor, coefficients, steps: int, eps: float, dtype: torch.dtype
) -> torch.Tensor:
    """Keller Jordan's quintic Newton-Schulz iteration: grad with its singular values pushed
    towards 1 (about 0.5 to 1.5), as torch's Muon computes it, in `dtype`."""
    a, b, c = coefficients
    x = grad.to(dtype)
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T  # (rows, cols) -> (cols, rows): the Gram matrix below is the smaller one
    x = x / x.norm().clamp(min=eps)  # spectral norm at most 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def shape_factor(shape: torch.Size, adjust_lr_fn: str | None) -> float:
    """Muon's lr by matrix shape, as torch's: `original` (Keller Jordan's sqrt(max(1, rows/cols)))
    or `match_rms_adamw` (Moonshot's 0.2 sqrt(max(rows, cols)), to reuse AdamW's rate)."""
    rows, cols = shape[:2]
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return math.sqrt(max(1, rows / cols))


class MuonWithAdamW(torch.optim.Optimizer):
    """Muon and AdamW stepped as one; its param_groups are theirs, so the schedule reaches both."""

    def __init__(self, muon: torch.optim.Muon, adamw: torch.optim.AdamW):
        self.muon = muon
        self.adamw = adamw
        super().__init__(muon.param_groups + adamw.param_groups, defaults={})

    def step(self, closure=None):
        """Lightning's closure (the loss and the gradients) runs in Muon's step; then AdamW's."""
        loss = self.muon.step(closure)
        self.adamw.step()
        return loss

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        """Loading gives each optimizer new group dicts: share them again."""
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])
        self.param_groups = self.muon.param_groups + self.adamw.param_groups
