"""Reads of the gateway's registry: which upstream holds which adapter."""

from clawhub.gateway.models import LoadedAdapter, Upstream


def upstreams_list():
    return Upstream.objects.all()


def loaded_adapters_for_version(*, adapter_version_id: int):
    return LoadedAdapter.objects.filter(adapter_version_id=adapter_version_id).select_related("upstream")
