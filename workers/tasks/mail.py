"""Account mails (password reset, address verification, "someone tried to sign up with your address"), sent
by the web side through ``clawhub.accounts.services`` after its per-address and per-IP limits allowed them.

The task gets the user's id and the kind of mail, and makes the link itself: no token travels through the
broker, and a reset link is made from the account as it is when the mail goes out.
"""

from clawhub.core import tasks
from workers.celery import app


@app.task(name=tasks.ACCOUNT_MAIL, queue=tasks.HOUSEKEEPING_QUEUE, acks_late=True, max_retries=3,
          default_retry_delay=30)
def send_account_mail(user_id: int, kind: str, next_path: str = "") -> bool:
    from clawhub.accounts.services import account_mail_deliver

    return account_mail_deliver(user_id=user_id, kind=kind, next_path=next_path)
