from django.db import models


class PendingGenerationBump(models.Model):
    """A generation bump the shared cache did not take: the change it announces committed while Redis was
    unreachable (clawhub.core.generations). The periodic sweep bumps it again; until then a gateway that still
    confirms the old generation may serve its old copy (a revoked key, the previous adapter)."""

    name = models.CharField(max_length=200, unique=True)
    # The latest failure: the sweep removes a row only if no failure came after its bump.
    failed_at = models.DateTimeField()

    def __str__(self) -> str:
        return self.name
