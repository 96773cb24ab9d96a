"""Fixtures for the real agent CLIs (Codex CLI, Claude Code) against a gateway in front of the shared tiny
vLLM: the gateway's traffic recorded, vendor hosts refused by a local proxy, a user with a key."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.clients.traffic import AtLeastTokens, Recorder, VendorTrap
from tests.factories import make_key, make_user
from tests.gateway.conftest import GatewayServer, forget_tenant_adapters, gateway_factory, serve_asgi  # noqa: F401


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
def cli_gateway_no_empty_replies(gateway_factory, vllm_server) -> CliGateway:  # noqa: F811
    """``cli_gateway`` whose vLLM samples at least a few tokens per chat request. The tiny model ends most of
    its replies to Codex's 8k-token prompt at once (8 empty replies in 8 attempts in a full run), and a
    client keeps nothing of an empty reply to send back."""
    forget_tenant_adapters(vllm_server.base_url)
    url, server, thread = serve_asgi(AtLeastTokens(vllm_server.base_url))
    recorder = Recorder()
    yield CliGateway(gateway_factory([url], wrap=recorder.wrapping), recorder)
    server.should_exit = True
    thread.join(20)


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
