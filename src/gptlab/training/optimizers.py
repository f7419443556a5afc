"""`optim=muon`: torch's Muon for the blocks' matrices and AdamW for everything else, held as one
optimizer so that Lightning trains it like AdamW alone (two would each count in global_step,
Lightning issue #17958: docs/model.md)."""

import torch


class MuonWithAdamW(torch.optim.Optimizer):
    """Muon and AdamW stepped as one; its param_groups are theirs, so the schedule reaches both."""

    def __init__(self, muon: torch.optim.Muon, adamw: torch.optim.AdamW):
        self.muon = muon
        self.adamw = adamw
        super().__init__(muon.param_groups + adamw.param_groups, defaults={})

    @torch.no_grad()
    def step(self, closure=None):
        """Lightning's closure computes the loss and the gradients; then both step."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adamw.step()
        return loss

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        """Loading gives each optimizer new group dicts: share them again."""
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])
        self.param_groups = self.muon.param_groups + self.adamw.param_groups
