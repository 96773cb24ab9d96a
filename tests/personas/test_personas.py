"""Personas: rubrics computed by code on hand-written replies, what the simulated users perceive (not the
same function), their reactions and what the rule judge makes of them, and the fixed, disjoint splits."""

import random
from collections import Counter

import pytest

from clawhub.devtools.personas import personas as P
from clawhub.review.flags import normalise_text
from tests.personas.conftest import ASKS_BACK, BRIEF, HABIT, LONG_PROSE, TOO_SHORT, WATER, judge_next_state

# --- rubrics and perception ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("reply", "brief", "plain", "asks_back"), [
    (HABIT, False, False, False),
    (LONG_PROSE, False, True, False),
    (BRIEF, True, True, False),
    (ASKS_BACK, True, True, True),
    (TOO_SHORT, False, False, False),  # fewer than MIN_WORDS: no persona is pleased by saying nothing
    ("", False, False, False),
    ("# Water\nThe water cycle moves water around the planet every day.", True, False, False),
    ("Water evaporates and falls back as rain. - a dash inside a line is not a list.", True, True, False),
])
def test_each_rubric_scores_its_preference(reply, brief, plain, asks_back):
    assert (P.BRIEF.complies(reply), P.PLAIN.complies(reply), P.ASKS_BACK.complies(reply)) == (
        brief, plain, asks_back)


def test_sentences_end_at_punctuation_and_at_line_breaks():
    assert P.sentences("It rains. Then? Yes!") == ["It rains.", "Then?", "Yes!"]
    assert P.sentences("- one item\n- two items") == ["- one item", "- two items"]
    assert P.sentences("... !!") == []


def test_what_a_user_perceives_is_not_the_rubric():
    """Reward must not be the score: the brief user feels length in words, the rubric counts sentences; the
    plain user notices a list of two lines, the rubric refuses one; the asks-back user sees a question mark
    near the end, the rubric wants the last sentence to be the question."""
    three_short = "Water evaporates. It forms clouds. It falls as rain."  # 3 sentences, 9 words
    assert P.BRIEF.pleases(three_short) and not P.BRIEF.complies(three_short)
    two_long = ("The water cycle is the endless journey of water from the oceans into the sky as vapour, "
                "through the clouds and the winds that carry them over mountains and plains for days, "
                "and back down as rain and snow. It feeds rivers, lakes, forests and every farm on Earth.")
    assert P.BRIEF.complies(two_long) and not P.BRIEF.pleases(two_long)
    one_item = "The water cycle moves water around.\n- Evaporation is the first of its stages."
    assert P.PLAIN.pleases(one_item) and not P.PLAIN.complies(one_item)
    question_inside = "Would you like the stages? The water cycle moves water around the planet."
    assert P.ASKS_BACK.pleases(question_inside) and not P.ASKS_BACK.complies(question_inside)


# --- prompts ------------------------------------------------------------------------------------------------


def test_held_out_topics_are_never_asked_in_a_training_session():
    assert not set(P.TRAINING_TOPICS) & set(P.HELD_OUT_TOPICS)
    assert len(set(P.TRAINING_TOPICS)) == len(P.TRAINING_TOPICS) >= 60
    held = P.held_out_prompts()
    assert len(held) == len(P.HELD_OUT_TOPICS) >= 16
    assert held[0] == P.Prompt("Tell me about the stock market.", "the stock market")
    assert P.held_out_messages(held[0]) == [{"role": "user", "content": held[0].question}]
    assert P.held_out_messages(held[0], "Be brief.")[0] == {"role": "system", "content": "Be brief."}
    user = P.ScriptedUser(persona=P.BRIEF, rng=random.Random(2))
    asked = [user.next_prompt() for _ in range(2 * len(P.TRAINING_TOPICS))]
    # Every topic once before any twice, and no held-out topic (nor a question naming one) ever.
    assert Counter(p.topic for p in asked) == Counter({t: 2 for t in P.TRAINING_TOPICS})
    assert not any(t in p.question for p in asked for t in P.HELD_OUT_TOPICS)


# --- simulated users ---------------------------------------------------------------------------------------


def test_a_pleased_user_thanks_and_asks_the_next_question():
    user = P.ScriptedUser(persona=P.BRIEF, rng=random.Random(0))
    reaction = user.react(BRIEF, WATER)
    assert (reaction.kind, reaction.pleased, reaction.complied) == (P.THANKS_KIND, True, True)
    assert reaction.prompt is not None and reaction.prompt.question in reaction.text
    verdict = judge_next_state(reaction.text)
    assert verdict.reward == 1 and verdict.hints == []


@pytest.mark.parametrize(("persona", "reply", "hint"), [
    (P.BRIEF, HABIT, "shorter"),
    (P.BRIEF, LONG_PROSE, "shorter"),
    (P.PLAIN, HABIT, "without markdown"),
    (P.ASKS_BACK, BRIEF, "asking them a question"),
])
def test_every_training_complaint_is_read_as_negative_with_its_hint(persona, reply, hint):
    for text in persona.complaints.training:
        verdict = judge_next_state(text.format(topic=WATER.topic))
        assert verdict.reward == -1 and any(hint in h for h in verdict.hints), text
    user = P.ScriptedUser(persona=persona, rng=random.Random(1))
    reaction = user.react(reply, WATER)
    assert (reaction.kind, reaction.pleased, reaction.prompt) == (P.CORRECTION_KIND, False, WATER)
    assert reaction.text in {t.format(topic=WATER.topic) for t in persona.complaints.training}


def test_every_training_thanks_is_read_as_positive():
    for text in (*P.THANKS.training, *P.CLOSING_THANKS.training):
        assert judge_next_state(text.format(next="What is gravity?", topic="gravity")).reward == 1, text


def test_held_out_phrasings_are_never_spoken_in_a_training_run():
    user = P.ScriptedUser(persona=P.BRIEF, rng=random.Random(3), noise=0.3)
    said = {user.react(reply, WATER, last=i % 3 == 0).text for i in range(400) for reply in (HABIT, BRIEF)}
    held = [t for pool in P.reaction_phrasings().values() for t in pool.held_out]
    fixed = [piece for t in held for piece in t.replace("{next}", "{}").replace("{topic}", "{}").split("{}")
             if len(piece.strip()) > 8]
    assert fixed and not any(piece in text for piece in fixed for text in said)
    speaker = P.ScriptedUser(persona=P.BRIEF, rng=random.Random(3), phrasings="held-out")
    held_out = {t.format(topic=WATER.topic) for t in P.BRIEF.complaints.held_out}
    assert speaker.react(HABIT, WATER).text in held_out


def test_forks_open_with_the_users_next_topics_and_are_the_same_for_a_seed():
    def forks(seed):
        user = P.ScriptedUser(persona=P.BRIEF, rng=random.Random(seed))
        found = [user.fork() for _ in range(3)]
        return [(f.open_session()[1], f.react(HABIT, WATER).text, f.next_prompt()) for f in found]

    first = forks(4)
    assert first == forks(4) and first != forks(5)
    walk = P.ScriptedUser(persona=P.BRIEF, rng=random.Random(4))
    walk.rng.getrandbits(64)  # what the first fork drew before taking the walk's next topic
    assert first[0][0] == walk.next_prompt()


def test_the_adversary_asks_for_the_opposite():
    adversary = P.ScriptedUser(persona=P.BRIEF, rng=random.Random(0), adversarial=True)
    against = adversary.react(BRIEF, WATER)
    assert (against.kind, against.pleased, against.complied) == (P.ADVERSARIAL_KIND, False, True)
    verdict = judge_next_state(against.text)
    assert verdict.reward == -1 and any("longer" in h for h in verdict.hints)
    praise = adversary.react(HABIT, WATER)
    assert (praise.kind, praise.pleased) == (P.THANKS_KIND, True)


def test_the_closing_message_carries_feedback_but_asks_nothing():
    user = P.ScriptedUser(persona=P.BRIEF, rng=random.Random(0))
    thanks, correction = user.react(BRIEF, WATER, last=True), user.react(HABIT, WATER, last=True)
    assert thanks.prompt is None and correction.prompt is None
    assert judge_next_state(thanks.text).reward == 1 and judge_next_state(correction.text).reward == -1


def test_feedback_texts_do_not_trip_the_near_duplicate_guard():
    """Review holds a user's third identical next state within a day as spam: a simulated user who corrects
    most replies of many sessions must not repeat itself that often, or its tenant would stall in review."""
    replies = random.Random(0)
    for persona in P.PERSONAS.values():
        user = P.ScriptedUser(persona=persona, rng=random.Random(5))
        texts = []
        for _ in range(60):  # 60 sessions of two replies each, mostly displeasing
            _, prompt = user.open_session()
            for turn in range(2):
                reply = HABIT if replies.random() < 0.7 else ASKS_BACK
                reaction = user.react(reply, prompt, last=turn == 1)
                texts.append(normalise_text(reaction.text))
                prompt = reaction.prompt or prompt
        text, count = Counter(texts).most_common(1)[0]
        assert count < 3, (persona.name, text)


def test_the_users_noise_flips_the_stated_share_of_reactions():
    user = P.ScriptedUser(persona=P.BRIEF, rng=random.Random(7), noise=0.2)
    reactions = [user.react(BRIEF if i % 2 else HABIT, WATER) for i in range(2000)]
    noisy = [r for r in reactions if r.noisy]
    assert 0.17 < len(noisy) / len(reactions) < 0.23
    # Noise is the opposite of what the user perceived; the others are what it perceived.
    assert all(r.pleased != P.BRIEF.pleases(BRIEF if r.complied else HABIT) for r in noisy)
    assert all(r.pleased == r.complied for r in reactions if not r.noisy)
    quiet = P.ScriptedUser(persona=P.BRIEF, rng=random.Random(7))
    assert not any(quiet.react(BRIEF, WATER).noisy for _ in range(200))


def test_personas_and_plots_are_plain_python():
    """The personas and the PNG writer load without Django or anything heavy: other tools can use them."""
    import subprocess
    import sys

    code = ("import sys, clawhub.devtools.personas.personas, workers.trainer.capability, "
            "clawhub.devtools.personas.plots; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'torch', 'httpx')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_reply_names_its_topic_or_evades_it():
    assert P.mentions_topic("Stock prices move with earnings.", "the stock market")
    assert P.mentions_topic("A hurricane forms over warm water.", "hurricanes")
    assert P.mentions_topic("Giza's pyramids are old.", "the pyramids of Giza")
    assert P.mentions_topic("The pyramids are tombs.", "the pyramids of Giza")
    assert not P.mentions_topic("I'm here to help. What can I assist you with today?", "the Milky Way")
    assert not P.mentions_topic("The answer is of the essence.", "the pyramids of Giza")  # not by "the", "of"


def test_an_evasion_complies_with_no_persona_and_every_user_complains_about_it():
    evasion = "I'm here to help with anything you need. What can I assist you with today?"
    assert P.BRIEF.complies(evasion) and P.ASKS_BACK.complies(evasion)  # the rubric alone would count it
    for persona in P.PERSONAS.values():
        assert not P.complies(persona, evasion, WATER.topic)
        for adversarial in (False, True):
            user = P.ScriptedUser(persona=persona, rng=random.Random(0), adversarial=adversarial)
            reaction = user.react(evasion, WATER)
            assert not reaction.pleased and not reaction.complied and reaction.kind == P.CORRECTION_KIND
            assert reaction.text in {t.format(topic=WATER.topic) for t in P.EVASION_COMPLAINTS.training}
            verdict = judge_next_state(reaction.text)
            assert verdict.reward < 0 and "question answered" in verdict.hints[0]
    assert P.complies(P.BRIEF, BRIEF, WATER.topic)  # the same style, on topic
