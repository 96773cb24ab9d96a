"""Capture: every /v1 request the gateway served becomes stored turns, and none is lost on the way.

A turn's path, in one direction (the gateway calls into this package; nothing here imports the gateway):

- ``records``: the TurnRecord the gateway fills while it serves, and its encoding on the hand-off.
- ``writer``: the gateway's side, on its event loop: the in-flight journal, then the record handed off to the
  Redis stream, or to the local spool when Redis does not answer or is over its bound; ``housekeeping``,
  its part that syncs the spool and forwards it to the stream once Redis is back.
- ``handoff`` (settings, what /metrics and /readyz report) and ``spool`` (the local segment files): the
  durable log between serving and storing.
- ``consumer`` (``manage.py capture_consumer``): reads the log, stores batches, acknowledges after commit,
  retries and dead-letters what fails.
- ``store``: one batch in one transaction; ``items`` (record -> turn), ``graph`` (the stored turns a batch
  links to), ``linking`` (sessions, parents, next states), ``compact`` (what each turn adds to its base) and
  ``rows`` (COPY and bulk UPDATE).
- ``status``: the log's readiness check and gauges, registered by the conversations app.
"""
