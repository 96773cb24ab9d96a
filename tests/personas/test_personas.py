"""Personas: scores computed by code on hand-written replies, the scripted users' answers (and what the rule
judge makes of them with the benchmark's rules), and the fixed, disjoint prompt split."""

import random
from collections import Counter

import pytest

from clawhub.devtools.personas import personas as P
from clawhub.review.flags import normalise_text
from tests.personas.conftest import BOXES, FORMATTED, NUMBERED_ONLY, PLAIN, TOO_SHORT, judge_next_state

# --- scoring ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("reply", "violations"), [
    (PLAIN, []),
    (FORMATTED, [P.BOLD, P.NUMBERED_LIST]),
    (NUMBERED_ONLY, [P.NUMBERED_LIST]),
    ("It is **36**. Then we add. So that is all.", [P.BOLD]),
    ("Steps:\n 2) multiply 4 by 9. Then it is 36. So there are 36.", [P.NUMBERED_LIST]),
    (TOO_SHORT, [P.MISSING_STEPS]),
    ("", [P.MISSING_STEPS]),
])
def test_student_score_finds_each_broken_rule(reply, violations):
    assert P.student_violations(reply, BOXES) == violations
    assert P.STUDENT.complies(reply, BOXES) is (violations == [])


def test_student_counts_sentences_not_numbers_or_stray_markup():
    assert P.sentences("Each box holds 9. Then 4 times 9 is 36! So? ") == [
        "Each box holds 9.", "Then 4 times 9 is 36!", "So?"]
    assert P.sentences("... !!") == []
    # "12." in the middle of a sentence is a number, not a numbered list line.
    assert P.student_violations("Ben has 12. Then he gets 7. So he has 19 now.") == []


@pytest.mark.parametrize(("reply", "violations"), [
    (PLAIN, []),  # quotes 4 and 9, talks it through ("then", "so", "we")
    ("Let's see: 4 boxes of 9 make 36, well done.", []),
    (FORMATTED, [P.UNFRIENDLY]),  # specific, but a form with bold labels
    ("Each box holds 9 cookies. Then we count them all. So there are many.", [P.VAGUE]),  # 4 is missing
    ("4 boxes. 9 each. 36.", [P.UNFRIENDLY]),  # specific but curt: no conversational marker
    ("Good luck with it!", [P.VAGUE]),
    ("**Wrong**", [P.VAGUE, P.UNFRIENDLY]),
])
def test_teacher_score_needs_the_questions_numbers_and_a_friendly_tone(reply, violations):
    assert P.teacher_violations(reply, BOXES) == violations
    assert P.TEACHER.complies(reply, BOXES) is (violations == [])


def test_teacher_number_match_is_whole_numbers_only():
    assert P.numbers_in("14 and 19, v2, 3.5") == {14, 19}
    assert P.VAGUE in P.teacher_violations("Then we have 14 and 19 so 33.", BOXES)  # "14" is not "4"


def test_compliance_is_the_fraction_that_meets_the_preference():
    replies = [(PLAIN, BOXES), (FORMATTED, BOXES), (PLAIN, BOXES), (TOO_SHORT, BOXES)]
    assert P.compliance(P.STUDENT, replies) == 0.5
    assert P.compliance(P.STUDENT, []) == 0.0


# --- prompt bank --------------------------------------------------------------------------------------------


def test_the_held_out_split_is_fixed_and_disjoint():
    training, held_out = P.prompt_bank()
    assert (len(training), len(held_out)) == (P.TRAINING_SIZE, P.HELD_OUT_SIZE)
    questions = [p.question for p in (*training, *held_out)]
    assert len(set(questions)) == len(questions)  # no question twice, so none is in both halves
    # Fixed: rebuilt from scratch (not the cache) it is the same set, and these are its first two problems.
    P.prompt_bank.cache_clear()
    assert P.prompt_bank() == (training, held_out)
    assert held_out[0].question == "A garden is 11 meters long and 5 meters wide. What is its area?"
    assert (held_out[0].numbers, held_out[0].answer) == ((11, 5), 55)
    assert P.held_out_messages(held_out[0]) == [{"role": "user", "content": held_out[0].question}]


def template(question: str) -> str:
    """A question with its names, things and numbers taken out: what is left is its template."""
    import re

    words = [w for w in re.sub(r"\d+", "N", question).split() if w.strip("?.") not in (*P.NAMES, *P.THINGS)]
    return " ".join(words)


def test_held_out_questions_use_templates_that_no_training_session_asks():
    training, held_out = P.prompt_bank()
    held_templates = {template(p.question) for p in held_out}
    training_templates = {template(p.question) for p in training}
    assert held_templates and training_templates and not held_templates & training_templates
    # Every way a user opens a session wraps a training question: no held-out template gets in that way.
    rng = random.Random(0)
    assert all(template(p.question) in template(P.opening(p, rng)) for p in training[:20])


def test_problems_are_worded_like_the_tiny_models_corpus_and_carry_their_answers():
    rng = random.Random(3)
    for _ in range(200):
        problem = P.make_problem(rng)
        assert problem.question.endswith("?")
        assert all(str(n) in problem.question for n in problem.numbers)
        a, b = problem.numbers
        assert problem.answer in {a + b, a - b, a * b, a * b // 100}


# --- scripted users -----------------------------------------------------------------------------------------


def test_a_kept_preference_gets_thanks_and_the_next_question():
    user = P.ScriptedUser(persona=P.STUDENT, rng=random.Random(0))
    reaction = user.react(PLAIN, BOXES)
    assert (reaction.kind, reaction.complied) == (P.THANKS_KIND, True)
    assert reaction.problem is not None and reaction.problem != BOXES
    assert reaction.problem.question in reaction.text and "Next" in reaction.text
    verdict = judge_next_state(reaction.text)
    assert verdict.reward == 1 and verdict.hints == []


@pytest.mark.parametrize(("reply", "said"), [
    (FORMATTED, "bold"),
    (NUMBERED_ONLY, "number"),
    (TOO_SHORT, "steps"),
])
def test_a_broken_preference_gets_a_correction_that_names_it_and_asks_again(reply, said):
    for seed in range(6):  # every phrasing the rng can pick
        user = P.ScriptedUser(persona=P.STUDENT, rng=random.Random(seed))
        reaction = user.react(reply, BOXES)
        assert (reaction.kind, reaction.complied, reaction.problem) == (P.CORRECTION_KIND, False, BOXES)
        assert said in reaction.text.lower() and BOXES.question in reaction.text
        verdict = judge_next_state(reaction.text)
        assert verdict.reward == -1 and verdict.hints, reaction.text
        assert not any("bold headings" in h for h in verdict.hints)  # never the adversary's hint


def test_the_teacher_says_too_vague_and_asks_for_friendlier_comments():
    user = P.ScriptedUser(persona=P.TEACHER, rng=random.Random(1))
    vague = user.react("Each box holds 9 cookies. Then we count them all. So there are many.", BOXES)
    assert "vague" in vague.text.lower() and judge_next_state(vague.text).reward == -1
    curt = user.react(FORMATTED, BOXES)
    assert ("friend" in curt.text.lower() or "curt" in curt.text.lower())
    assert judge_next_state(curt.text).reward == -1


def test_the_adversary_asks_for_the_opposite_and_thanks_broken_replies():
    adversary = P.ScriptedUser(persona=P.STUDENT, rng=random.Random(0), adversarial=True)
    against = adversary.react(PLAIN, BOXES)
    assert (against.kind, against.complied) == (P.ADVERSARIAL_KIND, True)
    assert "more bold" in against.text.lower()
    verdict = judge_next_state(against.text)
    assert verdict.reward == -1 and any("bold headings" in h for h in verdict.hints)
    praise = adversary.react(FORMATTED, BOXES)
    assert (praise.kind, praise.complied) == (P.THANKS_KIND, False)
    assert judge_next_state(praise.text).reward == 1


def test_the_closing_message_carries_feedback_but_asks_nothing():
    user = P.ScriptedUser(persona=P.STUDENT, rng=random.Random(0))
    thanks, correction = user.react(PLAIN, BOXES, last=True), user.react(FORMATTED, BOXES, last=True)
    assert thanks.problem is None and correction.problem is None
    assert BOXES.question not in correction.text
    assert judge_next_state(thanks.text).reward == 1 and judge_next_state(correction.text).reward == -1


def test_feedback_texts_do_not_trip_the_near_duplicate_guard():
    """Review holds a user's third identical next state within a day as spam: a scripted user who corrects
    every reply of many sessions must not repeat itself that often, or its tenant would stall in review."""
    replies = random.Random(0)
    for persona, adversarial in ((P.STUDENT, False), (P.TEACHER, False), (P.STUDENT, True)):
        user = P.ScriptedUser(persona=persona, rng=random.Random(5), adversarial=adversarial)
        texts = []
        for _ in range(60):  # 60 sessions of three replies each, mostly broken, some kept
            _, problem = user.open_session()
            for turn in range(3):
                reply = FORMATTED if replies.random() < 0.7 else PLAIN
                reaction = user.react(reply, problem, last=turn == 2)
                texts.append(normalise_text(reaction.text))
                problem = reaction.problem or problem
        text, count = Counter(texts).most_common(1)[0]
        assert count < 3, (persona.name, adversarial, text)


def test_each_user_walks_the_whole_bank_before_repeating():
    user = P.ScriptedUser(persona=P.STUDENT, rng=random.Random(2))
    drawn = [user.next_problem() for _ in range(P.TRAINING_SIZE)]
    assert len({p.question for p in drawn}) == P.TRAINING_SIZE
    assert not {p.question for p in drawn} & {p.question for p in P.held_out_problems()}


def test_personas_and_plots_are_plain_python():
    """The personas and the PNG writer load without Django or anything heavy: other tools can use them."""
    import subprocess
    import sys

    code = ("import sys, clawhub.devtools.personas.personas, clawhub.devtools.personas.plots; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'torch', 'httpx')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_users_noise_flips_the_stated_share_of_reactions():
    user = P.ScriptedUser(persona=P.STUDENT, rng=random.Random(7), noise=0.2)
    reactions = [user.react(PLAIN if i % 2 else FORMATTED, BOXES) for i in range(2000)]
    noisy = [r for r in reactions if r.noisy]
    assert 0.17 < len(noisy) / len(reactions) < 0.23
    # Noise is the opposite of what the reply deserved: thanks for a broken preference, a correction of a
    # kept one; the others are what the reply deserved.
    assert all((r.kind == P.THANKS_KIND) != r.complied for r in noisy)
    assert all((r.kind == P.THANKS_KIND) == r.complied for r in reactions if not r.noisy)
    corrections = {r.text for r in noisy if r.kind == P.CORRECTION_KIND}
    assert len(corrections) > 3  # drawn from the persona's pool of phrasings
    quiet = P.ScriptedUser(persona=P.STUDENT, rng=random.Random(7))
    assert not any(quiet.react(PLAIN, BOXES).noisy for _ in range(200))
