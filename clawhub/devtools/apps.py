from django.apps import AppConfig


class DevtoolsConfig(AppConfig):
    # An app only so that Django finds its management commands; it has no models.
    name = "clawhub.devtools"
