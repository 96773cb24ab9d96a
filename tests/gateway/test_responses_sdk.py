"""POST /v1/responses in front of the fake upstream, driven by the official openai SDK's Responses client as
Codex CLI drives it (store: false, the whole conversation as input): served through the chat route, captured
and linked."""

import openai
import pytest

from clawhub.conversations.capture.store import capture_store
from clawhub.conversations.models import Turn
from tests.gateway.conftest import user_with_adapter

SEARCH = {"type": "function", "name": "search", "description": "Search the notes",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}


def client(gateway, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.v1, api_key=secret, max_retries=0)


@pytest.fixture
def carol():
    user, _, secret, version = user_with_adapter()
    return user, secret, version


def test_a_turn_is_served_by_the_tenants_adapter_and_captured_with_token_ids(gateway, fake, carol):
    user, secret, version = carol
    response = client(gateway, secret).responses.create(
        model="clawhub-personal", instructions="Be brief.", input="hi there", store=False,
        max_output_tokens=8, extra_headers={"session_id": "codex-conv-1"})
    assert response.object == "response" and response.status == "completed"
    assert response.model == "clawhub-personal"
    assert response.output_text.startswith(f"t{user.tenant.pk}-v1 says")
    sent = fake.stats()["last_request"]
    assert sent["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "hi there"}]
    assert sent["model"] == f"t{user.tenant.pk}-v1" and sent["return_token_ids"] is True
    record = gateway.spy.last()
    assert record.route == "chat" and record.status == "complete" and record.session_id == "codex-conv-1"
    assert record.adapter_version_id == version.pk and len(record.token_ids) == len(record.logprobs) == 8
    assert response.id == f"resp_{record.request_id}" and response.usage.output_tokens == 8
    assert response.usage.input_tokens == record.prompt_tokens


def test_a_stream_is_responses_events_and_the_sdk_assembles_the_reply(gateway, fake, carol):
    user, secret, _ = carol
    with client(gateway, secret).responses.stream(
            model="clawhub-personal", input=[{"role": "user", "content": "hi there"}], store=False,
            max_output_tokens=8) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") == 8
    assert final.output_text.startswith(f"t{user.tenant.pk}-v1 says") and final.usage.output_tokens == 8
    record = gateway.spy.last()
    assert record.stream and record.status == "complete" and record.choices[0]["message"]["content"] == \
        final.output_text


def test_a_tool_round_is_captured_and_the_next_request_links_to_the_turn(gateway, fake, carol):
    user, secret, _ = carol
    responses = client(gateway, secret).responses
    history: list = [{"role": "user", "content": "find my notes on vLLM"}]
    first = responses.create(model="clawhub-personal", input=history, tools=[SEARCH],
                             tool_choice="required", store=False, max_output_tokens=8, stream=True)
    events = list(first)
    done = events[-1].response
    call = done.output[-1]
    assert call.type == "function_call" and call.name == "search"
    assert call.arguments == f'{{"query": "t{user.tenant.pk}-v1"}}'
    # Codex sends the conversation back: its input, the reply's items, and the tool's output.
    history += [item.model_dump(exclude_none=True) for item in done.output]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "vLLM serves LoRA."})
    second = responses.create(model="clawhub-personal", input=history, tools=[SEARCH], store=False,
                              max_output_tokens=8)
    assert second.status == "completed" and second.output_text

    capture_store(gateway.spy.wait_for(2))
    turns = list(Turn.objects.filter(user=user).order_by("created_at"))
    assert len(turns) == 2 and turns[1].parent_id == turns[0].pk and turns[1].link == "next"
    assert [(t.route, t.api) for t in turns] == [("chat", "responses")] * 2
    assert turns[0].next_state == [
        {"role": "tool", "tool_call_id": call.call_id, "content": "vLLM serves LoRA."}]


def test_stored_responses_are_refused_with_an_openai_error(gateway, fake, carol):
    _, secret, _ = carol
    with pytest.raises(openai.BadRequestError) as caught:
        client(gateway, secret).responses.create(model="clawhub-personal", input="x", store=True)
    assert caught.value.body["param"] == "store" and "store: false" in caught.value.body["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        client(gateway, secret).responses.create(model="clawhub-personal", input="x",
                                                 previous_response_id="r1")
    assert caught.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.AuthenticationError):
        client(gateway, "chk_wrong").responses.create(model="clawhub-personal", input="x")
