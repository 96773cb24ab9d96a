"""The consensus guard's simulation (manage.py bench_consensus): it drives the real guard, so its figures move
with it."""

import pytest
from django.core.management import CommandError, call_command

from clawhub.devtools.consensus_sim import quantile, simulate


def test_without_noise_the_adversary_is_flagged_and_nobody_honest_is():
    outcome = simulate("HHA", noise=0.0, runs=3, sessions=4)
    assert len(outcome.adversary_flagged_at) == 3 and None not in outcome.adversary_flagged_at
    assert outcome.adversary_cleared_first == 0
    assert (outcome.honest_flagged, outcome.honest_members) == (0, 6)
    assert None not in outcome.honest_cleared_at


def test_an_all_honest_group_has_no_adversary_to_flag():
    outcome = simulate("HHH", noise=0.0, runs=2, sessions=3)
    assert outcome.adversary_flagged_at == [] and outcome.honest_flagged == 0


def test_quantile_counts_never_as_the_largest():
    assert quantile([3, None, 5], 0.5) == 5 and quantile([3, None, 5], 1.0) is None
    assert quantile([], 0.5) is None


def test_the_command_prints_a_line_per_group_and_noise(capsys):
    call_command("bench_consensus", groups="HHA", noise="0,0.1", runs=1, sessions=3)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("HHA noise 0, 1 runs: adversary flagged by its sample")


@pytest.mark.parametrize("options", [{"groups": "HXA"}, {"noise": "high"}, {"noise": "0.7"}, {"runs": 0}])
def test_bad_options_get_a_clear_error(options):
    with pytest.raises(CommandError):
        call_command("bench_consensus", **options)
