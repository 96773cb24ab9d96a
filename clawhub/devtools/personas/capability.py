"""The capability guard: short factual questions the base model answers, asked greedily of every version.

A preference is easy to "learn" by forgetting everything else (one short sentence about nothing is brief).
The guard's accuracy per version says whether the model stayed useful. The questions were chosen from 60 by
asking the base model (SmolLM2-135M-Instruct, greedy, 48 tokens): the guard keeps the 42 it answered (it
missed, among others, the largest planet, the fastest land animal and the first US president), so the base
scores near 1.0 on its own guard by choice, and a drop is a loss. A reply counts as right when it contains
one of the accepted answers as a whole word (case-insensitive).
"""

from __future__ import annotations

import re

MAX_TOKENS = 32  # the answer is in the first sentence; the base's figure is measured at this
# The question asks for the fact in a few words: the score reads what was said, not how it was formatted.
INSTRUCTION = "Answer in a few words."

QUESTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("What is the capital of Portugal?", ("Lisbon",)),
    ("What is the capital of Japan?", ("Tokyo",)),
    ("What is the capital of Italy?", ("Rome",)),
    ("What is the capital of Germany?", ("Berlin",)),
    ("What is the capital of Spain?", ("Madrid",)),
    ("What is the capital of England?", ("London",)),
    ("What is the capital of Russia?", ("Moscow",)),
    ("What is the capital of China?", ("Beijing",)),
    ("What is the capital of Egypt?", ("Cairo",)),
    ("What is the capital of Canada?", ("Ottawa",)),
    ("What do bees make?", ("honey",)),
    ("What color is the sky on a clear day?", ("blue",)),
    ("What color is grass?", ("green",)),
    ("What is frozen water called?", ("ice",)),
    ("What gas do plants absorb from the air?", ("carbon dioxide", "CO2")),
    ("What gas do humans need to breathe?", ("oxygen",)),
    ("What is the chemical symbol for water?", ("H2O",)),
    ("How many days are in a week?", ("seven", "7")),
    ("How many continents are there?", ("seven", "7")),
    ("How many months are in a year?", ("twelve", "12")),
    ("What is 2 plus 2?", ("4", "four")),
    ("What is 10 times 10?", ("100", "hundred")),
    ("What is the largest ocean on Earth?", ("Pacific",)),
    ("What is the longest river in Africa?", ("Nile",)),
    ("What is the largest mammal?", ("whale",)),
    ("What organ pumps blood through the body?", ("heart",)),
    ("Who wrote Romeo and Juliet?", ("Shakespeare",)),
    ("Who painted the Mona Lisa?", ("Leonardo", "Vinci")),
    ("Who developed the theory of relativity?", ("Einstein",)),
    ("What language is spoken in Brazil?", ("Portuguese",)),
    ("What language is mainly spoken in Mexico?", ("Spanish",)),
    ("What is the currency of Japan?", ("yen",)),
    ("What is the currency of the United States?", ("dollar",)),
    ("What is the boiling point of water in Celsius?", ("100",)),
    ("What is the tallest mountain in the world?", ("Everest",)),
    ("What is the largest desert in the world?", ("Sahara", "Antarctic")),
    ("In which country are the pyramids of Giza?", ("Egypt",)),
    ("What is the opposite of hot?", ("cold",)),
    ("What is the primary language of Australia?", ("English",)),
    ("What is the smallest prime number?", ("2", "two")),
    ("What is the square root of 9?", ("3", "three")),
    ("How many sides does a triangle have?", ("three", "3")),
)


def messages(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{question} {INSTRUCTION}"}]


def is_right(reply: str, answers: tuple[str, ...]) -> bool:
    return any(re.search(rf"(?<!\w){re.escape(a)}(?!\w)", reply or "", re.IGNORECASE) for a in answers)


def accuracy(replies: list[str], questions: tuple[tuple[str, tuple[str, ...]], ...] = QUESTIONS) -> float:
    return sum(is_right(r, a) for r, (_, a) in zip(replies, questions, strict=True)) / len(questions)
