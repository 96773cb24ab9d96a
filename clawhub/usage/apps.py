from django.apps import AppConfig


class UsageConfig(AppConfig):
    name = "clawhub.usage"

    def ready(self) -> None:
        from clawhub.conversations.capture import store
        from clawhub.usage.services import usage_record

        # Capture meters every served request in the transaction that stores its turn; conversations sits
        # below this app and imports none of it, so the writer is handed over here.
        store.register_usage_recorder(usage_record)
