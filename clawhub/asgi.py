"""ASGI entry point: the Django web app (the /v1 gateway is mounted in front of it by the gateway issue)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "clawhub.settings.base")
application = get_asgi_application()
