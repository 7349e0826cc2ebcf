"""The command line's parsers, without a server: values, job lines, dead-letter records, the
refusal of secrets on the command line, and the isolation of `import sepp` from all of it."""

from __future__ import annotations

import argparse
import io
import json
import math
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

import sepp
from sepp._cli import main
from sepp._cli._enqueue_file import JOB_KEYS, InvalidLine, request_from_line
from sepp._cli._output import Progress
from sepp._cli._parser import build_parser
from sepp._cli._records import (
    RecordFormatError,
    payload_to_json,
    record_from_json,
    record_to_json,
    replay_request,
)
from sepp._cli._values import timestamp, typed_custom_value

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)

# -- typed --custom values --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("5", 5),
        ("-3", -3),
        ("+7", 7),
        ("007", 7),
        ("5.0", 5.0),
        ("1e3", 1000.0),
        ("-.5", -0.5),
        ("2.", 2.0),
        ("true", True),
        ("false", False),
        ("True", "True"),
        ("nan", "nan"),
        ("inf", "inf"),
        ("1e999", "1e999"),  # not finite: kept as text
        ("1_000", "1_000"),
        ("0x10", "0x10"),
        ("5a", "5a"),
        ("", ""),
        (" 5", " 5"),
    ],
)
def test_custom_value_typing(text: str, value: object) -> None:
    typed = typed_custom_value(text)
    assert typed == value and type(typed) is type(value)


@given(INT64)
def test_any_int64_stays_an_int(number: int) -> None:
    typed = typed_custom_value(str(number))
    assert type(typed) is int and typed == number


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_any_finite_float_stays_a_float(number: float) -> None:
    typed = typed_custom_value(repr(number))
    assert type(typed) is float and typed == number


@given(st.text(alphabet=st.characters(categories=["L"])))
def test_words_stay_strings(text: str) -> None:
    if text not in ("true", "false"):
        assert typed_custom_value(text) == text


def test_timestamps_need_an_offset() -> None:
    utc = datetime(2030, 1, 31, 9, 0, tzinfo=timezone.utc)
    assert timestamp("2030-01-31T09:00:00Z") == utc
    assert timestamp("2030-01-31T11:00:00+02:00") == utc
    assert timestamp("2030-01-31T09:00z").tzinfo == timezone.utc
    for bad in ("2030-01-31T09:00:00", "tomorrow", "", "Z"):
        with pytest.raises(Exception, match=r"UTC offset|ISO 8601"):
            timestamp(bad)


# -- enqueue-file lines -----------------------------------------------------------------------


def test_a_full_job_line() -> None:
    line = json.dumps(
        {
            "queue": "q",
            "job_type": "t",
            "json": {"a": [1, 2]},
            "priority": 3,
            "max_attempts": 2,
            "idempotency_key": "k",
            "custom": {"i": 1, "f": 1.0, "b": False, "s": "x"},
            "scheduled_at": "2030-01-01T00:00:00Z",
        }
    )
    request = request_from_line(line)
    assert request == sepp.EnqueueRequest(
        "q",
        "t",
        payload=sepp.Payload.json({"a": [1, 2]}),
        priority=3,
        max_attempts=2,
        idempotency_key="k",
        custom={"i": 1, "f": 1.0, "b": False, "s": "x"},
        scheduled_at=datetime(2030, 1, 1, tzinfo=timezone.utc),
    )
    assert type(request.custom["f"]) is float and type(request.custom["i"]) is int
    text = request_from_line('{"queue": "q", "job_type": "t", "text": "hé"}')
    assert text.payload == sepp.Payload.text("hé")
    assert request_from_line('{"queue": "q", "job_type": "t"}').payload is None


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{", "not JSON"),
        ('{"queue": "q", "job_type": "t", "json": NaN}', "NaN is not JSON"),
        ('{"queue": "q", "job_type": "t", "json": [-Infinity]}', "-Infinity is not JSON"),
        ('{"queue": "q", "job_type": "t", "json": 1e400}', "payload: not JSON-serialisable"),
        ("[]", "expected a JSON object, got list"),
        ('"q"', "expected a JSON object, got str"),
        ('{"job_type": "t"}', "'queue' is required"),
        ('{"queue": "q", "job_type": "t", "extra": 1}', "unknown key(s) 'extra'"),
        ('{"queue": "q", "job_type": "t", "json": 1, "text": "x"}', "not both"),
        ('{"queue": "q", "job_type": "t", "text": ""}', "payload"),
        ('{"queue": "q", "job_type": "t", "text": 5}', "payload"),
        ('{"queue": "", "job_type": "t"}', "queue: must not be empty"),
        ('{"queue": "q", "job_type": "t", "priority": true}', "priority: must be an int"),
        ('{"queue": "q", "job_type": "t", "max_attempts": 0}', "max_attempts"),
        ('{"queue": "q", "job_type": "t", "custom": []}', "'custom' must be an object"),
        ('{"queue": "q", "job_type": "t", "custom": {"k": null}}', "custom['k']"),
        ('{"queue": "q", "job_type": "t", "custom": {"k": 1e400}}', None),
        ('{"queue": "q", "job_type": "t", "scheduled_at": 5}', "ISO 8601 string"),
        ('{"queue": "q", "job_type": "t", "scheduled_at": "2030-01-01"}', "UTC offset"),
    ],
)
def test_bad_lines_are_invalid_with_a_reason(line: str, message: str | None) -> None:
    if message is None:  # 1e400 parses as inf: a float the server stores as such
        assert math.isinf(float(request_from_line(line).custom["k"]))
        return
    with pytest.raises(InvalidLine) as info:
        request_from_line(line)
    assert message in str(info.value)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | INT64
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@given(st.text())
def test_any_text_is_a_request_or_an_invalid_line(line: str) -> None:
    try:
        assert isinstance(request_from_line(line), sepp.EnqueueRequest)
    except InvalidLine:
        pass


@given(st.dictionaries(st.sampled_from([*JOB_KEYS, "other"]), JSON_VALUES))
def test_any_object_is_a_request_or_an_invalid_line(job: dict[str, object]) -> None:
    try:
        request = request_from_line(json.dumps(job))
    except InvalidLine:
        return
    assert (request.queue, request.job_type) == (job["queue"], job["job_type"])


# -- dead-letter records ----------------------------------------------------------------------

TIMES = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(timezone.utc)
)
ENCODINGS = st.sampled_from(
    ["application/json", "text/plain; charset=utf-8", "application/octet-stream", "x/y"]
)
PAYLOADS = st.one_of(
    st.none(),
    st.builds(sepp.Payload, st.binary(min_size=1), ENCODINGS),
    st.builds(sepp.Payload.json, JSON_VALUES),
    st.builds(lambda text: sepp.Payload(text.encode(), "application/json"), st.text(min_size=1)),
)
CUSTOM_VALUES = st.one_of(
    st.booleans(), INT64, st.floats(allow_nan=False, allow_infinity=False), st.text()
)
RECORDS = st.builds(
    sepp.DeadLetterRecord,
    job_id=st.uuids().map(str),
    queue=st.text(min_size=1),
    job_type=st.text(min_size=1),
    payload=PAYLOADS,
    priority=st.integers(0, 9),
    attempt=st.integers(1, 100),
    max_attempts=st.integers(1, 100),
    custom=st.dictionaries(st.text(min_size=1), CUSTOM_VALUES, max_size=4),
    trace_context=st.none()
    | st.builds(sepp.TraceContext, st.text(min_size=1), st.none() | st.text()),
    enqueued_at=st.none() | TIMES,
    scheduled_at=st.none() | TIMES,
    cause=st.sampled_from(sepp.DeadLetterCause),
    failed_at=st.none() | TIMES,
    final_attempt=st.integers(0, 100),
    last_reason=st.none() | st.text(),
)


@given(RECORDS)
def test_records_survive_a_json_line_round_trip_exactly(record: sepp.DeadLetterRecord) -> None:
    line = json.dumps(record_to_json(record))
    back = record_from_json(json.loads(line))
    assert back == record
    for key, value in record.custom.items():
        assert type(back.custom[key]) is type(value)


def test_payloads_are_readable_when_that_keeps_their_bytes() -> None:
    assert payload_to_json(sepp.Payload.json({"a": 1})) == {
        "encoding": "application/json",
        "json": {"a": 1},
    }
    spaced = sepp.Payload(b'{"a": 1}', "application/json")  # not our canonical form
    assert payload_to_json(spaced) == {"encoding": "application/json", "text": '{"a": 1}'}
    assert payload_to_json(sepp.Payload(b"\xff", "x/y")) == {"encoding": "x/y", "base64": "/w=="}
    # Python reads 1e400 as inf, which is not JSON to write back: the exact text is kept.
    huge = sepp.Payload(b"[1e400]", "application/json")
    assert payload_to_json(huge) == {"encoding": "application/json", "text": "[1e400]"}


@pytest.mark.parametrize(
    "mangle",
    [
        lambda r: r.pop("job"),
        lambda r: r.update(cause="exploded"),
        lambda r: r["job"].update(priority="high"),
        lambda r: r["job"].update(attempt=True),
        lambda r: r["job"].update(enqueued_at="yesterday"),
        lambda r: r["job"].update(enqueued_at="2030-01-01T00:00:00"),
        lambda r: r["job"].update(payload={"encoding": "x/y", "base64": "!!"}),
        lambda r: r["job"].update(payload=[1]),
        lambda r: r["job"].update(custom={"k": [1]}),
    ],
)
def test_a_mangled_record_is_refused(mangle: object) -> None:
    record = sepp.DeadLetterRecord(
        "id-1", "q", "t", sepp.Payload.text("x"), 0, 1, 1, {}, None,
        None, None, sepp.DeadLetterCause.REJECTED, None, 1, "why",
    )  # fmt: skip
    obj = record_to_json(record)
    mangle(obj)  # type: ignore[operator]
    with pytest.raises(ValueError) as info:
        record_from_json(obj)
    assert isinstance(info.value, (RecordFormatError, sepp.ValidationError))


def test_replayed_jobs_are_keyed_by_the_dead_jobs_id() -> None:
    record = sepp.DeadLetterRecord(
        "0b7c", "q", "t", sepp.Payload.text("x"), 4, 3, 3, {"n": 1}, None,
        None, datetime(2030, 1, 1, tzinfo=timezone.utc), sepp.DeadLetterCause.ATTEMPTS_EXHAUSTED,
        None, 3, "boom",
    )  # fmt: skip
    request = replay_request(record)
    assert request.idempotency_key == "replay-0b7c"
    assert (request.queue, request.job_type, request.priority, request.max_attempts) == (
        "q",
        "t",
        4,
        3,
    )
    assert request.payload == record.payload and request.custom == {"n": 1}
    assert request.scheduled_at is None  # a replay runs now


# -- the entry point ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--api-key", "hunter2-secret", "info"],
        ["--api-key=hunter2-secret", "info"],
        ["info", "--API_KEY", "hunter2-secret"],
        ["info", "--apikey=hunter2-secret"],
        ["enqueue", "q", "t", "--token", "hunter2-secret"],
        ["info", "-api-key=hunter2-secret"],
    ],
)
def test_secrets_on_the_command_line_are_refused_without_echo(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and "hunter2" not in err
    assert err.strip() == (
        "sepp-trio: error: the API key is read only from $SEPP_API_KEY, never from a flag (the"
        " command line is visible to every user of this machine)"
    )


def test_options_are_never_abbreviated(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--addr=x:1", "info"]) == 2
    assert "unrecognized arguments: --addr=x:1" in capsys.readouterr().err
    assert main(["enqueue", "q", "t", "--idem", "k"]) == 2
    assert main(["dead-letters", "drain", "--ma", "1"]) == 2


GLOBAL_OPTIONS = [
    "--address",
    "h:1",
    "--tls-ca-cert",
    "ca.pem",
    "--tls-domain",
    "sepp.internal",
    "--connect-timeout",
    "2",
    "--log-level",
    "debug",
    "--log-format",
    "json",
    "--debug",
]
COMMANDS = [
    ["worker", "app:router", "--queue", "q"],
    ["scheduler", "app:scheduler"],
    ["info"],
    ["enqueue", "q", "t"],
    ["enqueue-file", "jobs.jsonl"],
    ["dead-letters", "drain"],
    ["dead-letters", "replay", "--from", "saved.jsonl"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c[:2]) for c in COMMANDS])
def test_global_options_may_come_before_or_after_the_command(command: list[str]) -> None:
    parser = build_parser()
    before = parser.parse_args([*GLOBAL_OPTIONS, *command])
    after = parser.parse_args([*command, *GLOBAL_OPTIONS])
    assert vars(before) == vars(after)
    assert (after.address, after.tls_ca_cert, after.tls_domain) == (
        "h:1",
        "ca.pem",
        "sepp.internal",
    )
    assert (after.connect_timeout, after.log_level, after.log_format, after.debug) == (
        2.0,
        "debug",
        "json",
        True,
    )


def test_an_option_left_out_after_the_command_keeps_the_value_given_before_it() -> None:
    parser = build_parser()
    args = parser.parse_args(["--log-format", "json", "--address", "h:1", "info", "--debug"])
    assert (args.log_format, args.address, args.debug) == ("json", "h:1", True)
    args = parser.parse_args(["--address", "h:1", "info", "--address", "h:2"])
    assert args.address == "h:2"  # the later one wins, as for any repeated option
    defaults = parser.parse_args(["info"])
    assert (defaults.log_format, defaults.log_level, defaults.debug, defaults.tls) == (
        None,
        None,
        False,
        False,
    )
    assert defaults.connect_timeout == 5.0


def _commands(
    parser: argparse.ArgumentParser, path: str = ""
) -> dict[str, argparse.ArgumentParser]:
    """Every command and action the parser runs ("info", "outbox relay", ...), with its parser."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= _commands(sub, f"{path} {name}".strip())
    return found or {path: parser}


def test_the_commands_that_run_until_signalled_log_at_info_and_the_help_says_which() -> None:
    parser = build_parser()
    commands = _commands(parser)
    assert {"info", "queues", "dead-letters list", "outbox relay", "outbox init"} <= set(commands)
    at_info = {n for n, p in commands.items() if p.get_default("default_log_level") == "info"}
    assert at_info == {"worker", "scheduler", "outbox relay", "dev-server"}
    (option,) = [a for a in parser._actions if "--log-level" in a.option_strings]
    assert option.help is not None
    named = option.help.split("default: info for ", 1)[1].split(", else warning", 1)[0]
    assert sorted(named.replace(" and ", ", ").split(", ")) == sorted(at_info)


def test_help_and_version_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"sepp-trio {sepp.__version__}"
    assert main(["worker", "--help"]) == 0
    assert "a second signal stops at once" in " ".join(capsys.readouterr().out.split()).lower()


def test_progress_is_drawn_only_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for stream, shown in ((Terminal(), True), (io.StringIO(), False)):
        progress = Progress(stream)
        progress.update("1 of 2")
        progress.note("line 3: invalid")
        progress.update("2 of 2")
        progress.clear()
        text = stream.getvalue()
        assert ("\r" in text and "2 of 2" in text) is shown
        assert "line 3: invalid\n" in text  # notes always show


def test_import_sepp_loads_neither_the_cli_nor_argparse() -> None:
    code = (
        "import sys, sepp; print(sorted(m for m in sys.modules"
        " if m.startswith('sepp._cli.') or m in ('sepp._cli', 'argparse', 'sepp.__main__')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert loaded.strip() == "[]"
    assert sepp.Router.__module__ == "sepp"  # presented as sepp.Router
    assert "Router" in sepp.__all__


def test_durations_and_timestamps_in_json_output() -> None:
    from sepp._cli._output import json_value

    moment = datetime(2030, 1, 1, tzinfo=timezone.utc)
    assert json_value(moment) == "2030-01-01T00:00:00+00:00"
    assert json_value(timedelta(minutes=5)) == 300.0
    assert json_value(("v1",)) == ["v1"]


def test_worker_probe_options_default_to_30s_lag_and_a_1s_warning() -> None:
    parser = build_parser()
    args = parser.parse_args(["worker", "app:router", "--queue", "q"])
    assert (args.max_loop_lag, args.loop_block_warning) == (30.0, 1.0)
    args = parser.parse_args(
        ["worker", "app:router", "--queue", "q", "--max-loop-lag", "5", "--loop-block-warning", "0"]
    )
    assert (args.max_loop_lag, args.loop_block_warning) == (5.0, 0.0)  # 0: no warning
    assert main(["worker", "app:router", "--queue", "q", "--max-loop-lag", "0"]) == 2
