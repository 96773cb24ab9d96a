"""What an upstream's error answer looked like, for logs and stored errors, without what it said. Plain httpx:
the judge, the adapter workers and the gateway's vLLM admin client all use it."""

import httpx


def body_shape(response: httpx.Response) -> str:
    """What an upstream's error body looked like, without what it said: OpenAI-compatible servers echo the
    prompt (a user's conversation) in their messages, and these strings end up in logs and stored errors."""
    kind = response.headers.get("content-type", "").split(";")[0] or "no content type"
    shape = f"{kind}, {len(response.content)} bytes"
    try:
        data = response.json()
    except ValueError:
        return shape
    if not isinstance(data, dict):
        return shape
    shape += f", keys {sorted(str(k) for k in data)[:8]}"
    error = data.get("error")
    if isinstance(error, dict):
        # Short machine codes only (type, code): never the message.
        codes = [f"{k}={error[k]}" for k in ("type", "code")
                 if isinstance(error.get(k), (str, int)) and len(str(error[k])) <= 40]
        shape += "".join(f", {c}" for c in codes)
    return shape
