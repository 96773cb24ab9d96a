from django.apps import AppConfig


class WebConfig(AppConfig):
    name = "clawhub.web"
