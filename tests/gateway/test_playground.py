"""The playground's keys at the gateway: any version of the tenant's adapter by ``<model id>:v<N>``, served by
that version's weights; every turn a playground turn whatever the request says; ordinary keys cannot name a
version."""

import httpx

from clawhub.adapters.models import AdapterVersion
from clawhub.keys.services import playground_key_mint
from tests.factories import make_key, make_user
from tests.gateway.conftest import activate_adapter

MSGS = [{"role": "user", "content": "hi"}]


def ask(gateway, secret: str, model: str, **headers) -> httpx.Response:
    return httpx.post(f"{gateway.v1}/chat/completions",
                      json={"model": model, "messages": MSGS, "max_tokens": 3},
                      headers={"Authorization": f"Bearer {secret}", **headers}, timeout=30)


def test_a_playground_key_is_served_by_the_version_it_names_and_its_turns_are_playground_turns(gateway, fake):
    user = make_user()
    activate_adapter(user.tenant, version=1)
    activate_adapter(user.tenant, version=2)  # v1 retired, v2 active
    AdapterVersion.objects.create(tenant=user.tenant, version=3, state=AdapterVersion.State.REJECTED,
                                  artifact_path=f"/srv/adapters/t{user.tenant.pk}/v3")
    _, secret = playground_key_mint(actor=user)
    served = {}
    for model in ("base", "clawhub-personal", "clawhub-personal:v1", "clawhub-personal:v3"):
        response = ask(gateway, secret, model, **{"X-Turn-Type": "main"})  # the key decides, not the header
        assert response.status_code == 200, response.text
        assert response.json()["model"] == model
        served[model] = response.json()["choices"][0]["message"]["content"].split()[0]
    t = user.tenant.pk
    # The fake upstream answers with the name it was asked for: the base's, or the adapter's on vLLM.
    assert served == {"base": "tiny", "clawhub-personal": f"t{t}-v2", "clawhub-personal:v1": f"t{t}-v1",
                      "clawhub-personal:v3": f"t{t}-v3"}
    records = gateway.spy.wait_for(4)
    assert {r.turn_type for r in records} == {"playground"}
    assert sorted(r.adapter_version_id or 0 for r in records) == sorted(
        [0, *AdapterVersion.objects.filter(tenant=user.tenant).values_list("pk", flat=True)])

    missing = ask(gateway, secret, "clawhub-personal:v9")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    other = make_user()
    activate_adapter(other.tenant, version=1)
    assert ask(gateway, secret, "clawhub-group-x:v1").status_code == 403  # a group it is not bound to


def test_an_ordinary_key_cannot_name_a_version(gateway, fake):
    user = make_user()
    activate_adapter(user.tenant, version=1)
    _, secret = make_key(user)
    refused = ask(gateway, secret, "clawhub-personal:v1")
    assert refused.status_code == 403, refused.text
    assert ask(gateway, secret, "clawhub-personal").status_code == 200
