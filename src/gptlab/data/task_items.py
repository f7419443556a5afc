"""A task's items and how lm-evaluation-harness 0.4.13 renders each task's rows into them (its
task yamls and their preprocessing: cloze form, lm-eval's target delimiter " " before each
choice), so lm-eval and gptlab score the same strings (docs/downstream.md). A row that does not
hold what its task needs raises ValueError, saying which field."""

import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class Item:
    """One question: a request (context, continuation) per choice, the gold one's index, and the
    characters per-character normalisation divides each choice's log-likelihood by."""

    contexts: tuple[str, ...]  # one per choice (WinoGrande's differ; the others repeat one)
    continuations: tuple[str, ...]  # one per choice, the " " before it included
    label: int
    lengths: tuple[int, ...]  # len() of each choice's text, as lm-eval's acc_norm counts it
    row: int = -1  # its row in the task's file (what an independent harness is given)

    @property
    def gold(self) -> str:
        """The gold request as one text (a shot for the items after it)."""
        return self.contexts[self.label] + self.continuations[self.label]


def text(row: dict, key: str) -> str:
    value = row.get(key)
    if not isinstance(value, str):
        raise ValueError(f"its {key!r} is {type(value).__name__}, not text")
    return value


def texts(value, key: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError(f"its {key!r} is not a list of texts")
    return value


def choice(label: str, contexts: list[str], choices: list[str], gold: int) -> Item:
    """Cloze form: each choice after the context and lm-eval's target delimiter, a space."""
    if not 0 <= gold < len(choices):
        raise ValueError(f"its {label} points at none of its {len(choices)} choices")
    contexts = contexts * len(choices) if len(contexts) == 1 else contexts
    return Item(tuple(contexts), tuple(" " + c for c in choices), gold, tuple(map(len, choices)))


def hellaswag_text(value: str) -> str:
    """lm-eval's hellaswag/utils.py preprocess: WikiHow's [title] and bracketed artifacts out."""
    value = value.strip().replace(" [title]", ". ")
    return re.sub("\\[.*?\\]", "", value).replace("  ", " ")


def hellaswag(row: dict) -> Item:
    context = text(row, "ctx_a") + " " + text(row, "ctx_b").capitalize()
    query = hellaswag_text(text(row, "activity_label") + ": " + context)
    endings = [hellaswag_text(e) for e in texts(row.get("endings"), "endings")]
    label = text(row, "label")
    if not label.isdigit():
        raise ValueError(f"its 'label' {label!r} is not a number")
    return choice("label", [query], endings, int(label))


def lettered(row: dict, question: str, context: str) -> Item:
    """ARC and OpenBookQA: choices {text, label}, the gold one named by answerKey."""
    choices = row.get("choices")
    if not isinstance(choices, dict):
        raise ValueError("its 'choices' is not {text, label}")
    options, letters = texts(choices.get("text"), "text"), texts(choices.get("label"), "label")
    key = text(row, "answerKey").lstrip()
    if key not in letters or len(letters) != len(options):
        raise ValueError(f"its answerKey {key!r} is not one of its labels {letters}")
    return choice("answerKey", [context], options, letters.index(key))


def arc(row: dict) -> Item:
    return lettered(row, "question", f"Question: {text(row, 'question')}\nAnswer:")


def openbookqa(row: dict) -> Item:
    return lettered(row, "question_stem", text(row, "question_stem"))


def piqa(row: dict) -> Item:
    label = row.get("label")
    if type(label) is not int:
        raise ValueError("its 'label' is not a whole number")
    options = [text(row, "sol1"), text(row, "sol2")]
    return choice("label", [f"Question: {text(row, 'goal')}\nAnswer:"], options, label)


def sciq(row: dict) -> Item:
    context = f"{text(row, 'support').lstrip()}\nQuestion: {text(row, 'question')}\nAnswer:"
    options = [text(row, k) for k in ("distractor1", "distractor2", "distractor3")]
    return choice("correct_answer", [context], [*options, text(row, "correct_answer")], 3)


def winogrande(row: dict) -> Item:
    """lm-eval's partial scoring: the sentence up to the blank with each option is a context, the
    rest after the blank the one continuation scored after each; the per-character
    normalisation divides by that shared continuation, so acc_norm is acc."""
    sentence, answer = text(row, "sentence"), text(row, "answer")
    if "_" not in sentence or answer not in ("1", "2"):
        raise ValueError("its sentence has no blank '_' or its answer is not 1 or 2")
    cut = sentence.index("_")
    contexts = [sentence[:cut] + text(row, k) for k in ("option1", "option2")]
    rest = sentence[cut + 1 :].strip()
    return Item(tuple(contexts), (" " + rest,) * 2, int(answer) - 1, (len(rest),) * 2)


def lambada_request(row: dict) -> Item:
    """OLMo's rendered LAMBADA request: the passage without its last word, then " word"."""
    request = row.get("request")
    if not isinstance(request, dict):
        raise ValueError("it has no request {context, continuation}")
    context, continuation = text(request, "context"), text(request, "continuation")
    return Item((context,), (continuation,), 0, (len(continuation.lstrip()),))


def lambada_text(row: dict) -> Item:
    """The Hub's lambada_openai row, rendered as lm-eval's lambada_openai.yaml does."""
    words = text(row, "text").split(" ")
    if len(words) < 2:
        raise ValueError("its text has no last word to predict")
    return Item((" ".join(words[:-1]),), (" " + words[-1],), 0, (len(words[-1]),))
