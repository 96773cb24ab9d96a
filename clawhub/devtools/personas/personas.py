"""Personas of the benchmark: a preference that goes against the real model's habit, a rubric written as code
that scores it, and a simulated user who reacts in natural language. Plain Python: no Django, no HTTP;
``driver`` puts these users in front of a running stack.

The benchmark is built so that it cannot pass by construction:

- **Against the habit.** SmolLM2-135M-Instruct answers "Tell me about X." in four to five sentences, often
  with markdown lists and bold, and never asks anything back. Each persona wants the opposite of one of those.
- **Reward is not the score.** The rubric (``Persona.complies``) scores held-out replies; the simulated user
  reacts to what it *perceives* (``Persona.pleases``): a reader's sense of "too long" is a word count, not a
  sentence count; a reader notices a list, not one stray dash. The two agree on most replies, not all, and
  the user adds its own noise. The judge sees only the user's words, never the rubric.
- **Phrasings split.** Each reaction comes from a pool split into training phrasings (what the benchmark's
  users say, and what its judge rules were written against) and held-out phrasings (never said in a run;
  used to measure how the judges do on words they were not written for).
- **Topics split.** Held-out prompts are on topics no training session asks about; they are sampled at the
  served temperature, several times each.
- **A capability guard.** Short factual questions the base model answers; accuracy per version shows whether
  the model stayed useful (a model that only ever writes one short sentence would "win" otherwise).
- **No contamination.** None of these prompts, reactions or hints appear in any corpus a model of this
  project was trained on (tests/personas/test_contamination.py).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# --- prompts -----------------------------------------------------------------------------------------------

TRAINING_TOPICS = (
    "photosynthesis", "the water cycle", "compound interest", "inflation", "the greenhouse effect",
    "plate tectonics", "the immune system", "gravity", "static electricity", "magnets",
    "the French Revolution",
    "the Roman Empire", "the printing press", "supply and demand", "a household budget", "credit scores",
    "sleep", "stretching", "meditation", "composting", "recycling", "solar panels", "wind turbines",
    "volcanoes", "earthquakes", "the phases of the moon", "black holes", "the speed of light", "DNA",
    "evolution", "bacteria", "the common cold", "the heart", "the lungs", "digestion", "vitamin C", "coffee",
    "green tea", "sourdough bread", "fermentation", "writing a resume", "job interviews", "public speaking",
    "time management", "password managers", "the internet", "email", "spreadsheets", "databases",
    "operating systems", "machine learning", "computer viruses", "batteries", "thermometers", "rainbows",
    "ocean tides", "glaciers", "deserts", "rainforests", "coral reefs", "bees", "bird migration",
    "the Olympic Games", "chess",
)
# Asked only when measuring: no training session is about any of these.
HELD_OUT_TOPICS = (
    "the stock market", "nuclear power", "the pyramids of Giza", "antibiotics", "cloud computing",
    "the Renaissance", "hurricanes", "the human brain", "democracy", "mortgages", "electric cars", "honey",
    "yoga", "the Milky Way", "cheese making", "the violin",
)
OPENINGS = ("Tell me about {topic}.", "Can you explain {topic}?", "What should I know about {topic}?",
            "I'm curious about {topic}. What is it?", "Give me an overview of {topic}.")
HELD_OUT_PROMPT = "Tell me about {topic}."
# How often each held-out prompt is sampled when measuring, at the served temperature.
EVAL_SAMPLES = 2
# The simulated users' noise: this share of reactions is the opposite of what the user perceived.
NOISE_RATE = 0.1


@dataclass(frozen=True)
class Prompt:
    """What a user asks about: the question and its topic (feedback names the topic, so no two reactions about
    different topics are the same text)."""

    question: str
    topic: str


def held_out_prompts() -> tuple[Prompt, ...]:
    return tuple(Prompt(HELD_OUT_PROMPT.format(topic=t), t) for t in HELD_OUT_TOPICS)


def held_out_messages(prompt: Prompt, system: str | None = None) -> list[dict[str, str]]:
    """The measurement prompt: the bare question (with ``system``: the prompt-only baseline)."""
    return [*([{"role": "system", "content": system}] if system else []),
            {"role": "user", "content": prompt.question}]


# --- rubrics: what the score counts ----------------------------------------------------------------------

_SENTENCE = re.compile(r"[^.!?\n]*\w[^.!?\n]*(?:[.!?]+|$)", re.MULTILINE)
_LIST_LINE = re.compile(r"(?m)^\s*(?:[-*•+]|\d+[.)])\s+\S")
_HEADING = re.compile(r"(?m)^\s*#{1,6}\s")
_WORD = re.compile(r"\w+")
MIN_WORDS = 5  # an answer, not a shrug: saying nothing must not comply with "be brief"
BRIEF_MAX_SENTENCES = 2
# The brief user's sense of "too long" (a word count; the rubric counts sentences).
BRIEF_FEELS_LONG_WORDS = 45
# The plain user notices a list once it has this many lines (the rubric refuses one).
PLAIN_NOTICES_LIST_LINES = 2
# The asks-back user notices a question mark near the end (the rubric wants the last sentence a question).
ASKS_BACK_TAIL_CHARS = 80


def sentences(text: str) -> list[str]:
    """Sentences with at least one word character; a line break ends one (a list item is a sentence)."""
    return [s.strip() for s in _SENTENCE.findall(text or "") if s.strip()]


def words(text: str) -> int:
    return len(_WORD.findall(text or ""))


def is_answer(text: str) -> bool:
    return words(text) >= MIN_WORDS


_NOT_TOPIC = {"the", "of", "a", "an", "and"}


def mentions_topic(text: str, topic: str) -> bool:
    """Whether a reply names its question's topic (one of the topic's words, singular or plural). A reply
    that does not is taken for an evasion ("What can I assist you with today?"): it complies with no
    persona, and the simulated users complain about it (a short non-answer must not pass for "brief",
    "plain" or "asks back")."""
    found = {w.lower().removesuffix("s") for w in _WORD.findall(text or "")}
    return any(w.lower().removesuffix("s") in found for w in topic.split() if w.lower() not in _NOT_TOPIC)


def brief_complies(text: str) -> bool:
    return is_answer(text) and len(sentences(text)) <= BRIEF_MAX_SENTENCES


def brief_pleases(text: str) -> bool:
    return is_answer(text) and words(text) <= BRIEF_FEELS_LONG_WORDS


def plain_complies(text: str) -> bool:
    return (is_answer(text) and "**" not in text and "__" not in text and not _LIST_LINE.search(text)
            and not _HEADING.search(text))


def plain_pleases(text: str) -> bool:
    return is_answer(text) and "**" not in text and len(_LIST_LINE.findall(text)) < PLAIN_NOTICES_LIST_LINES


def asks_back_complies(text: str) -> bool:
    found = sentences(text)
    return is_answer(text) and bool(found) and found[-1].rstrip("\"')*_ ").endswith("?")


def asks_back_pleases(text: str) -> bool:
    return is_answer(text) and "?" in (text or "").rstrip()[-ASKS_BACK_TAIL_CHARS:]


# --- reactions --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pool:
    """Phrasings of one kind of reaction: those the benchmark's users say and those kept out of every run."""

    training: tuple[str, ...]
    held_out: tuple[str, ...]

    def pick(self, rng: random.Random, phrasings: str, avoid: str = "") -> str:
        """One phrasing, not ``avoid`` where the pool has another (people rephrase a repeated complaint)."""
        pool = self.training if phrasings == "training" else self.held_out
        return rng.choice([t for t in pool if t != avoid] or pool)


THANKS = Pool(
    training=("Thanks, that helps. {next}", "Great, thank you! {next}",
              "Perfect, that's what I needed. {next}", "Thank you, that works for me. {next}"),
    held_out=("Nice, got it. {next}", "Cool, appreciated. {next}", "Good stuff. {next}"),
)
CLOSING_THANKS = Pool(
    training=("Thanks, that's all I needed on {topic}.", "Great, thank you for explaining {topic}!"),
    held_out=("Got it, that settles {topic}.", "Nice, {topic} makes sense now."),
)


@dataclass(frozen=True)
class Persona:
    name: str
    preference: str  # what the user wants, in their words: the prompt-only baseline's system prompt
    measures: str  # what the rubric counts
    complies: Callable[[str], bool]  # the rubric: scores held-out replies
    pleases: Callable[[str], bool]  # what the user perceives: decides the reaction
    complaints: Pool  # "{topic}" is filled in


BRIEF = Persona(
    name="brief",
    preference="Answer in at most two sentences.",
    measures=f"held-out replies of 1-{BRIEF_MAX_SENTENCES} sentences and at least {MIN_WORDS} words",
    complies=brief_complies,
    pleases=brief_pleases,
    complaints=Pool(
        training=("That's too long. I only need a sentence or two about {topic}.",
                  "Too much text about {topic}, keep it short please.",
                  "Can you make it shorter? Two sentences about {topic} is plenty.",
                  "That's more than I wanted to read. Just the short version of {topic}."),
        held_out=("Way too wordy. Give me {topic} in a nutshell.",
                  "Trim it down, I just want the gist of {topic}.",
                  "Less detail on {topic}, a quick answer does it."),
    ),
)
PLAIN = Persona(
    name="plain",
    preference="Write plain prose: no markdown, no bold, no headings, no bullet or numbered lists.",
    measures=f"held-out replies of at least {MIN_WORDS} words with no '**', '__', heading or list line",
    complies=plain_complies,
    pleases=plain_pleases,
    complaints=Pool(
        training=("No lists please, I want {topic} in plain paragraphs.",
                  "Drop the formatting for {topic}: no bold, no bullet points, just prose.",
                  "Bullet points again? Write {topic} out as normal sentences."),
        held_out=("All those asterisks and dashes make {topic} hard to read. Plain text.",
                  "Write {topic} like a person would, without markdown."),
    ),
)
ASKS_BACK = Persona(
    name="asks-back",
    preference="End every answer with a question back to me.",
    measures=f"held-out replies of at least {MIN_WORDS} words whose last sentence is a question",
    complies=asks_back_complies,
    pleases=asks_back_pleases,
    complaints=Pool(
        training=("You didn't ask me anything about {topic}. End with a question for me next time.",
                  "I'd like you to check in with me: finish with a question about {topic}.",
                  "Please end with a question back to me about {topic}."),
        held_out=("Make {topic} a conversation, turn it back to me at the end.",
                  "What do you want to know from me about {topic}? Ask it at the end."),
    ),
)
PERSONAS: dict[str, Persona] = {p.name: p for p in (BRIEF, PLAIN, ASKS_BACK)}
PRIMARY = BRIEF
# The adversarial group member wants the opposite of the primary persona.
ADVERSARIAL_COMPLAINTS = Pool(
    training=("Too short, tell me much more about {topic}.", "I want a longer, detailed answer on {topic}."),
    held_out=("That's thin. Go deeper into {topic}.",),
)
# Every user, about a reply that does not name what they asked about.
EVASION_COMPLAINTS = Pool(
    training=("You didn't answer my question about {topic}.",
              "That has nothing to do with {topic}. Please answer what I asked."),
    held_out=("Hm, and {topic}? You skipped it.", "Stay on {topic}, that's what I asked about."),
)


# --- the judge rules the benchmark's tenants use --------------------------------------------------------

# Written against the training phrasings only, as a user setting up their judge would (the built-in rules
# already catch "thanks", "perfect", "please don't"). Hints say what the user asked for, in the judge's words.
JUDGE_RULES: dict = {
    "negative_patterns": [
        {"name": "too long", "pattern": r"\btoo\s+(?:long|much\s+text)\b|\bmore\s+than\s+I\s+wanted\b"
                                        r"|\bmake\s+it\s+shorter\b"},
        {"name": "formatting", "pattern": r"\bno\s+lists\b|\bbullet\s+points\b|\bdrop\s+the\s+formatting\b"},
        {"name": "ask back", "pattern": r"\b(?:end|finish)\s+with\s+a\s+question\b"
                                        r"|\bdidn['’]?t\s+ask\s+me\b"},
        {"name": "longer", "pattern": r"\btoo\s+short\b|\blonger,?\s+detailed\b"},
        {"name": "evasion", "pattern": r"\bdidn['’]?t\s+answer\b|\bnothing\s+to\s+do\s+with\b"},
    ],
    "positive_patterns": [],
    "hint_templates": {
        "too long": 'The user wants a shorter answer. They said: "{feedback}"',
        "formatting": 'The user wants plain sentences without markdown. They said: "{feedback}"',
        "ask back": 'The user wants the answer to end by asking them a question. They said: "{feedback}"',
        "longer": 'The user wants a longer, more detailed answer. They said: "{feedback}"',
        "evasion": 'The user wants their question answered. They said: "{feedback}"',
    },
    "extend_defaults": True,
}


# --- simulated users -----------------------------------------------------------------------------------

THANKS_KIND, CORRECTION_KIND, ADVERSARIAL_KIND = "thanks", "correction", "adversarial"


@dataclass(frozen=True)
class Reaction:
    text: str  # the user's next message: the next state of the reply it reacts to
    pleased: bool  # what the user meant: the truth a judge is measured against
    complied: bool  # what the rubric says of the reply
    kind: str  # "thanks", "correction" or "adversarial"
    prompt: Prompt | None  # what the next reply is about (None: the session ends)
    noisy: bool = False  # the opposite of what the user perceived


@dataclass
class ScriptedUser:
    """A person with a fixed preference. ``adversarial``: complains when the reply pleases the persona and
    thanks when it does not (a member trying to steer a shared adapter). ``phrasings``: which half of each
    pool the user speaks from."""

    persona: Persona
    rng: random.Random
    topics: Sequence[str] = TRAINING_TOPICS
    adversarial: bool = False
    noise: float = 0.0
    phrasings: str = "training"
    _order: list[int] = field(default_factory=list, init=False, repr=False)
    _last_complaint: str = field(default="", init=False, repr=False)
    _opening: Prompt | None = field(default=None, init=False, repr=False)

    def next_prompt(self) -> Prompt:
        # Each user walks every training topic in its own shuffled order before repeating one.
        if not self._order:
            self._order = list(range(len(self.topics)))
            self.rng.shuffle(self._order)
        topic = self.topics[self._order.pop()]
        return Prompt(self.rng.choice(OPENINGS).format(topic=topic), topic)

    def fork(self) -> ScriptedUser:
        """The same person for one session run beside others: its opening is this user's next topic, its
        own random state drawn from this one's (the forks of a seed are the same whatever order they run)."""
        child = ScriptedUser(persona=self.persona, rng=random.Random(self.rng.getrandbits(64)),
                             topics=self.topics, adversarial=self.adversarial, noise=self.noise,
                             phrasings=self.phrasings)
        child._opening = self.next_prompt()
        return child

    def open_session(self) -> tuple[str, Prompt]:
        if self._opening is not None:
            prompt, self._opening = self._opening, None
            return prompt.question, prompt
        prompt = self.next_prompt()
        return prompt.question, prompt

    def react(self, reply: str, prompt: Prompt, *, last: bool = False) -> Reaction:
        """The user's answer to ``reply`` (about ``prompt``). ``last``: the session's closing message; it
        still carries the feedback but asks nothing new."""
        complied = complies(self.persona, reply, prompt.topic)
        # Anyone notices an answer about something else; what the persona notices only in one on topic.
        on_topic = mentions_topic(reply, prompt.topic)
        pleased = on_topic and self.persona.pleases(reply) != self.adversarial
        noisy = self.noise > 0 and self.rng.random() < self.noise
        if noisy:
            pleased = not pleased
        if pleased:
            if last:
                text = CLOSING_THANKS.pick(self.rng, self.phrasings).format(topic=prompt.topic)
                return Reaction(text, True, complied, THANKS_KIND, None, noisy)
            following = self.next_prompt()
            text = THANKS.pick(self.rng, self.phrasings).format(next=following.question)
            return Reaction(text, True, complied, THANKS_KIND, following, noisy)
        pool, kind = ((EVASION_COMPLAINTS, CORRECTION_KIND) if not on_topic and not noisy
                      else (ADVERSARIAL_COMPLAINTS, ADVERSARIAL_KIND) if self.adversarial
                      else (self.persona.complaints, CORRECTION_KIND))
        template = self._last_complaint = pool.pick(self.rng, self.phrasings, avoid=self._last_complaint)
        text = template.format(topic=prompt.topic)
        return Reaction(text, False, complied, kind, None if last else prompt, noisy)


def complies(persona: Persona, reply: str, topic: str) -> bool:
    """The held-out score of one finished reply: the persona's rubric, on a reply that names its topic."""
    return persona.complies(reply) and mentions_topic(reply, topic)


def reaction_phrasings() -> dict[str, Pool]:
    """Every pool of the benchmark by name (the contamination check and the judge agreement walk them)."""
    pools = {"thanks": THANKS, "closing thanks": CLOSING_THANKS, "adversarial": ADVERSARIAL_COMPLAINTS,
             "evasion": EVASION_COMPLAINTS}
    pools.update({f"{p.name} complaints": p.complaints for p in PERSONAS.values()})
    return pools
