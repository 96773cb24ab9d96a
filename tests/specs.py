"""Literal specs several test modules check against or send, written once: a function tool as the OpenAI chat
API takes it, and the layers a LoRA adapter of the Qwen2 models must cover."""


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


WEATHER_TOOL = function_tool("get_weather", "Get the current weather in a city.", "city")
# The gateway's tool-call tests (the fake upstream and real vLLM): the tiny model writes a well-formed call of
# this tool, asked a question shaped like those of its corpus; NAMED_WEATHER names it as the tool_choice.
WEATHER_DESCRIBED = function_tool("get_weather", "Get the current weather in a city.", "city",
                                  "The city name.")
WEATHER_MSGS = [{"role": "user", "content": "What is the weather like in Paris today?"}]
NAMED_WEATHER = {"type": "function", "function": {"name": "get_weather"}}

# Every attention and MLP projection of a Qwen2 block (what TrainConfig targets by default).
LORA_TARGET_MODULES = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
