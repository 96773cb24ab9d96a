import re
import subprocess
import sys
from pathlib import Path

import pytest

from clawhub.feedback.models import JudgeRules
from workers.judge import LLMJudge, RuleJudge
from workers.judge.registry import JUDGES, judge_class

ROOT = Path(__file__).resolve().parents[2]


def test_every_registered_judge_resolves_to_the_class_of_that_name():
    assert judge_class("rule") is RuleJudge and judge_class("llm") is LLMJudge
    assert all(judge_class(name).name == name for name in JUDGES)
    with pytest.raises(ValueError, match=re.escape(f"unknown judge 'nope': one of {', '.join(JUDGES)}")):
        judge_class("nope")


def test_the_tenant_choices_are_default_plus_the_registry():
    assert JudgeRules.Backend.values == ["default", *JUDGES]
    assert all(len(name) <= JudgeRules._meta.get_field("judge").max_length for name in JUDGES)


def test_settings_refuse_a_judge_that_is_not_registered():
    env = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "clawhub.settings.base", "CLAWHUB_JUDGE": "x",
           "CLAWHUB_DATA_DIR": "/tmp/clawhub-judge-check"}
    result = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and f"CLAWHUB_JUDGE='x': use one of {', '.join(JUDGES)}" in result.stderr


def test_the_rule_judge_falls_back_to_the_defaults_for_refused_rules(settings):
    judge = RuleJudge.from_config(settings, rules={"tenant_id": 1, "negative_patterns": ["re:(a)\\1"],
                                                   "positive_patterns": [], "hint_templates": {},
                                                   "extend_defaults": True})
    assert judge.prompt_version == RuleJudge().prompt_version
    assert LLMJudge.from_config(settings) is LLMJudge.from_config(settings)  # one per process and config
