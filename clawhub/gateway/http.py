"""The raw ASGI pieces /v1 answers with: reading a bounded request body and sending a JSON response."""

from clawhub.gateway.errors import bad_request, too_large

JSON_HEADER = (b"content-type", b"application/json")


class ClientGone(Exception):
    """The client disconnected before its request body arrived: there is nobody to answer."""


async def send_json(send, status: int, body: bytes, headers: list | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [JSON_HEADER, (b"content-length", str(len(body)).encode()), *(headers or ())]})
    await send({"type": "http.response.body", "body": body})


async def read_body(receive, headers: dict[bytes, bytes], limit: int) -> bytes:
    declared = headers.get(b"content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise too_large(limit)
        except ValueError:
            raise bad_request("Invalid Content-Length header.") from None
    # Counted while reading too: a chunked body has no Content-Length to trust.
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body"):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
