"""LightningModule: the GPT, its exact cross-entropy, AdamW (or Muon) and the schedule. Its
hyperparameters are plain dicts: a checkpoint alone describes its GPT, read with `weights_only=True`
(gptlab.run.checkpoints.load_model builds it, bounded)."""

import math
from dataclasses import asdict
from functools import cached_property

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.plugins import MixedPrecision

from gptlab.data.tokenizer import Tokenizer
from gptlab.model import mup
from gptlab.model.config import GPTConfig
from gptlab.model.gpt import GPT
from gptlab.training.optim_config import OptimConfig, lr_factor
from gptlab.training.optimizers import Muon, MuonWithAdamW


class GPTModule(L.LightningModule):
    def __init__(self, model: GPT, optim: dict, tokenizer: dict):
        """`model` built already (gptlab.model.meta.build_gpt: a file's weights in it, or a new
        run's draws), as lightning-hydra-template passes its net; its settings are saved as the
        hyperparameters, beside the optimiser's and the tokenizer's."""
        super().__init__()
        hparams = {"model": asdict(model.config), "optim": optim, "tokenizer": tokenizer}
        # logger=False: the tokenizer's id list does not belong in TensorBoard's HPARAMS table
        self.save_hyperparameters(hparams, logger=False)
        self.config = model.config
        self.optim = OptimConfig(**optim)
        self.tokenizer_state = tokenizer
        self.model = model
        # torch.compile's wrapper stays outside the module tree: checkpoints keep `model.` keys
        compiled = torch.compile(self.model) if self.config.compile else self.model
        object.__setattr__(self, "_train_model", compiled)
        self._token_bytes: torch.Tensor | None = None  # [vocab_size]: UTF-8 bytes of each token
        self.best_val_loss = math.inf
        self.best_val_metrics: dict[str, float] = {}  # a validation's values at the best val/loss

    def setup(self, stage: str) -> None:
        """One batch as the example input: Lightning's summary shows its shapes."""
        batch_size = self.trainer.datamodule.batch_size if self.trainer.datamodule else 1
        self.example_input_array = torch.zeros(
            batch_size, self.config.context_length, dtype=torch.long
        )

    @cached_property
    def tokenizer(self) -> Tokenizer:
        return Tokenizer(**self.tokenizer_state)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids)

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch  # [batch, context_length] each
        logits = self._train_model(x)  # [batch, context_length, vocab_size]
        return F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def on_validation_epoch_start(self) -> None:
        self.start_sums(len(self.mixture()[0] or [None]))

    def validation_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.add_to_sums(batch, dataloader_idx)  # a mixture: one val loader per source

    def on_validation_epoch_end(self) -> None:
        metrics = split_metrics("val", self.summed(), *self.mixture())
        val_loss = metrics["val/loss"]
        self.log("val/loss", val_loss, prog_bar=True)
        self.log("val/perplexity", val_loss.exp())
        for name, value in metrics.items():  # at epoch end: no /dataloader_idx_N appended
            if name != "val/loss":
                self.log(name, value, add_dataloader_idx=False)
        if not self.trainer.sanity_checking and self.trainer.state.fn == "fit":
            if float(val_loss) < self.best_val_loss:  # as best.ckpt: strictly lower replaces it
                self.best_val_loss = float(val_loss)
                self.best_val_metrics = {name: float(value) for name, value in metrics.items()}
        # for the run's metrics, also where the module is a copy (ddp_spawn): not for the loggers
        self.log("val/best_loss", self.best_val_loss, logger=False)
        for name, value in self.best_val_metrics.items():  # a mixture's values at the best
            if name.count("/") == 2:  # val/<source or average>/<loss or bpb>
                self.log(f"best/{name}", value, logger=False)

    # the held-out test split, scored exactly as validation scores the val split
    on_test_epoch_start = on_validation_epoch_start
    test_step = validation_step

    def on_test_epoch_end(self) -> None:
        # for metrics.json only: the loggers have ended their runs by then (W&B's is finished)
        for name, value in split_metrics("test", self.summed(), *self.mixture()).items():
            self.log(name, value, logger=False, add_dataloader_idx=False)

    def mixture(self) -> tuple[list[str] | None, str]:
        """The data's sources (None: one source) and the average val/loss follows."""
        datamodule = self.trainer.datamodule
        if datamodule is None or datamodule.source_names is None:
            return None, "micro"
        return datamodule.source_names, datamodule.settings.val_average

    def start_sums(self, sources: int = 1) -> None:
        if self._token_bytes is None:
            self._token_bytes = torch.as_tensor(self.tokenizer.token_bytes())
        self._token_bytes = self._token_bytes.to(self.device)
        # [source, 3]: nats summed over tokens, tokens, UTF-8 bytes of the targets
        self._sums = torch.zeros(sources, 3, device=self.device, dtype=torch.float64)

    def add_to_sums(self, batch: tuple[torch.Tensor, torch.Tensor], source: int = 0) -> None:
        targets = batch[1]  # [batch, context_length]
        sums = self._sums[source]
        sums[0] += self.loss(batch).double() * targets.numel()
        sums[1] += targets.numel()
        sums[2] += self._token_bytes[targets].sum()

    def summed(self, across_ranks: bool = True) -> torch.Tensor:
        """The exact sums of each source, [source, 3], summed across ranks first."""
        if across_ranks:
            return self.trainer.strategy.reduce(self._sums, reduce_op="sum")
        return self._sums

    @torch.no_grad()
    def score(
        self, loaders: list, names: list[str] | None = None, average: str = "micro", split="test"
    ) -> dict[str, float]:
        """The exact loss and bpb over each of `loaders` (a source's batches, named by `names`),
        in eval mode, in this process alone: split_metrics' values."""
        self.eval()
        self.start_sums(len(loaders))
        for source, batches in enumerate(loaders):
            for x, y in batches:
                self.add_to_sums((x.to(self.device), y.to(self.device)), source)
        metrics = split_metrics(split, self.summed(across_ranks=False), names, average)
        return {name: float(value) for name, value in metrics.items()}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["best_val_loss"] = self.best_val_loss
        checkpoint["best_val_metrics"] = self.best_val_metrics

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.best_val_loss = checkpoint.get("best_val_loss", math.inf)
        self.best_val_metrics = checkpoint.get("best_val_metrics", {})  # an older gptlab's: none

    def build_optimizer(self, mixed_precision: bool = False) -> torch.optim.Optimizer:
        """AdamW, weight decay on matrices only, fused (about 4x faster a step on CPU at 13M
        parameters) but not under mixed precision, where Lightning refuses to clip for it (it would
        unscale after clipping). optim=muon: the blocks' matrices go to Muon."""
        muon_params = self.model.block_matrices() if self.optim.name == "muon" else []
        in_muon = {id(p) for p in muon_params}
        rest = [p for p in self.parameters() if p.requires_grad and id(p) not in in_muon]
        decay = [p for p in rest if p.dim() >= 2]
        no_decay = [p for p in rest if p.dim() < 2]
        groups = [
            {"params": decay, "weight_decay": self.optim.weight_decay, "name": "matrices"},
            {"params": no_decay, "weight_decay": 0.0, "name": "vectors"},  # biases, norms
        ]
        groups = mup.lr_groups(self.model, groups, self.optim.lr)  # μP: hidden matrices' own lr
        fused = self.device.type in ("cuda", "cpu")  # torch>=2.4 fuses AdamW on CPU too
        fused = fused and not mixed_precision
        betas = tuple(self.optim.betas)
        adamw = torch.optim.AdamW(groups, lr=self.optim.lr, betas=betas, fused=fused or None)
        if not muon_params:
            return adamw
        muon_lr = mup.muon_lr(self.config, self.optim.muon_lr, self.optim.muon_adjust_lr)
        muon = Muon(
            [{"params": muon_params, "name": "muon"}],
            lr=muon_lr,
            weight_decay=self.optim.weight_decay * self.optim.lr / muon_lr,
            momentum=self.optim.muon_momentum,
            adjust_lr_fn=self.optim.muon_adjust_lr,
        )
        return MuonWithAdamW(muon, adamw)

    def configure_optimizers(self):
        optimizer = self.build_optimizer(isinstance(self.trainer.precision_plugin, MixedPrecision))
        total_steps = int(self.trainer.estimated_stepping_batches)
        # the factor follows the run's step: a run from a checkpoint's tensors keeps its schedule
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda _: lr_factor(self.trainer.global_step, self.optim, total_steps)
        )
        schedule = {"scheduler": scheduler, "interval": "step", "name": "vitals/lr"}
        return {"optimizer": optimizer, "lr_scheduler": schedule}

    def sample(
        self,
        prompt: str,
        max_new_tokens: int = 50,
        temperature: float = 0.8,
        top_k: int | None = 50,
    ) -> str:
        """Text continuing `prompt` (seeded), for the report and TensorBoard's Text tab."""
        ids = torch.tensor([self.tokenizer.encode(prompt)], device=self.device)
        generator = torch.Generator(device=self.device).manual_seed(0)
        was_training = self.training
        self.eval()
        try:
            out = self.model.generate(ids, max_new_tokens, temperature, top_k, generator)
        finally:
            self.train(was_training)
        return self.tokenizer.decode(out[0].tolist())

    @classmethod
    def hparams_from(cls, model: GPTConfig, optim: OptimConfig, tokenizer: Tokenizer) -> dict:
        return {"model": asdict(model), "optim": asdict(optim), "tokenizer": tokenizer.state_dict()}

    @classmethod
    def fresh(cls, hparams: dict) -> "GPTModule":
        """A module of new weights from its hyperparameters alone (a test's, coord_check's,
        a checkpoint's), drawn as GPT(config) draws them."""
        model = GPT(GPTConfig(**hparams["model"]))
        return cls(model, hparams["optim"], hparams["tokenizer"])


def means(sums: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact means of sums [..., 3] (nats, tokens, bytes): nats per token, bits per UTF-8 byte."""
    total, count, num_bytes = sums.unbind(-1)
    loss = total / count.clamp(min=1)
    bpb = total / (math.log(2) * num_bytes.clamp(min=1))
    return loss, bpb


def split_metrics(
    split: str, sums: torch.Tensor, names: list[str] | None, average: str
) -> dict[str, torch.Tensor]:
    """A split's exact values from each source's sums [source, 3]: `split`/loss and /bpb; a
    mixture's also per source (`split`/<source>/loss), per token over all sources (micro) and the
    mean of the sources (macro), `split`/loss and /bpb following `average` (levanter's names)."""
    loss, bpb = means(sums)  # [source] each
    if names is None:
        return {f"{split}/loss": loss[0].float(), f"{split}/bpb": bpb[0].float()}
    micro = means(sums.sum(0))
    averages = {"micro": micro, "macro": (loss.mean(), bpb.mean())}
    metrics = {}
    for i, name in enumerate(names):
        metrics[f"{split}/{name}/loss"], metrics[f"{split}/{name}/bpb"] = loss[i], bpb[i]
    for name, (avg_loss, avg_bpb) in averages.items():
        metrics[f"{split}/{name}/loss"], metrics[f"{split}/{name}/bpb"] = avg_loss, avg_bpb
    metrics[f"{split}/loss"], metrics[f"{split}/bpb"] = averages[average]
    return {name: value.float() for name, value in metrics.items()}
