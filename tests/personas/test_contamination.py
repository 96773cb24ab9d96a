"""No model of this project was trained on the benchmark: none of its prompts, reactions, hints or capability
questions appear in any training corpus in the repository (the tiny model's). A benchmark whose phrases a
model has seen measures its memory, not learning."""

import gzip
import re
from pathlib import Path

from clawhub.devtools.personas import personas as P
from workers.trainer import capability as C

CORPUS_DIR = Path(__file__).resolve().parents[2] / "workers" / "tiny_model" / "corpus"
PLACEHOLDER = re.compile(r"\{\w+\}")


def corpus_text() -> str:
    texts = []
    for path in sorted(CORPUS_DIR.rglob("*")):
        if path.suffix == ".gz":
            texts.append(gzip.decompress(path.read_bytes()).decode("utf-8", "replace"))
        elif path.is_file() and path.suffix in (".jsonl", ".txt", ".py", ".json"):
            texts.append(path.read_text("utf-8", "replace"))
    return " ".join(" ".join(texts).lower().split())


def fragments(template: str) -> list[str]:
    """A template's fixed text between its placeholders, long enough to be a phrase rather than a word."""
    return [piece.strip().lower() for piece in PLACEHOLDER.split(template) if len(piece.strip()) >= 12]


def benchmark_phrases() -> list[str]:
    prompts = [opening.format(topic=t) for opening in P.OPENINGS for t in P.TRAINING_TOPICS]
    prompts += [p.question for p in P.held_out_prompts()]
    reactions = [f for pool in P.reaction_phrasings().values() for t in (*pool.training, *pool.held_out)
                 for f in fragments(t)]
    hints = [f for t in P.JUDGE_RULES["hint_templates"].values() for f in fragments(t)]
    preferences = [p.preference for p in P.PERSONAS.values()]
    questions = [q for q, _ in C.QUESTIONS]
    return [" ".join(p.lower().split()) for p in (*prompts, *reactions, *hints, *preferences, *questions)]


def test_no_benchmark_phrase_is_in_any_training_corpus():
    corpus = corpus_text()
    # The check can fail: the earlier benchmark's phrases, which the tiny model was trained on, are found.
    assert "more bold please, i like headings and a numbered list" in corpus
    phrases = benchmark_phrases()
    assert len(phrases) > 400
    found = [p for p in phrases if p in corpus]
    assert found == []
