from django.apps import AppConfig


class FeedbackConfig(AppConfig):
    name = "clawhub.feedback"
