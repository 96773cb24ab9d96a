"""The dashboard's adapter progress: versions over time with their eval scores as an inline SVG plot, the run
in progress, the feedback that fed each version, and the benchmark's plot when one was written."""

import base64
import re

import pytest
from django.test import Client

from clawhub.adapters.models import AdapterVersion
from clawhub.devtools.personas.plots import line_chart_png
from clawhub.training.models import TrainingRun
from clawhub.training.progress import planned_steps
from tests.factories import add_member, make_group, make_user
from tests.review.conftest import approved_sample

pytestmark = pytest.mark.django_db


def version(tenant, number: int, state: str, score: float | None, **fields) -> AdapterVersion:
    return AdapterVersion.objects.create(tenant=tenant, version=number, state=state, eval_score=score,
                                         artifact_path=f"/srv/adapters/t{tenant.pk}/v{number}", **fields)


def run_for(tenant, *, state=TrainingRun.State.SUCCEEDED, adapter_version=None, **fields) -> TrainingRun:
    return TrainingRun.objects.create(tenant=tenant, backend="local", method="combine", base_model="tiny",
                                      state=state, adapter_version=adapter_version, **fields)


def fed(user, run: TrainingRun, *, tenant=None, reward: int) -> None:
    sample = approved_sample(user, tenant=tenant, reward=reward)
    sample.training_run_id = run.pk
    sample.save(update_fields=["training_run_id"])


def dashboard(user) -> str:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    response = client.get("/dashboard/")
    assert response.status_code == 200
    return response.content.decode()


def test_the_dashboard_plots_each_versions_eval_score_and_what_fed_it():
    user = make_user()
    tenant = user.tenant
    version(tenant, 1, AdapterVersion.State.RETIRED, -0.5)
    v2 = version(tenant, 2, AdapterVersion.State.ACTIVE, 0.5)
    version(tenant, 3, AdapterVersion.State.REJECTED, 0.25)
    run = run_for(tenant, adapter_version=v2)
    fed(user, run, reward=1)
    fed(user, run, reward=-1)

    html = dashboard(user)
    svg = re.search(r'<svg class="progress-chart".*?</svg>', html, flags=re.S)
    assert svg, "no inline SVG plot on the dashboard"
    points = re.search(r'<polyline class="score-line" points="([^"]+)"', svg.group(0)).group(1).split()
    assert len(points) == 3  # v1, v2, v3, oldest first
    ys = [float(p.split(",")[1]) for p in points]
    assert ys[1] < ys[2] < ys[0]  # 0.5 above 0.25 above -0.5 (SVG y grows downwards)
    assert "v2 (active" in svg.group(0) and 'class="score-point state-rejected"' in svg.group(0)
    assert "serving v2" in html
    # The feedback that trained v2: counts, and the user's own next messages.
    row = re.search(r"<tr>\s*<td>v2</td>.*?</tr>", html, flags=re.S).group(0)
    assert "1 positive" in row and "1 correction<" in row and f"/training/runs/{run.pk}/" in row
    assert row.count("<li") == 2 and "reply " in row  # the sample builder's next-state texts


def test_the_run_in_progress_shows_its_step_of_the_planned_steps():
    user = make_user()
    run = run_for(user.tenant, state=TrainingRun.State.RUNNING, step=1, loss=0.125, sample_ids=[1, 2, 3],
                  config={"epochs": 2})
    html = dashboard(user)
    assert f"/training/runs/{run.pk}/" in html
    assert re.search(r"step 1\s+of 2 on 3 samples", html) and "loss 0.125" in html
    assert '<progress max="100" value="50">' in html


def test_without_a_run_it_says_how_far_the_next_batch_is():
    user = make_user()
    for _ in range(3):
        approved_sample(user, reward=1)
    html = dashboard(user)
    assert "3 of 16 approved samples toward the next one" in html
    assert "No adapter version yet" in html and 'class="progress-chart"' not in html


def test_group_members_see_counts_but_not_each_others_words():
    owner = make_user()
    group = make_group(owner)
    member = add_member(group)
    v1 = version(group.tenant, 1, AdapterVersion.State.ACTIVE, 0.75)
    run = run_for(group.tenant, adapter_version=v1)
    fed(owner, run, tenant=group.tenant, reward=-1)
    html = dashboard(member)
    assert f"group {group.slug}" in html and "1 correction<" in html
    assert 'class="feedback-examples"' not in html and "reply " not in html


def test_the_benchmark_plot_is_shown_when_the_bench_wrote_one(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    user = make_user()
    assert "Persona benchmark" not in dashboard(user)
    png = line_chart_png({"combine student": [0.2, 0.9]})
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "personas.png").write_bytes(png)
    html = dashboard(user)
    src = re.search(r'<img class="bench-plot" src="data:image/png;base64,([^"]+)"', html)
    assert src and base64.b64decode(src.group(1)) == png


@pytest.mark.parametrize(("config", "samples", "steps"), [
    ({}, 16, 1),  # the whole batch in one optimizer step
    ({"epochs": 3}, 16, 3),
    ({"mini_batches": 4, "epochs": 2}, 16, 8),  # PPO-style mini-batch steps
    ({"grad_accum": 1, "micro_batch_size": 4}, 16, 4),
    ({"grad_accum": 2, "micro_batch_size": 4, "epochs": 2, "max_steps": 3}, 16, 3),
    ({"epochs": "many"}, 16, None),
])
def test_planned_steps_follow_the_trainers_batching(config, samples, steps):
    assert planned_steps(config, samples) == steps
