"""The capability questions: short factual questions with known answers, asked greedily of every version of a
real model. The promotion gate asks them of each candidate (workers/trainer/gate.py: a candidate that forgot
answers the base model knows is refused) and the persona benchmark of each promoted version
(clawhub/devtools/personas). No tenant's data goes into them, so no tenant can move them.

A preference is easy to "learn" by forgetting everything else (one short sentence about nothing is brief).
The accuracy per version says whether the model stayed useful. A reply counts as right when it contains one
of the accepted answers as a whole word (case-insensitive).

The questions are the ones the base model (SmolLM2-135M-Instruct) knows reliably, not merely once: of 155
candidates, the 53 it answered right greedily (32 tokens) and in at least 7 of 8 samples at temperature 0.7.
An earlier set kept every question the base answered right greedily (42 of 60); most of those it answered
right in only 3 to 6 of 8 samples, so any update flipped some of them: an update that learned nothing (its
batch's rewards shuffled, no hints) cost that set 3 of 42 answers after 7 updates, and this one none of 53.

Plain Python (no torch, no Django): the web process's benchmark code imports it too.
"""

from __future__ import annotations

import re

MAX_TOKENS = 32  # the answer is in the first sentence; the base's figure is measured at this
# The promotion gate asks every candidate, so it stops earlier: greedy, the base (SmolLM2-135M-Instruct)
# answers 52 of the 53 right within 16 tokens (all 53 within 32; the one it needs more for is "In which
# country is the Taj Mahal?"), and a batch decodes until its longest reply stops: half the steps of 32.
GATE_MAX_TOKENS = 16
# The question asks for the fact in a few words: the score reads what was said, not how it was formatted.
INSTRUCTION = "Answer in a few words."

QUESTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("What is the capital of Portugal?", ("Lisbon",)),
    ("What is the capital of Japan?", ("Tokyo",)),
    ("What is the capital of Spain?", ("Madrid",)),
    ("What is the capital of England?", ("London",)),
    ("What is the capital of Russia?", ("Moscow",)),
    ("What is the capital of China?", ("Beijing",)),
    ("What is the capital of Egypt?", ("Cairo",)),
    ("What is the capital of Canada?", ("Ottawa",)),
    ("What is the chemical symbol for water?", ("H2O",)),
    ("What is the longest river in Africa?", ("Nile",)),
    ("Who developed the theory of relativity?", ("Einstein",)),
    ("What language is spoken in Brazil?", ("Portuguese",)),
    ("What is the currency of the United States?", ("dollar",)),
    ("In which country are the pyramids of Giza?", ("Egypt",)),
    ("What is the primary language of Australia?", ("English",)),
    ("What is the smallest prime number?", ("2", "two",)),
    ("What is the square root of 9?", ("3", "three",)),
    ("How many sides does a triangle have?", ("three", "3",)),
    ("What is the capital of Greece?", ("Athens",)),
    ("What is the capital of Austria?", ("Vienna",)),
    ("What is the capital of Norway?", ("Oslo",)),
    ("What is the capital of Thailand?", ("Bangkok",)),
    ("What is the capital of the Netherlands?", ("Amsterdam",)),
    ("How many seconds are in a minute?", ("60", "sixty",)),
    ("What is the chemical symbol for gold?", ("Au",)),
    ("In which country is the Eiffel Tower?", ("France",)),
    ("In which city is the Colosseum?", ("Rome",)),
    ("In which country is the Great Wall?", ("China",)),
    ("Who was the first person to walk on the Moon?", ("Armstrong",)),
    ("What language is spoken in France?", ("French",)),
    ("What language is spoken in Germany?", ("German",)),
    ("What language is spoken in Italy?", ("Italian",)),
    ("What is the currency of the European Union?", ("euro",)),
    ("What is the opposite of up?", ("down",)),
    ("What is the main ingredient of bread?", ("flour", "wheat",)),
    ("What is the longest river in South America?", ("Amazon",)),
    ("What is the capital of Mexico?", ("Mexico City",)),
    ("What is the capital of Australia?", ("Canberra",)),
    ("What is the capital of Scotland?", ("Edinburgh",)),
    ("What is the capital of Indonesia?", ("Jakarta",)),
    ("What language is spoken in Spain?", ("Spanish",)),
    ("What language is spoken in Japan?", ("Japanese",)),
    ("What language is spoken in China?", ("Chinese", "Mandarin",)),
    ("What is the currency of India?", ("rupee",)),
    ("What is the currency of Russia?", ("ruble", "rouble",)),
    ("In which country is the Taj Mahal?", ("India",)),
    ("In which country is the Statue of Liberty?", ("United States", "USA", "America",)),
    ("In which country is Mount Fuji?", ("Japan",)),
    ("In which country is Big Ben?", ("England", "United Kingdom", "UK", "Britain",)),
    ("In which country is the Leaning Tower of Pisa?", ("Italy",)),
    ("In which city is the Eiffel Tower?", ("Paris",)),
    ("What is the chemical symbol for iron?", ("Fe",)),
    ("What is the largest animal on Earth?", ("whale",)),
)

# A plain one-sentence answer to each question (the same order): the texts whose perplexity the gate
# measures for a real model, in place of the tiny model's corpus (which a real model never saw).
REFERENCE_ANSWERS: tuple[str, ...] = (
    "The capital of Portugal is Lisbon.",
    "The capital of Japan is Tokyo.",
    "The capital of Spain is Madrid.",
    "The capital of England is London.",
    "The capital of Russia is Moscow.",
    "The capital of China is Beijing.",
    "The capital of Egypt is Cairo.",
    "The capital of Canada is Ottawa.",
    "The chemical symbol for water is H2O.",
    "The longest river in Africa is the Nile.",
    "Albert Einstein developed the theory of relativity.",
    "The language spoken in Brazil is Portuguese.",
    "The currency of the United States is the dollar.",
    "The pyramids of Giza are in Egypt.",
    "The primary language of Australia is English.",
    "The smallest prime number is 2.",
    "The square root of 9 is 3.",
    "A triangle has three sides.",
    "The capital of Greece is Athens.",
    "The capital of Austria is Vienna.",
    "The capital of Norway is Oslo.",
    "The capital of Thailand is Bangkok.",
    "The capital of the Netherlands is Amsterdam.",
    "There are sixty seconds in a minute.",
    "The chemical symbol for gold is Au.",
    "The Eiffel Tower is in France.",
    "The Colosseum is in Rome.",
    "The Great Wall is in China.",
    "Neil Armstrong was the first person to walk on the Moon.",
    "The language spoken in France is French.",
    "The language spoken in Germany is German.",
    "The language spoken in Italy is Italian.",
    "The currency of the European Union is the euro.",
    "The opposite of up is down.",
    "The main ingredient of bread is flour.",
    "The longest river in South America is the Amazon.",
    "The capital of Mexico is Mexico City.",
    "The capital of Australia is Canberra.",
    "The capital of Scotland is Edinburgh.",
    "The capital of Indonesia is Jakarta.",
    "The language spoken in Spain is Spanish.",
    "The language spoken in Japan is Japanese.",
    "The main language spoken in China is Mandarin Chinese.",
    "The currency of India is the rupee.",
    "The currency of Russia is the ruble.",
    "The Taj Mahal is in India.",
    "The Statue of Liberty is in the United States.",
    "Mount Fuji is in Japan.",
    "Big Ben is in England.",
    "The Leaning Tower of Pisa is in Italy.",
    "The Eiffel Tower is in Paris.",
    "The chemical symbol for iron is Fe.",
    "The largest animal on Earth is the blue whale.",
)


def messages(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{question} {INSTRUCTION}"}]


def is_right(reply: str, answers: tuple[str, ...]) -> bool:
    return any(re.search(rf"(?<!\w){re.escape(a)}(?!\w)", reply or "", re.IGNORECASE) for a in answers)


def accuracy(replies: list[str], questions: tuple[tuple[str, tuple[str, ...]], ...] = QUESTIONS) -> float:
    return sum(is_right(r, a) for r, (_, a) in zip(replies, questions, strict=True)) / len(questions)
