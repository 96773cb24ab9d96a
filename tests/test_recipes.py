"""The recipes of clawhub/README.md ("How do I add…"), followed on a copy of the tree: each test makes exactly
the edits its recipe lists, then checks what the recipe promises in a fresh process, and counts the files the
recipe touched (git, in the copy). A recipe that no longer works, or that needs one more file, fails here."""

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "clawhub.settings.base",
               "CLAWHUB_DATA_DIR": str(cwd.parent / "data"), "PYTHONDONTWRITEBYTECODE": "1", **env}
    result = subprocess.run(args, cwd=cwd, env=environ, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result


@pytest.fixture
def tree(tmp_path) -> Path:
    """The project's code (clawhub/, workers/, manage.py), committed in a repository of its own."""
    dest = tmp_path / "tree"
    tracked = subprocess.run(["git", "ls-files", "clawhub", "workers", "manage.py"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    for name in tracked:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, dest / name)
    git = ["git", "-c", "user.name=recipe", "-c", "user.email=recipe@example.com"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "before the recipe"]):
        subprocess.run(git + args, cwd=dest, check=True, capture_output=True)
    return dest


def touched(tree: Path) -> list[str]:
    """The files the recipe changed or added, as git sees them in the copy."""
    subprocess.run(["git", "add", "-A"], cwd=tree, check=True)
    status = subprocess.run(["git", "status", "--porcelain"], cwd=tree, capture_output=True, text=True,
                            check=True).stdout
    return sorted(line[3:] for line in status.splitlines())


def add_line_to(path: Path, table: str, line: str) -> None:
    """The recipe's "add one line to TABLE": after the table's opening line."""
    text = path.read_text()
    opening = f"{table}: dict[str, str] = {{\n"
    assert opening in text
    path.write_text(text.replace(opening, opening + f"    {line}\n"))


def follow_registry_recipe(tree: Path, *, module: str, source: str, registry: str, table: str, line: str,
                           app: str, migration: str, setting: dict[str, str]) -> None:
    """The recipe both registries share: the class in a module of its own, one line in the registry's table,
    Django's choices-only migration; then no other migration is wanted with ``setting`` naming it."""
    (tree / module).write_text(textwrap.dedent(source))
    add_line_to(tree / registry, table, line)
    _run([sys.executable, "manage.py", "makemigrations", app, "--name", migration], tree)
    _run([sys.executable, "manage.py", "makemigrations", "--check", "--dry-run"], tree, **setting)


def test_a_judge_type_is_one_class_one_registry_line_and_a_choices_migration(tree):
    # A Judge subclass with name, _judge and from_config; one line in JUDGES; the choices-only migration.
    follow_registry_recipe(tree, module="workers/judge/echo.py", source='''\
        from workers.judge.judges import Judge, JudgeResult


        class EchoJudge(Judge):
            """Scores every turn 0 and hands back its next state as the hint."""

            name = "echo"
            prompt_version = "echo-1"

            def _judge(self, inp):
                hint = " ".join(str(m.get("content")) for m in inp.next_state)
                return JudgeResult(reward=0, votes=[], hint_votes=[], hints=[hint], judge=self.name,
                                   prompt_version=self.prompt_version)

            @classmethod
            def from_config(cls, config, *, rules=None):
                return cls()
        ''', registry="workers/judge/registry.py", table="JUDGES",
        line='"echo": "workers.judge.echo:EchoJudge",', app="feedback", migration="judge_echo",
        setting={"CLAWHUB_JUDGE": "echo"})

    # What the recipe promises: CLAWHUB_JUDGE=echo is accepted, tenants can choose it (JudgeRules and the
    # judge-rules API's choices), the judge task builds it (what judge_for_tenant calls).
    check = textwrap.dedent('''\
        import django
        django.setup()
        from django.conf import settings
        from clawhub.feedback.api import JudgeRulesUpdateApi
        from clawhub.feedback.models import JudgeRules
        from workers.judge import JudgeInput
        from workers.judge.registry import judge_class

        assert settings.CLAWHUB_JUDGE == "echo"
        assert "echo" in JudgeRules.Backend.values
        assert "echo" in JudgeRulesUpdateApi.InputSerializer().fields["judge"].choices
        judge = judge_class("echo").from_config(settings, rules=None)
        result = judge.judge(JudgeInput(messages=[{"role": "user", "content": "hi"}],
                                        response={"role": "assistant", "content": "hello"},
                                        next_state=[{"role": "user", "content": "thanks"}]))
        assert (result.judge, result.hints) == ("echo", ["thanks"])
        print("ok")
        ''')
    assert _run([sys.executable, "-c", check], tree, CLAWHUB_JUDGE="echo").stdout.strip() == "ok"
    assert touched(tree) == ["clawhub/feedback/migrations/0003_judge_echo.py", "workers/judge/echo.py",
                             "workers/judge/registry.py"]


def test_a_training_backend_is_one_class_one_registry_line_and_a_choices_migration(tree):
    # A TrainingBackend subclass with name and from_config; one line in BACKENDS; the choices-only migration
    # (this backend has no settings of its own to add).
    follow_registry_recipe(tree, module="workers/trainer/echo.py", source='''\
        from workers.trainer.backend import TrainingBackend


        class EchoBackend(TrainingBackend):
            """Trains nothing: a stand-in with the interface every backend implements."""

            name = "echo"

            def __init__(self, *, endpoint=""):
                self.endpoint = endpoint

            @classmethod
            def from_config(cls, config):
                return cls(endpoint=getattr(config, "CLAWHUB_ECHO_ENDPOINT", ""))

            def start(self, base_model, parent_adapter_dir, config, workdir):
                pass

            def train(self, batch, on_step=None):
                raise NotImplementedError

            def export_adapter(self, out_dir):
                return out_dir
        ''', registry="workers/trainer/registry.py", table="BACKENDS",
        line='"echo": "workers.trainer.echo:EchoBackend",', app="training", migration="backend_echo",
        setting={"CLAWHUB_TRAIN_BACKEND": "echo"})

    # What the recipe promises: CLAWHUB_TRAIN_BACKEND=echo is accepted, staff can choose it per tenant
    # (training.models.Backend), the train task builds it (make_backend).
    check = textwrap.dedent('''\
        import django
        django.setup()
        from django.conf import settings
        from clawhub.training.models import Backend, TrainingSettings
        from workers.tasks.training import make_backend

        assert settings.CLAWHUB_TRAIN_BACKEND == "echo"
        assert "echo" in Backend.values
        assert "echo" in dict(TrainingSettings._meta.get_field("backend").choices)
        assert type(make_backend("echo")).__name__ == "EchoBackend"
        print("ok")
        ''')
    assert _run([sys.executable, "-c", check], tree, CLAWHUB_TRAIN_BACKEND="echo").stdout.strip() == "ok"
    assert touched(tree) == ["clawhub/training/migrations/0004_backend_echo.py", "workers/trainer/echo.py",
                             "workers/trainer/registry.py"]


def test_a_per_key_model_alias_is_offered_in_naming_and_mapped_where_the_gateway_picks_an_adapter(tree):
    # 1. Offer the alias in models_offered (clawhub/tenants/naming.py).
    naming = tree / "clawhub/tenants/naming.py"
    text = naming.read_text()
    offered = "    return [tenant_model_id, BASE_MODEL_ID]\n"
    assert offered in text
    naming.write_text(text.replace(offered, '    return [tenant_model_id, BASE_MODEL_ID, "clawhub-fast"]\n'))
    # 2. Map it where the gateway turns a model id into an adapter: here, like the base, to no adapter.
    app = tree / "clawhub/gateway/app.py"
    text = app.read_text()
    base = "        if model == naming.BASE_MODEL_ID:\n"
    assert text.count(base) == 1
    app.write_text(text.replace(base, '        if model in (naming.BASE_MODEL_ID, "clawhub-fast"):\n'))

    # What the recipe promises: models_for_key and model_access allow it, so /v1/models (KeyInfo.models), the
    # gateway's model check and the key pages (keys.selectors.models_for_key) list and accept it; the
    # gateway serves it with the adapter it was mapped to.
    check = textwrap.dedent('''\
        import asyncio
        import django
        django.setup()
        from clawhub.gateway.app import Gateway, check_model
        from clawhub.gateway.auth import KeyInfo
        from clawhub.tenants import naming

        info = KeyInfo(key_id=1, user_id=1, tenant_id=1, group_id=None, model_id="clawhub-personal",
                       allowed_models=frozenset(), rpm=None, tpm=None, concurrency=None, expires_at=None,
                       generation_key="g")
        assert "clawhub-fast" in info.models()
        assert naming.model_access(model="clawhub-fast", tenant_model_id="clawhub-personal",
                                   allowed_models=None) == "ok"
        check_model(info, "clawhub-fast")
        assert asyncio.run(Gateway.__new__(Gateway)._adapter_for(info, "clawhub-fast")) == (None, None)
        print("ok")
        ''')
    assert _run([sys.executable, "-c", check], tree).stdout.strip() == "ok"
    assert touched(tree) == ["clawhub/gateway/app.py", "clawhub/tenants/naming.py"]
