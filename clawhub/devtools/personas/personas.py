"""Personas of the benchmark: a fixed preference, a compliance score computed by code, and a scripted user who
answers like a person (a correction when the preference is broken, a thank-you and the next question when it
is kept). Plain Python: no Django, no HTTP; ``driver`` puts these users in front of a running stack.

The two personas are those of OpenClaw-RL's published evaluation (its openclaw-test personas): a student
who wants homework answers that do not look AI-written, and a teacher who wants specific, friendly comments.
The group is three users sharing one group adapter with the student's preference, one of whom is adversarial.

The prompts are homework word problems written exactly the way the tiny model's corpus writes them
(workers/trainer/corpus/make_chats.py): a model of half a million parameters only answers what it has seen.
Its corpus answers them in two styles, plain sentences and **bold** with numbered steps, which gives the
student something to learn; it gets most of the arithmetic wrong, which is why the teacher's "specific" asks
for the question's own numbers rather than the right result.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

# --- prompt bank ---------------------------------------------------------------------------------------

# The corpus's vocabulary, so that every question reads like one the tiny model was trained on.
NAMES = ("Ana", "Ben", "Chloe", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jack", "Kira", "Leo")
THINGS = ("apples", "pencils", "books", "stickers", "marbles", "cookies", "cards", "shells", "coins",
          "stamps")
KINDS = ("add", "sub", "mul", "percent", "area", "speed")
# The held-out measurement asks questions of kinds no training session ever asks (their templates never
# appear in a training conversation), so a rising score is the preference generalising, not the adapter
# remembering answers to the questions it was trained on.
HELD_OUT_KINDS = ("area", "speed")
TRAINING_KINDS = tuple(k for k in KINDS if k not in HELD_OUT_KINDS)
# The simulated users' noise: this share of reactions is the opposite of what the reply deserved (a
# correction of a compliant reply, a thank-you for a non-compliant one), as real users are inconsistent.
NOISE_RATE = 0.1

BANK_SEED = 20260311  # fixed: the held-out set must not change between runs, methods or machines
HELD_OUT_SIZE = 24
TRAINING_SIZE = 192


@dataclass(frozen=True)
class Problem:
    """A homework word problem: its wording, the numbers it gives, its result and what it is about."""

    question: str
    numbers: tuple[int, ...]
    answer: int
    # How a person refers back to it ("the 4 boxes of 9 cookies"): with its numbers, so that feedback about
    # two problems is never the same text.
    topic: str


def make_problem(rng: random.Random, kinds: Sequence[str] = KINDS) -> Problem:
    kind = rng.choice(kinds)
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    if kind == "add":
        a, b = rng.randint(3, 40), rng.randint(3, 40)
        return Problem(f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?",
                       (a, b), a + b, f"{name}'s {a} and {b} {thing}")
    if kind == "sub":
        a = rng.randint(20, 90)
        b = rng.randint(2, a - 1)
        return Problem(f"{name} had {a} {thing} and gave away {b}. How many are left?", (a, b), a - b,
                       f"the {a} {thing} minus {b}")
    if kind == "mul":
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        return Problem(f"There are {a} boxes with {b} {thing} in each box. "
                       f"How many {thing} are there in all?", (a, b), a * b, f"the {a} boxes of {b} {thing}")
    if kind == "percent":
        p, total = rng.choice([10, 20, 25, 50]), rng.choice([40, 60, 80, 120, 200])
        return Problem(f"A class has {total} students and {p} percent of them walk to school. "
                       "How many students walk?", (total, p), total * p // 100,
                       f"{p} percent of {total} students")
    if kind == "area":
        a, b = rng.randint(2, 15), rng.randint(2, 15)
        return Problem(f"A garden is {a} meters long and {b} meters wide. What is its area?", (a, b), a * b,
                       f"the {a} by {b} garden")
    h, v = rng.randint(2, 6), rng.choice([30, 40, 50, 60, 70, 80])
    return Problem(f"A bus drives at {v} kilometers per hour for {h} hours. How far does it go?", (v, h),
                   v * h, f"the bus at {v} for {h} hours")


@lru_cache(maxsize=4)
def prompt_bank(seed: int = BANK_SEED, held_out: int = HELD_OUT_SIZE,
                training: int = TRAINING_SIZE) -> tuple[tuple[Problem, ...], tuple[Problem, ...]]:
    """(training problems, held-out problems): distinct questions from one fixed generator, the held-out set
    from HELD_OUT_KINDS only and the training set from the other kinds, so that no held-out question's
    template is ever in a training session. The same arguments give the same split on every machine
    (``random.Random`` with an int seed)."""
    rng = random.Random(seed)

    def draw(n: int, kinds: Sequence[str]) -> tuple[Problem, ...]:
        seen: set[str] = set()
        problems: list[Problem] = []
        while len(problems) < n:
            problem = make_problem(rng, kinds)
            if problem.question not in seen:
                seen.add(problem.question)
                problems.append(problem)
        return tuple(problems)

    held = draw(held_out, HELD_OUT_KINDS)
    return draw(training, TRAINING_KINDS), held


def training_problems() -> tuple[Problem, ...]:
    return prompt_bank()[0]


def held_out_problems() -> tuple[Problem, ...]:
    return prompt_bank()[1]


def held_out_messages(problem: Problem) -> list[dict[str, str]]:
    """The measurement prompt: the bare question, one user message, the same for every persona and method."""
    return [{"role": "user", "content": problem.question}]


def opening(problem: Problem, rng: random.Random) -> str:
    """How a user asks: the three ways the corpus asks a homework question."""
    return rng.choice([problem.question, f"Can you help me with my homework? {problem.question}",
                       f"{problem.question} Please show the steps."])


# --- scoring ----------------------------------------------------------------------------------------------

_NUMBERED_LINE = re.compile(r"(?m)^\s*\d+[.)]\s")
_SENTENCE = re.compile(r"[^.!?]*\w[^.!?]*(?:[.!?]+|$)")
_NUMBER = re.compile(r"(?<![\w.])\d+(?!\w|\.\d)")  # whole numbers: not "v2", not either part of "3.5"
_FRIENDLY = re.compile(r"\b(?:we|you|your|let['’]?s|then|so|glad|great|good\s+luck|well\s+done|nice|hope)\b",
                       re.IGNORECASE)
STUDENT_MIN_SENTENCES = 3

BOLD, NUMBERED_LIST, MISSING_STEPS = "bold", "numbered_list", "missing_steps"
VAGUE, UNFRIENDLY = "vague", "unfriendly"


def sentences(text: str) -> list[str]:
    """Sentences with at least one word character: "Then 4 times 9 is 36." counts, a stray "**" does not."""
    return [s.strip() for s in _SENTENCE.findall(text or "") if s.strip()]


def numbers_in(text: str) -> set[int]:
    return {int(n) for n in _NUMBER.findall(text or "")}


def student_violations(text: str, problem: Problem | None = None) -> list[str]:
    """What breaks the student's preference: **bold**, a numbered list, or fewer than three sentences (the
    steps were cut: the corpus's plain answers have three steps and a result)."""
    found = []
    if "**" in (text or ""):
        found.append(BOLD)
    if _NUMBERED_LINE.search(text or ""):
        found.append(NUMBERED_LIST)
    if len(sentences(text)) < STUDENT_MIN_SENTENCES:
        found.append(MISSING_STEPS)
    return found


def teacher_violations(text: str, problem: Problem) -> list[str]:
    """What breaks the teacher's preference. Specific: the comment quotes every number the problem gives.
    Friendly: talked through in prose (no **bold** labels, no numbered form) with a conversational marker."""
    found = []
    if not set(problem.numbers) <= numbers_in(text):
        found.append(VAGUE)
    if "**" in (text or "") or _NUMBERED_LINE.search(text or "") or not _FRIENDLY.search(text or ""):
        found.append(UNFRIENDLY)
    return found


# --- personas ---------------------------------------------------------------------------------------------

ViolationFn = Callable[[str, Problem], list[str]]


@dataclass(frozen=True)
class Persona:
    name: str
    preference: str  # what the user wants, in their words
    measures: str  # what the code score counts; on the tiny model it is narrower than the preference
    violations: ViolationFn
    # Violation code -> what a person says when they see it. "{topic}" and "{question}" are filled in; each
    # template names the problem so that no two corrections are the same text (review's near-duplicate guard
    # holds a user's third identical feedback as spam, rightly).
    corrections: Mapping[str, tuple[str, ...]]

    def complies(self, text: str, problem: Problem) -> bool:
        return not self.violations(text, problem)


STUDENT = Persona(
    name="student",
    preference="Homework answers that do not look AI-written: no bold, no numbered lists, all steps kept.",
    measures=("fraction of held-out replies with no '**', no line starting with a list number ('1.' or '2)') "
              f"and at least {STUDENT_MIN_SENTENCES} sentences"),
    violations=student_violations,
    corrections={
        BOLD: ("Please don't use bold for {topic}, it has to look like I wrote it myself. {question}",
               "No bold please, my teacher can tell it is not mine. Can you do {topic} in plain text? "
               "{question}",
               "Please do not use bold text for {topic}. {question}"),
        NUMBERED_LIST: ("No numbered lists please, write the steps for {topic} as normal sentences. "
                        "{question}",
                        "Please don't number the steps of {topic}, just write them out in sentences. "
                        "{question}"),
        MISSING_STEPS: ("You forgot the steps, my teacher wants every step for {topic}. {question}",
                        "You skipped steps, I need all of them written out for {topic}. {question}"),
    },
)

TEACHER = Persona(
    name="teacher",
    preference="Specific, friendly comments: point at the exact numbers of the problem and talk the pupil "
               "through it kindly.",
    measures=("fraction of held-out replies that quote every number the question gives (specific) and "
              "read as friendly prose: no '**' labels, no numbered form, and a conversational marker (we, "
              "you, let's, then, so, glad, great, good luck, well done). On the tiny model 'friendly' is its "
              "conversational style, not warmth it cannot write; 'specific' is the question's numbers, not a "
              "correct result, which it rarely gets"),
    violations=teacher_violations,
    corrections={
        VAGUE: ("That's too vague, point at the exact numbers of {topic}. {question}",
                "Too vague: which numbers? Say them for {topic}. {question}"),
        UNFRIENDLY: ("Please don't answer like a form with bold labels, be friendlier and talk me through "
                     "{topic}. {question}",
                     "That is too curt, please be more friendly and explain {topic} in sentences. "
                     "{question}"),
    },
)

PERSONAS: dict[str, Persona] = {p.name: p for p in (STUDENT, TEACHER)}

# The adversarial group member wants the opposite of the group's shared (student) preference.
ADVERSARIAL_CORRECTIONS = (
    "Use more bold please, and number the steps for {topic}. {question}",
    "More bold please, I like headings and a numbered list for {topic}. {question}",
    "Can you put more bold in it and list the steps for {topic}? {question}",
)
THANKS = (
    "Thanks, that helps! Next question: {next}",
    "Thank you, that is clear. Next question: {next}",
    "Great, thank you. Next one: {next}",
)
CLOSING_THANKS = ("Thanks, that helps with {topic}!", "Thank you, that is what I needed for {topic}.",
                  "Great, thank you for {topic}.")


# --- judge rules the scripted users' words need --------------------------------------------------------

# The rule judge's built-in rules already catch "please don't", "you forgot", thanks and "next question";
# these add the personas' other phrasings and a hint for each (the hindsight OPD distils). Set per tenant
# through the judge-rules API. The adversary's rule is deliberately "more bold", never "use bold", which
# would also match the student's "don't use bold" and give honest corrections the adversary's hint.
JUDGE_RULES: dict = {
    "negative_patterns": [
        {"name": "no bold", "pattern": r"\bno\s+bold\b|\bnot\s+use\s+bold\b"},
        {"name": "no numbered lists", "pattern": r"\bno\s+numbered\s+lists?\b|\bdon['’]?t\s+number\b"},
        {"name": "skipped steps", "pattern": r"\byou\s+skipped\b"},
        {"name": "too vague", "pattern": r"\btoo\s+vague\b"},
        {"name": "too curt",
         "pattern": r"\btoo\s+curt\b|\bbe\s+(?:more\s+)?friendlier\b|\bmore\s+friendly\b"},
        {"name": "more bold", "pattern": r"\bmore\s+bold\b"},
    ],
    "positive_patterns": [],
    "hint_templates": {
        "no bold": 'Write plain sentences without bold text. The user said: "{feedback}"',
        "no numbered lists": 'Write the steps as connected sentences, not a numbered list. The user said: '
                             '"{feedback}"',
        "skipped steps": 'Write out every step in full sentences. The user said: "{feedback}"',
        "too vague": 'Quote the exact numbers of the problem. The user said: "{feedback}"',
        "too curt": 'Talk the reader through it in friendly sentences. The user said: "{feedback}"',
        "more bold": 'Use bold headings and a numbered list. The user said: "{feedback}"',
    },
    "extend_defaults": True,
}


# --- scripted users ---------------------------------------------------------------------------------------

THANKS_KIND, CORRECTION_KIND, ADVERSARIAL_KIND = "thanks", "correction", "adversarial"


@dataclass(frozen=True)
class Reaction:
    text: str  # the user's next message: the next state of the reply it reacts to
    complied: bool  # whether the reply met the persona's preference (scored by code)
    kind: str  # "thanks", "correction" or "adversarial"
    problem: Problem | None  # what the next reply is about (None: the session ends)
    noisy: bool = False  # the opposite of what the reply deserved (the user's noise)


@dataclass
class ScriptedUser:
    """A person with a fixed preference. ``adversarial``: sends corrections asking for the opposite when the
    preference is kept, and thanks when it is broken (a member trying to steer a shared adapter)."""

    persona: Persona
    rng: random.Random
    problems: Sequence[Problem] = field(default_factory=training_problems)
    adversarial: bool = False
    noise: float = 0.0  # share of reactions that are the opposite of what the reply deserved
    _order: list[int] = field(default_factory=list, init=False, repr=False)

    def next_problem(self) -> Problem:
        # Each user walks the whole training bank in its own shuffled order before repeating a problem.
        if not self._order:
            self._order = list(range(len(self.problems)))
            self.rng.shuffle(self._order)
        return self.problems[self._order.pop()]

    def open_session(self) -> tuple[str, Problem]:
        problem = self.next_problem()
        return opening(problem, self.rng), problem

    def react(self, reply: str, problem: Problem, *, last: bool = False) -> Reaction:
        """The user's answer to ``reply`` (about ``problem``). ``last``: the closing message of a session; it
        still carries the feedback, but asks nothing new."""
        complied = self.persona.complies(reply, problem)
        violations = self.persona.violations(reply, problem)
        pleased = complied != self.adversarial  # honest and kept, or adversarial and broken
        noisy = self.noise > 0 and self.rng.random() < self.noise
        if noisy:  # an inconsistent user: thanks for a bad reply, or a correction of a good one
            pleased = not pleased
            if not pleased and not self.adversarial and not violations:
                violations = [self.rng.choice(sorted(self.persona.corrections))]
        if pleased:
            if last:
                text = self.rng.choice(CLOSING_THANKS).format(topic=problem.topic)
                return Reaction(text, complied, THANKS_KIND, None, noisy)
            following = self.next_problem()
            text = self.rng.choice(THANKS).format(next=opening(following, self.rng))
            return Reaction(text, complied, THANKS_KIND, following, noisy)
        if self.adversarial:
            template, kind = self.rng.choice(ADVERSARIAL_CORRECTIONS), ADVERSARIAL_KIND
        else:
            template, kind = self.rng.choice(self.persona.corrections[violations[0]]), CORRECTION_KIND
        text = template.format(topic=problem.topic, question="" if last else problem.question).strip()
        return Reaction(text, complied, kind, None if last else problem, noisy)


def compliance(persona: Persona, replies: Sequence[tuple[str, Problem]]) -> float:
    """The fraction of (reply, problem) pairs that meet the persona's preference."""
    if not replies:
        return 0.0
    return sum(persona.complies(text, problem) for text, problem in replies) / len(replies)
