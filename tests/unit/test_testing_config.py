"""sepp.testing's check of a test's server config against the tested version's keys and types."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sepp.testing import SeppServerStartError, sepp_server
from sepp.testing._config_schema import config_problem


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ({"limts": {}}, "unknown config key 'limts'; the top level has: admin, auth, limits,"),
        ({"limits": {"max_enqueue_batch": True}}, "'limits.max_enqueue_batch' must be an integer"),
        ({"limits": {"max_enqueue_batch": -1}}, "'limits.max_enqueue_batch' must be an integer"),
        ({"limits": {"max_payload_bytes": 2**63}}, "must be a non-negative integer, got"),
        ({"limits": 5}, "config key 'limits' must be a table, got int"),
        ({"storage": {"persist_mode": "fast"}}, "must be one of 'sync_all', 'sync_data', 'buffer'"),
        ({"server": {"listen_addr": "localhost:1"}}, 'must be an "IP:PORT" string'),
        ({"server": {"strict_queues": "yes"}}, "'server.strict_queues' must be a boolean"),
        ({"queues": {"name": "q"}}, "config key 'queues' must be a list of tables, got dict"),
        ({"queues": [{"name": "q", "allowed_job_type": ["t"]}]}, "'queues[0].allowed_job_type'"),
        ({"queues": [{"name": "q", "allowed_job_types": "t"}]}, "must be a list of strings"),
        ({"auth": {"api_keys": ["k"]}}, "config key auth.api_keys[0] must be a table, got str"),
        ({"auth": {"api_keys": [{"name": "n", "secret": "k"}]}}, "'auth.api_keys[0].secret'"),
        ({"admin": {"keys": [{"name": "n", "key": "k", "role": "root"}]}}, "'viewer', 'operator'"),
        ({"tracing": {"sample_ratio": float("nan")}}, "'tracing.sample_ratio' must be a number"),
    ],
)
def test_a_wrong_key_or_type_is_named_with_what_it_expects(
    config: dict[str, object], problem: str
) -> None:
    found = config_problem(config)
    assert found is not None and problem in found


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"storage": {"persist_mode": "buffer", "dead_letter_retention_ms": 600_000}},
        {"admin": {"enabled": False}, "limits": {"max_enqueue_batch": 10, "retry_backoff": None}},
        {"server": {"listen_addr": "[::1]:0", "strict_queues": True}},
        {"queues": [{"name": "q", "allowed_job_types": ["a"], "dedup_window_ms": -1}]},
        {"auth": {"api_keys": [{"name": "n", "key": "k"}]}, "tracing": {"sample_ratio": 1}},
    ],
)
def test_configs_the_server_takes_pass(config: dict[str, object]) -> None:
    assert config_problem(config) is None


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3)
        ),
        max_leaves=10,
    )
)
def test_any_config_is_accepted_or_named_as_a_problem(config: object) -> None:
    if isinstance(config, dict):
        problem = config_problem(config)
        assert problem is None or problem.startswith(("unknown config key", "config key"))


async def test_sepp_server_refuses_a_bad_config_before_looking_for_the_binary(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SEPP_BIN", "/nonexistent/sepp")  # never reached
    with pytest.raises(SeppServerStartError, match="check_config=False skips this check"):
        async with sepp_server({"limits": {"max_payload_byte": 1}}):
            pass  # pragma: no cover
