"""gptlab_next_sentence: an offline lm-evaluation-harness task made from the corpus's val split
(docs/export.md). Each document is a passage of the val split and four candidate next sentences:
the true one and three drawn from elsewhere in the split; chance is 1/4.

    python scripts/next_sentence_task.py --out tasks --model exported
    lm_eval --model hf --model_args pretrained=exported --tasks gptlab_next_sentence \\
        --include_path tasks
"""

import argparse
import json
import os
import random
import re
from pathlib import Path

from gptlab.data.tokenizer import Tokenizer
from gptlab.errors import ConfigError
from gptlab.exits import BAD_INPUT
from gptlab.run.place import PLACE

TASK = "gptlab_next_sentence"
CHOICES = 4
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")  # a sentence ends at . ! or ? before white space
YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: multiple_choice
test_split: test
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def val_text(text: str, encoding: str, val_fraction: float) -> str:
    """The val split's text: the tokens after the first 1 - val_fraction, as gptlab splits them."""
    tokenizer = Tokenizer(encoding)
    ids = tokenizer.encode_tiktoken(text)
    return tokenizer.encoding.decode(ids[int(len(ids) * (1.0 - val_fraction)) :].tolist())


def sentences_of(text: str) -> list[str]:
    """The text's sentences in order, white space made single spaces (the first piece, cut by the
    split, left out; a list's "2." is one too, so passages stay whole)."""
    pieces = (" ".join(s.split()) for s in SENTENCE_END.split(text)[1:])
    return [s for s in pieces if s]


def documents(sentences: list[str], short: list[bool], context: int, seed: int) -> list[dict]:
    """A document per short sentence with `context` sentences before it; the three distractors:
    short sentences at least `context` + 2 away, so none is the passage or its neighbour. Short:
    a choice fits a small model's window beside some context (lm-eval cuts the context's left)."""
    rng = random.Random(seed)
    docs = []
    for i in [i for i in range(context, len(sentences)) if short[i]]:
        far = [j for j in range(len(sentences)) if short[j] and abs(j - i) > context + 1]
        options = [sentences[i], *(sentences[j] for j in rng.sample(far, CHOICES - 1))]
        order = list(range(CHOICES))
        rng.shuffle(order)
        passage = " ".join(sentences[i - context : i])
        docs.append(
            dict(context=passage, choices=[options[k] for k in order], label=order.index(0))
        )
    return docs


def fitted(context: str, choices: list[str], window: int, tokenizer: Tokenizer) -> str:
    """The context's last words beside which every choice fits the model's window: lm-eval scores
    context + " " + choice in at most window + 1 tokens and cuts (and warns) otherwise."""
    words = context.split(" ")
    while len(words) > 1 and any(
        len(tokenizer.encode_tiktoken(" ".join(words) + " " + c)) > window + 1 for c in choices
    ):
        words = words[1:]
    return " ".join(words)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data_dir = os.environ.get("GPTLAB_DATA_DIR", "data")
    parser.add_argument("--corpus", default=str(Path(data_dir) / "sales_textbook.txt"))
    parser.add_argument("--out", required=True, help="the task folder to write (--include_path)")
    parser.add_argument("--encoding", default="cl100k_base")
    parser.add_argument("--val-fraction", type=float, default=0.1)
    parser.add_argument("--context", type=int, default=2, help="sentences before the choice")
    parser.add_argument("--max-tokens", type=int, default=24, help="the longest choice")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", help="an exported folder: contexts cut to fit its window")
    args = parser.parse_args()
    config = Path(args.model or ".", "tokenizer_config.json")
    try:  # the model's context length, as gptlab-export writes it for transformers
        window = int(json.loads(config.read_text())["model_max_length"]) if args.model else None
    except (OSError, ValueError, KeyError, TypeError):
        parser.exit(
            BAD_INPUT,
            f"{parser.prog}: --model: '{config}' holds no model_max_length; give a folder "
            "gptlab-export wrote.\n",
        )
    try:
        out = PLACE.admit(args.out, "--out")  # a new or empty folder: nothing is overwritten
    except ConfigError as e:
        parser.exit(BAD_INPUT, f"{parser.prog}: {e}\n")
    text = Path(args.corpus).read_text(encoding="utf-8")
    sentences = sentences_of(val_text(text, args.encoding, args.val_fraction))
    tokenizer = Tokenizer(args.encoding)
    short = [  # a choice: a sentence of 3 words or more, short enough
        len(s.split()) >= 3 and len(tokenizer.encode_tiktoken(" " + s)) <= args.max_tokens
        for s in sentences
    ]
    docs = documents(sentences, short, args.context, args.seed)
    for doc in docs if window else []:
        doc["context"] = fitted(doc["context"], doc["choices"], window, tokenizer)
    data = out / f"{TASK}.jsonl"
    PLACE.write_text(data, "".join(json.dumps(d) + "\n" for d in docs))
    PLACE.write_text(out / f"{TASK}.yaml", YAML.format(task=TASK, data=json.dumps(str(data))))
    print(f"{len(docs)} documents from {len(sentences)} val sentences: {out}")  # noqa: T201


if __name__ == "__main__":
    main()
