"""TLS, bearer tokens and client certificates: a lease-proxy started with --tls-cert and
--auth-tokens, its certificates made by the workspace's dev-pki."""

from __future__ import annotations

import hashlib
import os
import secrets
import ssl
import subprocess
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from conftest import ROOT, Etcd, free_port, proxy_binary, stop, wait_until
from lease_proxy_client import AsyncClient, Client, Problem, TransportError


@pytest.fixture(scope="module")
def secure(workdir: Path, etcd: Etcd, key_file: Path) -> Iterator[dict]:
    dev_pki = os.environ.get("DEV_PKI_BIN") or str(ROOT / "target" / "debug" / "dev-pki")
    if not os.access(dev_pki, os.X_OK):
        pytest.fail(f"no dev-pki at {dev_pki}: scripts/python-tests.sh builds it (or set DEV_PKI_BIN)")
    pki = workdir / "pki"
    ca = subprocess.run([dev_pki, str(pki)], check=True, capture_output=True, text=True).stdout.strip()
    token = secrets.token_hex(24)
    tokens = workdir / "tokens"
    tokens.write_text(
        f"robots {hashlib.sha256(token.encode()).hexdigest()} acquire:py-,read:*\noperator cert acquire:*,read:*\n"
    )
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    log = workdir / "secure-proxy.log"
    process = subprocess.Popen(
        [
            proxy_binary(), "--listen", f"127.0.0.1:{port}", "--etcd-endpoints", etcd.url,
            "--etcd-prefix", "/lease-proxy-py-secure/", "--key-file", str(key_file),
            "--data-dir", str(workdir / "secure-proxy"), "--tls-cert", str(pki / "proxy.pem"),
            "--tls-key", str(pki / "proxy.key"), "--tls-client-ca", ca, "--auth-tokens", str(tokens),
        ],
        stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_until(
            lambda: httpx.get(
                f"{url}/readyz", verify=ssl.create_default_context(cafile=ca), timeout=1
            ).status_code
            == 200,
            30,
            "lease-proxy (TLS)",
            log,
        )
        yield {"url": url, "ca": ca, "token": token, "pki": pki}
    finally:
        stop(process)


def test_a_bearer_token_over_tls(secure: dict, resource: str) -> None:
    with Client(secure["url"], verify=secure["ca"], token=secure["token"]) as client:
        with client.lease(resource, ttl=5, holder="robot") as lease:
            holding = client.get(resource)
            assert holding is not None and holding.token == lease.token
        assert client.get(resource) is None
        with pytest.raises(Problem) as refused:
            client.acquire("other-" + resource, ttl=5, holder="robot")  # outside acquire:py-
        assert refused.value.status == 403 and refused.value.slug == "forbidden"


def test_no_token_is_refused_and_an_unknown_ca_is_not_trusted(secure: dict, resource: str) -> None:
    with Client(secure["url"], verify=secure["ca"]) as client:
        with pytest.raises(Problem) as refused:
            client.acquire(resource, ttl=5, holder="anonymous")
        assert refused.value.status == 401 and refused.value.slug == "unauthenticated"
    with Client(secure["url"], token=secure["token"]) as client:  # system CAs only
        with pytest.raises(TransportError):
            client.get(resource)


@pytest.mark.asyncio
async def test_a_client_certificate_names_the_principal(secure: dict, resource: str) -> None:
    pki = secure["pki"]
    cert = (str(pki / "operator.pem"), str(pki / "operator.key"))
    async with AsyncClient(secure["url"], verify=secure["ca"], cert=cert) as client:
        async with client.lease("any-" + resource, ttl=5, holder="operator") as lease:
            assert not lease.lost.is_set()
            holding = await client.get("any-" + resource)
            assert holding is not None and holding.holder == "operator"
