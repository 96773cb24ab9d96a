"""Template context every page gets from accounts."""

from clawhub.accounts.selectors import local_mailbox_enabled


def local_mailbox(request) -> dict[str, bool]:
    """Whether the navigation offers the local mailbox (the site keeps its mail instead of sending it)."""
    return {"local_mailbox": local_mailbox_enabled()}
