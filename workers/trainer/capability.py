"""The capability questions: short factual questions with known answers, asked greedily of every version of a
real model. The promotion gate asks them of each candidate (workers/trainer/gate.py: a candidate that forgot
answers the base model knows is refused) and the persona benchmark of each promoted version
(clawhub/devtools/personas). No tenant's data goes into them, so no tenant can move them.

A preference is easy to "learn" by forgetting everything else (one short sentence about nothing is brief).
The accuracy per version says whether the model stayed useful. The questions were chosen from 60 by asking
the base model (SmolLM2-135M-Instruct, greedy, 48 tokens): the set keeps the 42 it answered (it missed, among
others, the largest planet, the fastest land animal and the first US president), so the base scores near 1.0
on it by choice, and a drop is a loss. A reply counts as right when it contains one of the accepted answers as
a whole word (case-insensitive).

Plain Python (no torch, no Django): the web process's benchmark code imports it too.
"""

from __future__ import annotations

import re

MAX_TOKENS = 32  # the answer is in the first sentence; the base's figure is measured at this
# The promotion gate asks every candidate, so it stops earlier: greedy, the base (SmolLM2-135M-Instruct)
# answers 41 of the 42 right within 16 tokens (all 42 within 32; the one it needs more for is "What color is
# grass?"), and a batch decodes until its longest reply stops: half the steps of 32.
GATE_MAX_TOKENS = 16
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

# A plain one-sentence answer to each question (the same order): the texts whose perplexity the gate
# measures for a real model, in place of the tiny model's corpus (which a real model never saw).
REFERENCE_ANSWERS: tuple[str, ...] = (
    "The capital of Portugal is Lisbon.",
    "The capital of Japan is Tokyo.",
    "The capital of Italy is Rome.",
    "The capital of Germany is Berlin.",
    "The capital of Spain is Madrid.",
    "The capital of England is London.",
    "The capital of Russia is Moscow.",
    "The capital of China is Beijing.",
    "The capital of Egypt is Cairo.",
    "The capital of Canada is Ottawa.",
    "Bees make honey.",
    "The sky is blue on a clear day.",
    "Grass is green.",
    "Frozen water is called ice.",
    "Plants absorb carbon dioxide from the air.",
    "Humans need oxygen to breathe.",
    "The chemical symbol for water is H2O.",
    "There are seven days in a week.",
    "There are seven continents.",
    "There are twelve months in a year.",
    "2 plus 2 is 4.",
    "10 times 10 is 100.",
    "The largest ocean on Earth is the Pacific Ocean.",
    "The longest river in Africa is the Nile.",
    "The largest mammal is the blue whale.",
    "The heart pumps blood through the body.",
    "William Shakespeare wrote Romeo and Juliet.",
    "Leonardo da Vinci painted the Mona Lisa.",
    "Albert Einstein developed the theory of relativity.",
    "The language spoken in Brazil is Portuguese.",
    "The main language spoken in Mexico is Spanish.",
    "The currency of Japan is the yen.",
    "The currency of the United States is the dollar.",
    "Water boils at 100 degrees Celsius.",
    "The tallest mountain in the world is Mount Everest.",
    "The largest hot desert in the world is the Sahara.",
    "The pyramids of Giza are in Egypt.",
    "The opposite of hot is cold.",
    "The primary language of Australia is English.",
    "The smallest prime number is 2.",
    "The square root of 9 is 3.",
    "A triangle has three sides.",
)


def messages(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{question} {INSTRUCTION}"}]


def is_right(reply: str, answers: tuple[str, ...]) -> bool:
    return any(re.search(rf"(?<!\w){re.escape(a)}(?!\w)", reply or "", re.IGNORECASE) for a in answers)


def accuracy(replies: list[str], questions: tuple[tuple[str, tuple[str, ...]], ...] = QUESTIONS) -> float:
    return sum(is_right(r, a) for r, (_, a) in zip(replies, questions, strict=True)) / len(questions)
