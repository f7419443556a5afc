"""A GPT scored on downstream tasks (docs/downstream.md), as lm-evaluation-harness and OLMo
score a base model: each choice's log-likelihood after its context, many choices a forward pass.

- acc: the choice of highest summed log-likelihood is the gold one (a gold-only task, LAMBADA:
  greedy decoding gives the whole gold continuation);
- acc_norm: the same per character of the choice (lm-eval's acc_norm, OLMo's acc_per_char);
- bpb: the gold continuation's bits per byte, the mean over items (OLMo's small-model signal);
- centred: (acc - chance) / (1 - chance), CORE's accuracy centred on chance.

Text the compact vocabulary never saw still scores: an out-of-vocabulary token is spelled with
the fewest in-vocabulary tokens that make its bytes (the model's probability of that spelling),
and a byte no in-vocabulary token holds is dropped from what the model reads and costs
ln(vocab_size) nats, a uniform model's price of a token; such items are counted (n_oov).
A context longer than the window is cut on the left, as lm-eval's HFLM cuts it (n_cut)."""

import dataclasses
import math

import numpy as np
import torch

from gptlab.data.tasks import Item, Task
from gptlab.data.tokenizer import Tokenizer

UNKNOWN = -1  # a byte no in-vocabulary token spells


@dataclasses.dataclass(frozen=True)
class TaskScore:
    acc: float
    acc_norm: float
    bpb: float
    centred: float
    n: int  # items scored
    n_oov: int  # items holding text outside the compact vocabulary
    n_cut: int  # items whose context was cut on the left to fit the window
    random: float  # chance accuracy

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ItemResult:
    """One item's scores: each choice's log-likelihood (nats), the two choices made."""

    loglikelihoods: tuple[float, ...]
    choice: int  # by summed log-likelihood (a gold-only task: 0 if greedy gives it, else -1)
    choice_norm: int  # by log-likelihood per character
    bpb: float  # of the gold continuation


class Speller:
    """tiktoken ids -> model ids; with a compact vocabulary, an id outside it spelled with the
    fewest in-vocabulary tokens whose bytes make its bytes (UNKNOWN for a byte none holds)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.spelt: dict[int, list[int]] = {}
        self.pieces: dict[bytes, int] = {}
        vocab = tokenizer.vocab
        if vocab is not None:
            special = {
                tokenizer.encoding.encode_single_token(t)
                for t in tokenizer.encoding.special_tokens_set
            }
            for model_id, token in enumerate(vocab.tolist()):
                if token not in special:
                    self.pieces[tokenizer.encoding.decode_single_token_bytes(token)] = model_id
        self.longest = max(map(len, self.pieces), default=1)

    def __call__(self, ids: np.ndarray) -> tuple[list[int], bool]:
        """(model ids, UNKNOWN for a byte no in-vocabulary token holds; whether any was outside)."""
        vocab = self.tokenizer.vocab
        if vocab is None:
            return ids.tolist(), False
        idx = np.searchsorted(vocab, ids)
        inside = vocab[np.minimum(idx, len(vocab) - 1)] == ids
        if inside.all():
            return idx.tolist(), False
        out = []
        for i, token, known in zip(idx.tolist(), ids.tolist(), inside.tolist(), strict=True):
            out += [i] if known else self.spell(token)
        return out, True

    def spell(self, token: int) -> list[int]:
        """The fewest in-vocabulary pieces that make the token's bytes; an unknown byte counts as
        a thousand pieces, so any spelling that avoids one is preferred."""
        if token not in self.spelt:
            raw = self.tokenizer.encoding.decode_single_token_bytes(token)
            cost = [0] + [math.inf] * len(raw)
            back: list[tuple[int, int]] = [(0, UNKNOWN)] * (len(raw) + 1)
            for end in range(1, len(raw) + 1):
                cost[end], back[end] = cost[end - 1] + 1000, (end - 1, UNKNOWN)
                for start in range(max(0, end - self.longest), end):
                    piece = self.pieces.get(raw[start:end])
                    if piece is not None and cost[start] + 1 < cost[end]:
                        cost[end], back[end] = cost[start] + 1, (start, piece)
            spelt, end = [], len(raw)
            while end:
                end, piece = back[end]
                spelt.append(piece)
            self.spelt[token] = spelt[::-1]
        return self.spelt[token]


@dataclasses.dataclass(frozen=True)
class Request:
    """One (context, continuation) in model ids: `ids` fed then predicted, the last `scored` of
    them the continuation's; `unknown` of its bytes spelled by no token (each costs ln V)."""

    ids: tuple[int, ...]
    scored: int
    unknown: int
    nbytes: int  # the continuation's UTF-8 bytes


def encode_request(spell: Speller, context: str, continuation: str, window: int):
    """(the Request, whether it holds text outside the vocabulary, whether it was cut): as
    lm-eval's HFLM encodes a pair, the context's trailing spaces moved onto the continuation,
    the whole text encoded once and split after the context's tokens."""
    encode = spell.tokenizer.encode_tiktoken
    nbytes = len(continuation.encode())
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole, first = encode(context + continuation), encode(context)
    ctx, ctx_oov = spell(first)
    cont, cont_oov = spell(whole[len(first) :])
    ctx = [i for i in ctx if i != UNKNOWN] or [i for i in spell(encode("\n"))[0] if i != UNKNOWN]
    unknown = cont.count(UNKNOWN)
    cont = [i for i in cont if i != UNKNOWN]
    ids = ctx + cont
    cut = len(ids) > window + 1
    ids = ids[-(window + 1) :]
    request = Request(tuple(ids), min(len(cont), len(ids) - 1), unknown, nbytes)
    return request, ctx_oov or cont_oov, cut


def encode_task(task: Task, tokenizer: Tokenizer, window: int, max_items: int | None):
    """(items, their requests, how many hold unseen text, how many were cut): tokenized once per
    tokenizer, window and subset, kept on the task (the in-loop callback scores it again)."""
    vocab = None if tokenizer.vocab is None else hash(tokenizer.vocab.tobytes())
    key = (tokenizer.encoding.name, vocab, window, max_items)
    if key not in task.encoded:
        spell = Speller(tokenizer)
        items = task.scored(max_items)
        requests, n_oov, n_cut = [], 0, 0
        for item in items:
            encoded = [
                encode_request(spell, c, x, window)
                for c, x in zip(item.contexts, item.continuations, strict=True)
            ]
            requests.append([r for r, _, _ in encoded])
            n_oov += any(oov for _, oov, _ in encoded)
            n_cut += any(cut for _, _, cut in encoded)
        task.encoded[key] = (items, requests, n_oov, n_cut)
    return task.encoded[key]


@torch.no_grad()
def loglikelihoods(model, requests: list[Request], batch_size: int) -> list[tuple[float, bool]]:
    """Each request's (summed log-likelihood of its continuation, whether greedy decoding gives
    it), longest first in batches of `batch_size` rows, right-padded (causal: padding after a
    row changes none of its logits)."""
    device = next(model.parameters()).device
    vocab = model.config.vocab_size
    order = sorted(range(len(requests)), key=lambda i: -len(requests[i].ids))
    out: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
    for start in range(0, len(order), batch_size):
        rows = [requests[i] for i in order[start : start + batch_size]]
        length = max(len(r.ids) for r in rows) - 1
        ids = torch.zeros(len(rows), length, dtype=torch.long)
        for row, r in enumerate(rows):
            ids[row, : len(r.ids) - 1] = torch.tensor(r.ids[:-1])
        logits = model(ids.to(device)).float()  # [rows, length, vocab_size]
        for row, (r, index) in enumerate(zip(rows, order[start : start + batch_size], strict=True)):
            end = len(r.ids) - 1  # the positions whose next token is the continuation's
            span = logits[row, end - r.scored : end]  # [scored, vocab_size]
            targets = torch.tensor(r.ids[end - r.scored + 1 :], device=span.device)
            logp = torch.log_softmax(span, dim=-1).gather(1, targets[:, None])[:, 0]
            ll = logp.double().sum().item() - r.unknown * math.log(vocab)
            greedy = r.unknown == 0 and bool((span.argmax(-1) == targets).all())
            out[index] = (ll, greedy)
    return out


def score_task(
    model, tokenizer: Tokenizer, task: Task, max_items: int | None = None, batch_size: int = 32
) -> tuple[TaskScore, list[ItemResult]]:
    """The task's scores on its first `max_items` items, and each item's result."""
    items, requests, n_oov, n_cut = encode_task(
        task, tokenizer, model.config.context_length, max_items
    )
    flat = [r for rs in requests for r in rs]
    training = model.training
    model.eval()
    try:
        scored = loglikelihoods(model, flat, batch_size)
    finally:
        model.train(training)
    results, at = [], 0
    for item, rs in zip(items, requests, strict=True):
        pairs = scored[at : at + len(rs)]
        at += len(rs)
        results.append(item_result(task, item, rs, pairs))
    return summarise(task, items, results, n_oov, n_cut), results


def item_result(task: Task, item: Item, requests: list[Request], pairs) -> ItemResult:
    lls = tuple(ll for ll, _ in pairs)
    gold = requests[item.label]
    bpb = -lls[item.label] / (math.log(2) * max(gold.nbytes, 1))
    if task.gold_only:
        choice = 0 if pairs[0][1] else -1
        return ItemResult(lls, choice, choice, bpb)
    per_char = [ll / max(n, 1) for ll, n in zip(lls, item.lengths, strict=True)]
    return ItemResult(lls, int(np.argmax(lls)), int(np.argmax(per_char)), bpb)


def summarise(task: Task, items: list[Item], results: list[ItemResult], n_oov, n_cut) -> TaskScore:
    n = len(results)
    labels = [item.label for item in items]
    acc = sum(r.choice == y for r, y in zip(results, labels, strict=True)) / max(n, 1)
    acc_norm = sum(r.choice_norm == y for r, y in zip(results, labels, strict=True)) / max(n, 1)
    bpb = sum(r.bpb for r in results) / max(n, 1)
    chance = 0.0 if task.gold_only else sum(1 / len(i.contexts) for i in items) / max(n, 1)
    return TaskScore(acc, acc_norm, bpb, (acc - chance) / (1 - chance), n, n_oov, n_cut, chance)


def score_tasks(
    model,
    tokenizer: Tokenizer,
    tasks: list[Task],
    max_items: int | None = None,
    batch_size: int = 32,
) -> dict[str, TaskScore]:
    """Each task's scores by name (the model's mode is left as it was)."""
    return {
        task.name: score_task(model, tokenizer, task, max_items, batch_size)[0] for task in tasks
    }


def aggregate(scores: dict[str, TaskScore]) -> dict:
    """Over the tasks, each weighing the same: the mean centred accuracy (CORE's figure), mean
    acc and bpb, and the tasks it is made of."""
    parts = list(scores)
    mean = lambda key: sum(getattr(s, key) for s in scores.values()) / max(len(parts), 1)  # noqa: E731
    return {"core": mean("centred"), "acc": mean("acc"), "bpb": mean("bpb"), "tasks": parts}
