"""The proxy tests need nginx and HAProxy (`bash scripts/ensure-proxies.sh`, which `make test`
runs); without them they fail, loudly, and say how to get them."""

from __future__ import annotations

import pytest
from fixtures.proxies import ProxyNotInstalled, require_proxy


@pytest.fixture(autouse=True)
def _proxies_installed() -> None:
    try:
        require_proxy("nginx")
        require_proxy("haproxy")
    except ProxyNotInstalled as exc:
        pytest.fail(str(exc), pytrace=False)
