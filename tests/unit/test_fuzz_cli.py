"""Property-based: mutations of the examples, and documents drawn from the CRD's own schema
(tests/support/strategies.py), through `dsv4 validate`, `dsv4 plan` and `dsv4 render`.

Whatever a document holds, the CLI never raises, never hangs (a case has CASE_TIMEOUT_SECONDS,
far beyond the milliseconds one takes: it catches unbounded work, not slowness), exits 0, 1
or 2 as documented, prints JSON that matches its schema, and a document `validate` accepts
renders, byte for byte the same each time. A third family edits the file's text rather than
its document: control characters (NUL, BEL, ESC, DEL, C1), odd but legal characters, and
integers around CPython's 4,300-digit limit in every form YAML reads.

Deterministic (derandomized). Sized for the unit tier's budget by default (150 mutation
cases, `DSV4_FUZZ_EXAMPLES` changes it; 100 schema-drawn; 100 text edits: seconds in all);
`make nightly` (`pytest -m nightly tests/unit/test_fuzz_cli.py`) runs 50,000 mutations and
20,000 of each of the others.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dsv4_operator.cli import main
from tests.support.contract import assert_contract
from tests.support.paths import EXAMPLE, REPO
from tests.support.strategies import from_the_crd, gentle, paths_in

EXAMPLES = [EXAMPLE, *sorted((REPO / "examples" / "unsafe").glob("*.yaml"))]
CASES = int(os.environ.get("DSV4_FUZZ_EXAMPLES", "150"))
SCHEMA_CASES = 100
TEXT_CASES = 100
NIGHTLY_CASES = 50_000
NIGHTLY_OTHER_CASES = 20_000
CASE_TIMEOUT_SECONDS = 30.0

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["fp8", "bf16", "fp4", "auto", "", "0", "-1", "1e400", "Exists", "é", "☃"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    if draw(st.booleans()):
        return draw(gentle())
    doc: dict[str, Any] = yaml.safe_load(draw(st.sampled_from(EXAMPLES)).read_text())
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = [p for p in paths_in(doc) if p]
        path = draw(st.sampled_from(paths))
        parent: Any = doc
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(values)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=12))] = draw(values)
        else:
            parent.append(draw(values))
    return doc


# Characters PyYAML's reader refuses anywhere in a file (C0 controls but tab and newlines,
# DEL, most C1 controls, U+FFFE/U+FFFF), and some it accepts that are easy to mishandle.
REFUSED_CHARACTERS = [
    *(chr(c) for c in range(0x20) if chr(c) not in "\t\n\r"),
    *(chr(c) for c in range(0x7F, 0xA0) if c != 0x85),
    "\ufffe",
    "\uffff",
]
ODD_CHARACTERS = [
    "\t",
    "\r",
    "\x85",
    "\u2028",
    "\ufeff",
    "\xa0",
    '"',
    "'",
    "\\",
    ":",
    "#",
    "&",
    "*",
]


@st.composite
def huge_integer(draw: st.DrawFn) -> str:
    """An integer scalar around CPython's 4,300-digit limit, in a form YAML 1.1 reads."""
    digits = draw(st.integers(min_value=4200, max_value=4400))
    form = draw(st.sampled_from(["decimal", "negative", "underscored", "hex", "octal", "binary"]))
    if form == "hex":
        return "0x" + "f" * (digits * 5 // 6)  # about as many decimal digits
    if form == "octal":
        return "0" + "7" * (digits * 10 // 9)
    if form == "binary":
        return "0b" + "1" * (digits * 10 // 3)
    body = "9" * digits
    if form == "underscored":
        body = "_".join(body[i : i + 3] for i in range(0, len(body), 3))
    return ("-" if form == "negative" else "") + body


@st.composite
def text_mutated(draw: st.DrawFn) -> str:
    """An example file with one to three edits of its text (not of its parsed document):
    a character inserted, or a number replaced by a huge integer."""
    text = draw(st.sampled_from(EXAMPLES)).read_text()
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        if draw(st.booleans()):
            numbers = [m.span() for m in re.finditer(r"(?<![\w.])\d+(?![\w.])", text)]
            start, end = draw(st.sampled_from(numbers))
            text = text[:start] + draw(huge_integer()) + text[end:]
        else:
            at = draw(st.integers(min_value=0, max_value=len(text)))
            char = draw(st.sampled_from(REFUSED_CHARACTERS + ODD_CHARACTERS))
            text = text[:at] + char + text[at:]
    return text


class CaseTimeout(Exception):
    """One case ran past CASE_TIMEOUT_SECONDS: unbounded work on some input."""


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    def expire(signum: int, frame: FrameType | None) -> None:
        raise CaseTimeout(f"a case ran for more than {seconds:.0f}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _run(*args: str, stdin: str) -> tuple[int, str]:
    with _time_limit(CASE_TIMEOUT_SECONDS):
        result = CliRunner().invoke(main, list(args), input=stdin)
    if isinstance(result.exception, CaseTimeout):
        raise result.exception
    # SystemExit is how click reports the exit code; any other exception is a crash.
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{args} raised {result.exception!r}"
    )
    return result.exit_code, result.stdout


def _fuzzed(cases: int) -> settings:
    return settings(
        max_examples=cases,
        derandomize=True,
        deadline=None,  # no timing assertion; CASE_TIMEOUT_SECONDS catches hangs
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,
    )


@_fuzzed(CASES)
@given(doc=mutated())
def test_any_document_keeps_the_contract(doc: dict[str, Any]) -> None:
    _keeps_the_contract(doc)


@_fuzzed(SCHEMA_CASES)
@given(doc=from_the_crd())
def test_documents_from_the_crd_schema_keep_the_contract(doc: dict[str, Any]) -> None:
    _keeps_the_contract(doc)


@pytest.mark.nightly
@_fuzzed(NIGHTLY_CASES)
@given(doc=mutated())
def test_any_document_keeps_the_contract_nightly(doc: dict[str, Any]) -> None:
    _keeps_the_contract(doc)


@pytest.mark.nightly
@_fuzzed(NIGHTLY_OTHER_CASES)
@given(doc=from_the_crd())
def test_documents_from_the_crd_schema_keep_the_contract_nightly(doc: dict[str, Any]) -> None:
    _keeps_the_contract(doc)


@_fuzzed(TEXT_CASES)
@given(text=text_mutated())
def test_control_characters_and_huge_integers_keep_the_contract(text: str) -> None:
    _text_keeps_the_contract(text)


@pytest.mark.nightly
@_fuzzed(NIGHTLY_OTHER_CASES)
@given(text=text_mutated())
def test_control_characters_and_huge_integers_keep_the_contract_nightly(text: str) -> None:
    _text_keeps_the_contract(text)


def test_a_hang_is_caught_as_a_failure() -> None:
    # signal.pause() returns only when a signal arrives: only the time limit can end it.
    with pytest.raises(CaseTimeout), _time_limit(0.2):
        signal.pause()


def _keeps_the_contract(doc: dict[str, Any]) -> None:
    text = yaml.safe_dump(doc)
    code, out = _run("validate", "-f", "-", "-o", "json", stdin=text)
    event(f"validate exit {code}")  # the spread shows with --hypothesis-show-statistics
    assert code in (0, 1, 2)
    payload = json.loads(out)
    assert_contract("validate", payload)
    if "error" in payload:
        assert code == 2
        return  # refused before any document was read (the text itself is unusable)
    assert payload["valid"] is (code == 0)
    if code == 0:
        first, second = _run("render", "-f", "-", stdin=text), _run("render", "-f", "-", stdin=text)
        assert first[0] == 0 and first == second
        assert all(d["metadata"]["name"] for d in yaml.safe_load_all(first[1]))
    plan_code, plan_out = _run("plan", "-f", "-", "-o", "json", stdin=text)
    assert plan_code in (0, 1, 2)
    if plan_out:
        assert_contract("plan", json.loads(plan_out))


def _text_keeps_the_contract(text: str) -> None:
    """Every command exits 0, 1 or 2 without a traceback; `-o json` always prints JSON of
    its schema, an `error` exactly when the file could not be read as YAML (exit 2)."""
    refused = None
    for command in ("validate", "plan"):
        code, out = _run(command, "-f", "-", "-o", "json", stdin=text)
        assert code in (0, 1, 2)
        payload = json.loads(out)
        assert_contract(command, payload)
        if "error" in payload:
            assert code == 2 and payload["error"]["message"]
        refused = "error" in payload if refused is None else refused
        assert refused is ("error" in payload)  # both commands read the file alike
    code, _ = _run("render", "-f", "-", stdin=text)
    assert code in (0, 1, 2)
    assert code == 2 or not refused
