import pytest

from workers.judge.parsing import boxed_score, extract_hint, majority_vote


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"The user thanked the assistant. \boxed{1}", 1),
        (r"\boxed{-1}", -1),
        (r"\boxed{0}", 0),
        (r"\boxed{+1}", 1),
        (r"\boxed{ -1 }", -1),
        (r"\boxed { 1}", 1),
        (r"\boxed{\text{1}}", 1),
        (r"\boxed{\textbf{-1}}", -1),
        (r"\boxed{{-1}}", -1),
        (r"$\boxed{1}$", 1),
        (r"\boxed{- 1}", -1),
    ],
)
def test_boxed_variants(text, expected):
    assert boxed_score(text) == expected


@pytest.mark.parametrize("text", ["", None, "no verdict at all", r"\boxed{}", r"\boxed{yes}", r"\boxed{1.5}",
                                  r"\boxed{1", "boxed{1}", r"\boxed{1/2}"])
def test_no_valid_box(text):
    assert boxed_score(text) is None


def test_last_box_wins_over_earlier_ones():
    assert boxed_score(r"First I thought \boxed{1}, but the user said redo, so \boxed{-1}") == -1
    assert boxed_score(r"(b) would be \boxed{-1} ... final answer \boxed{0}") == 0


def test_last_box_with_an_integer_wins_over_a_later_box_without_one():
    assert boxed_score(r"Verdict \boxed{-1}. Category: \boxed{b}") == -1


def test_box_contents_are_read_with_balanced_braces():
    assert boxed_score(r"\boxed{\text{{1}}} and then text with } stray braces") == 1


@pytest.mark.parametrize(
    ("votes", "expected"),
    [
        ([1, 1, -1], 1),
        ([-1, -1, 1], -1),
        ([1, None, None], 1),
        ([0, 0, 1], 0),
        ([1, -1, 0], 0),  # three-way tie at the top
        ([1, -1, None], 0),  # tie between the two valid votes
        ([1, 1, -1, -1], 0),
        ([None, None, None], 0),  # no valid vote
        ([], 0),
        ([5, 5, -1], -1),  # out-of-range numbers are not votes
    ],
)
def test_majority_vote(votes, expected):
    assert majority_vote(votes) == expected


def test_hint_between_last_markers_is_stripped():
    text = ("[HINT_START]an early draft that is long[HINT_END] then the real one:\n"
            "[HINT_START]\n  Write plain sentences without bold text.  \n[HINT_END] \\boxed{1}")
    assert extract_hint(text) == "Write plain sentences without bold text."


@pytest.mark.parametrize(
    "text",
    [
        "no markers here",
        "[HINT_START]Use plain sentences without any end marker",
        "[HINT_START]too short[HINT_END]",  # 9 characters
        "[HINT_START]  0123456789  [HINT_END]",  # exactly 10 characters: not longer than 10
        "[HINT_END]reversed markers[HINT_START]",
        None,
    ],
)
def test_hint_rejected(text):
    assert extract_hint(text) is None


def test_hint_of_eleven_characters_is_accepted():
    assert extract_hint("[HINT_START]0123456789a[HINT_END]") == "0123456789a"
