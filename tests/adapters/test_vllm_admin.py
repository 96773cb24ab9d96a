"""The one vLLM admin client: what counts as loaded and unloaded, the requests it sends, sync and async."""

import asyncio
import json

import httpx

from clawhub.adapters.vllm_admin import VllmAdmin, adapter_names, load_answer, unload_answer


def answer(status: int, body: dict | str) -> httpx.Response:
    text = body if isinstance(body, str) else json.dumps(body)
    return httpx.Response(status, text=text, request=httpx.Request("POST", "http://up/v1/x"))


def test_a_second_load_counts_as_loaded_and_a_refusal_does_not():
    assert load_answer(answer(200, "Success")).done
    again = load_answer(answer(400, {"message": "The lora adapter 't1-v1' has already been loaded."}))
    assert again.done and again.already
    refused = load_answer(answer(400, {"message": "No adapter found at /nowhere"}))
    assert not refused.done and refused.status == 400 and refused.shape
    assert "nowhere" not in refused.shape  # the shape of the body, never its text
    assert not load_answer(answer(500, "boom")).done


def test_unloading_a_name_the_upstream_does_not_hold_counts_as_unloaded():
    assert unload_answer(answer(200, "")).done
    assert unload_answer(answer(404, {"message": "t1-v1 not found"})).already
    assert unload_answer(answer(400, {"message": "The lora adapter 't1-v1' cannot be found."})).done
    assert not unload_answer(answer(400, {"message": "bad request"})).done
    assert not unload_answer(answer(503, "busy")).done


def test_adapter_names_are_the_models_with_a_parent():
    models = [{"id": "tiny"}, {"id": "t1-v1", "parent": "tiny"}, {"parent": "tiny"}, "junk",
              {"id": "t2-v3", "parent": "tiny"}]
    assert adapter_names(models) == {"t1-v1", "t2-v3"}


def _recording_transport(seen: list[httpx.Request]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}, {"id": "t1-v1", "parent": "tiny"}]})
        return httpx.Response(200, text="Success")

    return httpx.MockTransport(handle)


def test_sync_calls_send_the_names_paths_and_key():
    seen: list[httpx.Request] = []
    admin = VllmAdmin("http://up", {"authorization": "Bearer k"})
    with httpx.Client(transport=_recording_transport(seen)) as client:
        assert admin.load(client, name="t1-v1", path="/srv/a").done
        assert admin.unload(client, name="t1-v1").done
        assert adapter_names(admin.models(client)) == {"t1-v1"}
    assert [(r.method, r.url.path) for r in seen] == [
        ("POST", "/v1/load_lora_adapter"), ("POST", "/v1/unload_lora_adapter"), ("GET", "/v1/models")]
    assert json.loads(seen[0].content) == {"lora_name": "t1-v1", "lora_path": "/srv/a"}
    assert json.loads(seen[1].content) == {"lora_name": "t1-v1"}
    assert all(r.headers["authorization"] == "Bearer k" for r in seen)


def test_async_calls_match_the_sync_ones_and_a_bad_listing_is_none():
    seen: list[httpx.Request] = []
    admin = VllmAdmin("http://up", {})

    async def run():
        async with httpx.AsyncClient(transport=_recording_transport(seen)) as client:
            loaded = await admin.load_async(client, name="t1-v1", path="/srv/a")
            models = await admin.models_async(client)
        broken = httpx.MockTransport(lambda request: httpx.Response(200, text="not json"))
        async with httpx.AsyncClient(transport=broken) as client:
            return loaded, models, await admin.models_async(client)

    loaded, models, bad = asyncio.run(run())
    assert loaded.done and adapter_names(models) == {"t1-v1"} and bad is None
    assert json.loads(seen[0].content) == {"lora_name": "t1-v1", "lora_path": "/srv/a"}
