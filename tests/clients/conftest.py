"""Fixtures for the real agent CLIs (Codex CLI, Claude Code) against a gateway in front of the shared tiny
vLLM: the gateway's traffic recorded, vendor hosts refused by a local proxy, a user with a key."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.clients.traffic import Recorder, VendorTrap
from tests.factories import make_key, make_user
from tests.gateway.conftest import GatewayServer, forget_tenant_adapters, gateway_factory  # noqa: F401


@dataclass
class CliGateway:
    gateway: GatewayServer
    recorder: Recorder

    @property
    def url(self) -> str:
        return self.gateway.url


@pytest.fixture
def cli_gateway(gateway_factory, vllm_server) -> CliGateway:  # noqa: F811
    forget_tenant_adapters(vllm_server.base_url)
    recorder = Recorder()
    return CliGateway(gateway_factory([vllm_server.base_url], wrap=recorder.wrapping), recorder)


@pytest.fixture
def vendor_trap():
    trap = VendorTrap()
    yield trap
    trap.close()


@pytest.fixture
def cli_user():
    """A user and a key of theirs: (user, key, secret). Their model is the base model (no adapter yet)."""
    user = make_user()
    key, secret = make_key(user)
    return user, key, secret
