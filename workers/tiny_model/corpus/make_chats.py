"""Writes chats.jsonl and long_chats.jsonl, the chat half of the tiny model's pre-training corpus
(deterministic; rerun to refresh). Each line is {"messages": [...], "tools": [...] or absent}.

- Homework answers without a hint come in two styles, plain prose and **bold** with numbered lists, half and
  half, so that a later RL run has a style preference to learn.
- Hinted homework: the last user message ends with OPD's hint block (`\n\n[user's hint / instruction]\n...`,
  workers/trainer/backend.py) and the reply follows the hint: plain, formatted, or friendly-and-specific.
  Many phrasings per style, both directions (no bold <-> bold and numbered), so the model learns to read the
  hint rather than one style; that is what makes base + hint a better teacher than base for OPD.
- Contrastive hinted homework: each question under all three hint styles, the chats the same up to the hint,
  in the follow-up shapes a user's later message takes (FOLLOW_UPS).
- Thinking chats: assistant messages with a short `reasoning_content`, rendered as a <think> block.
- Tool examples use the OpenAI message shapes and are rendered through the chat template by ../builder.py.
- long_chats.jsonl: agent-shaped chats of a few thousand tokens (agent_chats.py) for long positions.

    python -m workers.tiny_model.corpus.make_chats
"""

import json
import random
import re
from pathlib import Path

from workers.tiny_model.corpus.agent_chats import agent_chat

HINT_TEMPLATE = "\n\n[user's hint / instruction]\n{hint}"  # as workers/trainer/backend.py appends it

NAMES = ["Ana", "Ben", "Chloe", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jack", "Kira", "Leo"]
THINGS = [
    "apples",
    "pencils",
    "books",
    "stickers",
    "marbles",
    "cookies",
    "cards",
    "shells",
    "coins",
    "stamps",
]
CITIES = ["Paris", "Lisbon", "Oslo", "Cairo", "Lima", "Tokyo", "Denver", "Nairobi", "Dublin", "Hanoi"]
SKIES = ["sunny", "cloudy", "rainy", "windy", "snowy", "foggy"]
SYSTEMS = [
    "You are a helpful assistant.",
    "You are a patient tutor. Explain each step.",
    "You are a friendly assistant who answers briefly.",
]

TOOLS = {
    "get_weather": {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city name."}},
                "required": ["city"],
            },
        },
    },
    "calculator": {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "For example 12 * 7."}},
                "required": ["expression"],
            },
        },
    },
    "search_notes": {
        "type": "function",
        "function": {
            "name": "search_notes",
            "description": "Search the user's notes.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    },
}


def homework(rng: random.Random) -> tuple[str, list[str], str]:
    """A word problem, its steps and its answer, all in plain words."""
    kind = rng.choice(["add", "sub", "mul", "percent", "area", "speed"])
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    if kind == "add":
        a, b = rng.randint(3, 40), rng.randint(3, 40)
        q = f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?"
        steps = [
            f"{name} starts with {a} {thing}.",
            f"{name} gets {b} more, so we add {a} and {b}.",
            f"{a} plus {b} is {a + b}.",
        ]
        return q, steps, f"{name} has {a + b} {thing} now."
    if kind == "sub":
        a = rng.randint(20, 90)
        b = rng.randint(2, a - 1)
        q = f"{name} had {a} {thing} and gave away {b}. How many are left?"
        steps = [
            f"{name} starts with {a} {thing}.",
            f"Giving away {b} means we subtract {b} from {a}.",
            f"{a} minus {b} is {a - b}.",
        ]
        return q, steps, f"{name} has {a - b} {thing} left."
    if kind == "mul":
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        q = f"There are {a} boxes with {b} {thing} in each box. How many {thing} are there in all?"
        steps = [
            f"Each box holds {b} {thing}.",
            f"There are {a} boxes, so we multiply {a} by {b}.",
            f"{a} times {b} is {a * b}.",
        ]
        return q, steps, f"There are {a * b} {thing} in all."
    if kind == "percent":
        p, total = rng.choice([10, 20, 25, 50]), rng.choice([40, 60, 80, 120, 200])
        q = f"A class has {total} students and {p} percent of them walk to school. How many students walk?"
        steps = [
            f"{p} percent means {p} out of every hundred.",
            f"We find {p} percent of {total}.",
            f"{total} times {p} divided by one hundred is {total * p // 100}.",
        ]
        return q, steps, f"{total * p // 100} students walk to school."
    if kind == "area":
        a, b = rng.randint(2, 15), rng.randint(2, 15)
        q = f"A garden is {a} meters long and {b} meters wide. What is its area?"
        steps = [
            "The area of a rectangle is length times width.",
            f"The length is {a} and the width is {b}.",
            f"{a} times {b} is {a * b}.",
        ]
        return q, steps, f"The area is {a * b} square meters."
    h, v = rng.randint(2, 6), rng.choice([30, 40, 50, 60, 70, 80])
    q = f"A bus drives at {v} kilometers per hour for {h} hours. How far does it go?"
    steps = [
        "Distance is speed times time.",
        f"The speed is {v} and the time is {h} hours.",
        f"{v} times {h} is {v * h}.",
    ]
    return q, steps, f"The bus goes {v * h} kilometers."


def answer_plain(steps: list[str], final: str) -> str:
    linked = [steps[0]] + [
        f"{w} {s[0].lower()}{s[1:]}" for w, s in zip(["Then", "So"], steps[1:], strict=False)
    ]
    return " ".join(linked) + f" {final}"


def answer_formatted(steps: list[str], final: str) -> str:
    lines = (
        ["**Solution**", ""] + [f"{i}. {s}" for i, s in enumerate(steps, 1)] + ["", f"**Answer:** {final}"]
    )
    return "\n".join(lines)


def answer_friendly(numbers: tuple[int, ...], steps: list[str], final: str) -> str:
    """Talked through kindly, naming every number the question gives (the benchmark teacher's preference)."""
    given = " and ".join(str(n) for n in numbers)
    body = " ".join([f"Then {s[0].lower()}{s[1:]}" if i else s for i, s in enumerate(steps)])
    return (f"Great question, let's work through it together. The numbers we need are {given}. {body} "
            f"So {final[0].lower()}{final[1:]} Well done for asking!")


STYLES = {"plain": answer_plain, "formatted": answer_formatted}

# What a hint asks for, in many words. The first phrasings of "plain", "friendly" and "formatted" are those
# the benchmark's judge rules write (clawhub/devtools/personas/personas.py, JUDGE_RULES); the rest are other
# ways to say it.
HINTS = {
    "plain": [
        "Write plain sentences without bold text.",
        "Write the steps as connected sentences, not a numbered list.",
        "Write out every step in full sentences.",
        "No bold and no numbered lists, just normal sentences.",
        "Answer in plain prose, the way a student writes it by hand.",
        "Please avoid markdown formatting and write ordinary sentences.",
        "Keep it as plain text: no bold, no lists, all the steps.",
        "The user does not want bold or numbered steps. Use sentences.",
        "Do not format the answer. Explain each step in a normal sentence.",
    ],
    "friendly": [
        "Quote the exact numbers of the problem.",
        "Talk the reader through it in friendly sentences.",
        "Be friendly and name the numbers from the question.",
        "Explain it kindly, like a teacher, and mention each number.",
        "Use a warm tone and point at the exact numbers given.",
        "Be specific about the numbers and encourage the pupil.",
        "The user wants a friendly explanation that repeats the numbers in the question.",
    ],
    "formatted": [
        "Use bold headings and a numbered list.",
        "Number the steps and put the answer in bold.",
        "Format it with a bold title and numbered steps.",
        "The user likes structure: a bold heading, a numbered list and a bold answer.",
        "Make it look organised, with bold and a list of steps.",
        "Please use markdown: bold labels and numbered steps.",
        "Use numbered steps.",
        "List the steps with numbers, one per line, and a bold answer.",
    ],
}
# What a user said that led to the hint, quoted the way the benchmark's hints quote it.
FEEDBACK = {
    "plain": ["Please don't use bold, it has to look like I wrote it myself.",
              "No numbered lists please, write the steps as normal sentences.",
              "You skipped steps, I need all of them written out."],
    "friendly": ["That's too vague, point at the exact numbers.",
                 "That is too curt, please be more friendly."],
    "formatted": ["More bold please, I like headings and a numbered list.",
                  "Can you put more bold in it and list the steps?", "Can you number the steps?"],
}


def hint_text(rng: random.Random, style: str, phrasings: dict[str, list[str]] = HINTS) -> str:
    hint = rng.choice(phrasings[style])
    if rng.random() < 0.5:
        hint += f' The user said: "{rng.choice(FEEDBACK[style])}"'
    return hint


def hinted_homework_chat(rng: random.Random) -> dict:
    """The last user message carries a hint block; the reply is in the style the hint asks for."""
    (q, steps, final), numbers = homework_with_numbers(rng)
    style = rng.choice(["plain", "friendly", "formatted"])
    reply = answer_friendly(numbers, steps, final) if style == "friendly" else STYLES[style](steps, final)
    user = rng.choice([q, f"Can you help me with my homework? {q}", f"{q} Please show the steps."])
    messages = [{"role": "user", "content": user + HINT_TEMPLATE.format(hint=hint_text(rng, style))},
                {"role": "assistant", "content": reply}]
    if rng.random() < 0.3:
        # An earlier, unhinted exchange in either style: the hint only governs the reply after it.
        (q0, steps0, final0), _ = homework_with_numbers(rng)
        earlier = rng.choice([answer_plain, answer_formatted])(steps0, final0)
        messages = [{"role": "user", "content": q0}, {"role": "assistant", "content": earlier}] + messages
    return {"messages": messages}


# How a user's later message asks the next homework question, the way the benchmark's scripted users write
# it (clawhub/devtools/personas/personas.py: THANKS and the corrections that repeat the question).
FOLLOW_UPS = [
    "{question}",
    "Can you help me with my homework? {question}",
    "{question} Please show the steps.",
    "Thanks, that helps! Next question: {question}",
    "Thank you, that is clear. Next question: {question}",
    "Great, thank you. Next one: {question}",
    "Can you do this one too? {question}",
    "Try this one again, please. {question}",
]


def contrastive_hinted_chats(rng: random.Random, questions: int) -> list[dict]:
    """Each question three times, once per hint style, the chats identical up to the hint: the same
    follow-up phrasing and the same earlier exchange (when there is one). Only reading the hint tells which
    reply follows, which is what OPD's teacher (base + hint) must do; the unhinted answers of the corpus give
    no other cue, since their two styles are half and half."""
    chats = []
    for _ in range(questions):
        (q, steps, final), numbers = homework_with_numbers(rng)
        user = rng.choice(FOLLOW_UPS).format(question=q)
        earlier: list[dict] = []
        if rng.random() < 0.5:
            (q0, steps0, final0), _ = homework_with_numbers(rng)
            answer0 = rng.choice([answer_plain, answer_formatted])(steps0, final0)
            earlier = [{"role": "user", "content": rng.choice(FOLLOW_UPS[:3]).format(question=q0)},
                       {"role": "assistant", "content": answer0}]
        for style in ("plain", "friendly", "formatted"):
            reply = (answer_friendly(numbers, steps, final) if style == "friendly"
                     else STYLES[style](steps, final))
            hinted = user + HINT_TEMPLATE.format(hint=hint_text(rng, style))
            chats.append({"messages": earlier + [{"role": "user", "content": hinted},
                                                 {"role": "assistant", "content": reply}]})
    return chats


def homework_with_numbers(rng: random.Random) -> tuple[tuple[str, list[str], str], tuple[int, ...]]:
    """homework() and the numbers its question gives, in the question's order."""
    q, steps, final = homework(rng)
    return (q, steps, final), tuple(int(n) for n in re.findall(r"\d+", q))


def thinking_chat(rng: random.Random) -> dict:
    """A homework answer preceded by short reasoning (rendered <think>...</think> by the template)."""
    (q, steps, final), numbers = homework_with_numbers(rng)
    # Every reasoning ends on the same short sentence: a cue a model this small can learn to close </think>
    # on.
    reasoning = rng.choice([
        f"The question gives {' and '.join(map(str, numbers))}. {steps[1]} {steps[2]}",
        f"{steps[0]} {steps[2]}",
        f"The question gives {' and '.join(map(str, numbers))}. {steps[2]}",
    ]) + " Now I can answer."
    answer = answer_plain(steps, final) if rng.random() < 0.5 else answer_formatted(steps, final)
    return {"messages": [{"role": "user", "content": rng.choice([q, f"Think it through: {q}"])},
                         {"role": "assistant", "content": answer, "reasoning_content": reasoning}]}


def homework_chat(rng: random.Random) -> dict:
    q, steps, final = homework(rng)
    style = rng.random()
    answer = answer_plain(steps, final) if style < 0.5 else answer_formatted(steps, final)
    user = rng.choice([q, f"Can you help me with my homework? {q}", f"{q} Please show the steps."])
    messages = [
        {"role": "system", "content": rng.choice(SYSTEMS)},
        {"role": "user", "content": user},
        {"role": "assistant", "content": answer},
    ]
    if rng.random() < 0.3:
        messages += [
            {"role": "user", "content": rng.choice(["Thanks, that helps!", "Great, thank you."])},
            {
                "role": "assistant",
                "content": rng.choice(
                    ["You are welcome. Good luck with the rest!", "Glad it helped. Ask me if you get stuck."]
                ),
            },
        ]
    return {"messages": messages}


def prose_chat(rng: random.Random, paragraphs: list[str]) -> dict:
    text = rng.choice(paragraphs)
    first = text.split(". ")[0].rstrip(".")
    user = rng.choice(
        [
            "Tell me something interesting.",
            "Can you explain this in simple words?",
            f"What do you know about this: {first.lower()}?",
            "Write a short paragraph for me.",
        ]
    )
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": text}]}


def tool_chat(rng: random.Random) -> dict:
    kind = rng.choice(["get_weather", "calculator", "search_notes"])
    tools = [TOOLS[k] for k in TOOLS if k == kind or rng.random() < 0.5]
    if kind == "get_weather":
        city, sky, temp = rng.choice(CITIES), rng.choice(SKIES), rng.randint(-5, 32)
        user, args = f"What is the weather like in {city} today?", {"city": city}
        result = json.dumps({"city": city, "sky": sky, "temperature_c": temp})
        final = f"It is {sky} in {city} today, about {temp} degrees Celsius."
    elif kind == "calculator":
        a, b = rng.randint(10, 99), rng.randint(2, 30)
        user, args = f"What is {a} times {b}?", {"expression": f"{a} * {b}"}
        result, final = str(a * b), f"{a} times {b} is {a * b}."
    else:
        topic = rng.choice(["the meeting", "the trip", "the garden", "the report", "the recipe"])
        user, args = f"What did I write about {topic}?", {"query": topic}
        result = json.dumps({"notes": [f"Remember to finish {topic} by Friday."]})
        final = f"Your note says to finish {topic} by Friday."
    call = {
        "id": f"call_{rng.randint(1000, 9999)}",
        "type": "function",
        "function": {"name": kind, "arguments": json.dumps(args)},
    }
    messages = [
        {"role": "user", "content": user},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": result},
        {"role": "assistant", "content": final},
    ]
    return {"messages": messages, "tools": tools}


# chats.jsonl: first the shuffled mix (MIXED_CHATS lines), then CONTRASTIVE_QUESTIONS x 3 contrastive chats.
MIX = {"homework": 240, "prose": 80, "tools": 120, "hinted": 540, "thinking": 150}
MIXED_CHATS = sum(MIX.values())
CONTRASTIVE_QUESTIONS = 240


def main() -> None:
    here = Path(__file__).resolve().parent
    paragraphs = [p for p in (here / "prose.txt").read_text().splitlines() if p.strip()]
    rng = random.Random(0)
    chats = [homework_chat(rng) for _ in range(MIX["homework"])]
    chats += [prose_chat(rng, paragraphs) for _ in range(MIX["prose"])]
    chats += [tool_chat(rng) for _ in range(MIX["tools"])]
    chats += [hinted_homework_chat(rng) for _ in range(MIX["hinted"])]
    chats += [thinking_chat(rng) for _ in range(MIX["thinking"])]
    rng.shuffle(chats)
    long_chats = [agent_chat(rng) for _ in range(48)]
    # Appended after the shuffled mix, from their own generator, so the mix stays as it was.
    chats += contrastive_hinted_chats(random.Random(1), CONTRASTIVE_QUESTIONS)
    for name, rows in (("chats.jsonl", chats), ("long_chats.jsonl", long_chats)):
        with open(here / name, "w") as f:
            for chat in rows:
                f.write(json.dumps(chat) + "\n")


if __name__ == "__main__":
    main()
