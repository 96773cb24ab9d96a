"""Literal specs several test modules check against or send, written once: a function tool as the OpenAI chat
API takes it, and the layers a LoRA adapter of the Qwen2 models must cover."""


def function_tool(name: str, description: str, argument: str) -> dict:
    """An OpenAI chat-API function tool taking one required string argument."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object", "properties": {argument: {"type": "string"}}, "required": [argument]
            },
        },
    }


WEATHER_TOOL = function_tool("get_weather", "Get the current weather in a city.", "city")

# Every attention and MLP projection of a Qwen2 block (what TrainConfig targets by default).
LORA_TARGET_MODULES = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
