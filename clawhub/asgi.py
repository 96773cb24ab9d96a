"""ASGI entry point: /v1 goes to the gateway's raw ASGI app, everything else to Django.

The gateway skips Django's request/middleware stack on purpose (its per-request budget is a few milliseconds
of CPU). Lifespan events go to the gateway too: it starts and stops its upstream client, quota limiter,
capture writer and health checker with the server.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "clawhub.settings.base")
django_application = get_asgi_application()

from clawhub.gateway.app import Gateway  # noqa: E402  (needs Django set up)

gateway = Gateway()


async def application(scope, receive, send):
    if scope["type"] == "lifespan":
        await gateway(scope, receive, send)
        return
    path = scope.get("path", "")
    if path.startswith("/v1/") or path == "/v1":
        await gateway(scope, receive, send)
        return
    await django_application(scope, receive, send)
