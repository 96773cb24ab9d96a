"""Database connections held by long-lived threads (the capture consumer, the gateway's read threads)."""


def keep_usable_connection() -> None:
    """Closes this thread's database connection only if an error left it broken (the next query opens a
    new one). Not ``close_old_connections``: with DATABASE_CONN_MAX_AGE=0 (the web's default) that
    reconnects for every batch, which cost the consumer more CPU than the small batches it stores."""
    from django.db import connection

    if connection.connection is not None and connection.errors_occurred:
        if connection.is_usable():
            connection.errors_occurred = False
        else:
            connection.close()
