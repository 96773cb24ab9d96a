from django.apps import AppConfig


class AdaptersConfig(AppConfig):
    name = "clawhub.adapters"
