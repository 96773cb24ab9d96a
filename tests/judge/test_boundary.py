import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import sys
import workers.judge
from workers.judge import LLMJudge, RuleJudge, prompts
prompts.template("prm"), prompts.template("hint")
leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("django", "clawhub", "celery", "torch"))
assert not leaked, leaked
"""


def test_judge_package_imports_nothing_from_django_or_clawhub():
    # A fresh interpreter: the test process itself has Django loaded already.
    result = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
