"""A user's control over their own data: withdrawing samples, the training and storage switches (for the
account and per key), the export of everything ClawHub holds about them, and deleting the account.

Pages under /privacy/, the REST API under /api/me/. No models of its own: it reads and writes the rows of
accounts, keys, review and the apps an account deletion reaches. What capture may store is decided in
``clawhub.conversations.privacy`` from the switches set here.
"""
