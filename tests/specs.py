"""Literal specs several test modules check against or send, written once: a function tool as the OpenAI chat
API takes it, a chat-completions stream chunk as vLLM sends it, and the layers a LoRA adapter of the Qwen2
models must cover."""


def function_tool(name: str, description: str, argument: str, argument_description: str = "") -> dict:
    """An OpenAI chat-API function tool taking one required string argument (described, if given)."""
    schema = {"type": "string"} | ({"description": argument_description} if argument_description else {})
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": {argument: schema}, "required": [argument]},
        },
    }



def chat_chunk(delta: dict | None = None, finish_reason: str | None = None, usage: dict | None = None,
               **fields) -> dict:
    """A chat-completions stream chunk as vLLM sends it: ``fields`` (id, model), one choice with ``delta``
    (none for ``delta=None``: the closing usage chunk) and ``usage`` when given."""
    chunk = {**fields, "choices": [] if delta is None else [
        {"index": 0, "delta": delta, "finish_reason": finish_reason}]}
    if usage:
        chunk["usage"] = usage
    return chunk

WEATHER_TOOL = function_tool("get_weather", "Get the current weather in a city.", "city")
# The gateway's tool-call tests (the fake upstream and real vLLM): the tiny model writes a well-formed call of
# this tool, asked a question shaped like those of its corpus; NAMED_WEATHER names it as the tool_choice.
WEATHER_DESCRIBED = function_tool("get_weather", "Get the current weather in a city.", "city",
                                  "The city name.")
WEATHER_MSGS = [{"role": "user", "content": "What is the weather like in Paris today?"}]
NAMED_WEATHER = {"type": "function", "function": {"name": "get_weather"}}

# Every attention and MLP projection of a Qwen2 block (what TrainConfig targets by default).
LORA_TARGET_MODULES = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
