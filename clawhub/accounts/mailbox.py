"""The local mailbox: an email backend that keeps each mail in the database for its recipient to read under
/mailbox/, for a site with no mail server (the embedded default). It proves nothing about who owns an
address: whoever signs up with one reads its mail, so a site whose accounts must be tied to real mailboxes
sets EMAIL_URL instead (production's default backend is not this one)."""

from email.utils import getaddresses

from django.core.mail.backends.base import BaseEmailBackend

from clawhub.accounts.models import MailboxMessage
from clawhub.accounts.selectors import email_normalize


class EmailBackend(BaseEmailBackend):
    def send_messages(self, email_messages) -> int:
        sent = 0
        for message in email_messages:
            addresses = [address for _name, address in getaddresses(message.recipients()) if address]
            MailboxMessage.objects.bulk_create(
                MailboxMessage(to_email=email_normalize(address), subject=str(message.subject)[:255],
                               body=message.body)
                for address in addresses)
            sent += bool(addresses)
        return sent
