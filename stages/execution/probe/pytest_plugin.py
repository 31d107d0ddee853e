"""The pytest plugin injected into the target's test run: one record per event, on the channel.

It runs inside the pytest child (never in the stage agent). Every event is handed back
over the channel (`stages/common/channel.py`) as it happens, so a run that dies half-way (a test that calls `os._exit`, a
conftest that kills the process, a hang killed at the budget) still leaves what it did and
which test was running; a run that leaves no `finish` line did not complete.

Events: `conftest_error`, `start`, `collect_error`, `collected`, `test_start`, `report`,
`warning`, `interrupt`, `internal_error`, `finish`, and the accounting events of
`pytest_accounting` (`selection`, `xdist_disabled`, `ignored`, `collect_skip`, `deselected`,
`items`); each `report` carries what the accountant saw of its phase. Failures carry the innermost frame of
the target's own code, read from the real exception (pytest's report text is trimmed).
"""

from __future__ import annotations

import errno
import os
import sys
import traceback
import warnings
from pathlib import Path
from collections.abc import Callable, Generator
from typing import Any

import pytest

from ...common.channel import ChannelWriter
from ...common.frames import innermost_target, is_target_file, relative
from ...contract.messages import PYTEST_EVENT, TargetFrame
from ...contract.pytest_events import (
    CollectedEvent,
    CollectErrorEvent,
    ConftestErrorEvent,
    DescribedException,
    FinishEvent,
    InternalErrorEvent,
    InterruptEvent,
    PytestEvent,
    ReportEvent,
    SkipSite,
    StartEvent,
    TestStartEvent,
    WarningEvent,
)

MAX_TEXT = 6000
MAX_WARNINGS = 500


class _SitedWarningMessage(warnings.WarningMessage):
    """A WarningMessage that remembers the Python stack it was issued from.

    `warnings.warn` builds its record through the module attribute `warnings.WarningMessage`,
    so replacing that attribute lets pytest's recorded warnings keep their call stack: the
    target's calling line can then be found even when the warning is attributed to torch.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        stack: list[tuple[str, int, str]] = []
        frame = sys._getframe(1)
        while frame is not None:
            stack.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
            frame = frame.f_back  # type: ignore[assignment]
        self.recorded_stack = stack


def install_warning_sites() -> None:
    warnings.WarningMessage = _SitedWarningMessage  # type: ignore[misc]


def original_exception(exc: BaseException) -> BaseException:
    """The exception a wrapper stands for: pytest wraps import errors of test modules and
    conftests in its own exceptions and keeps the original as `cause` or `__cause__`."""
    seen: set[int] = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "cause", None) or exc.__cause__
        if not isinstance(inner, BaseException) or type(exc).__module__.split(".")[0] not in ("_pytest", "pytest"):
            break
        exc = inner
    return exc


def describe_exception(exc: BaseException, root: Path) -> DescribedException:
    """Type, message, traceback text and the innermost frame in the target's code."""
    exc = original_exception(exc)
    triples = [(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(exc.__traceback__)]
    site = innermost_target(triples, root, innermost_first=False)
    if isinstance(exc, SyntaxError) and exc.filename and is_target_file(exc.filename, root):
        # The file that does not parse has no frame of its own: its line is in the exception.
        site = {"path": relative(exc.filename, root), "line": exc.lineno or 0, "function": "<module>", "code": (exc.text or "").strip()}
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return DescribedException.model_validate(
        {
            "type": type(exc).__name__,
            "message": str(exc)[:MAX_TEXT],
            "traceback": text[-MAX_TEXT:],
            "target_frame": site,
            "environment": environment_cause(exc, root),
        }
    )


def target_frame(site: dict[str, object] | None) -> TargetFrame | None:
    """`innermost_target`'s record as the contract's frame."""
    return TargetFrame.model_validate(site) if site is not None else None


# Exception classes, by module-qualified name, that mean "the network could not be reached"
# in the libraries tests commonly use; matched along the class's MRO so that subclasses count.
_NETWORK_CLASSES = frozenset(
    {
        "socket.gaierror",
        "socket.herror",
        "builtins.ConnectionError",
        "urllib.error.URLError",
        "requests.exceptions.ConnectionError",
        "urllib3.exceptions.NewConnectionError",
        "urllib3.exceptions.MaxRetryError",
        "urllib3.exceptions.NameResolutionError",
        "httpx.ConnectError",
        "aiohttp.client_exceptions.ClientConnectorError",
    }
)
_NETWORK_ERRNOS = frozenset(
    getattr(errno, name) for name in ("ENETUNREACH", "EHOSTUNREACH", "ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "ENETDOWN", "EHOSTDOWN") if hasattr(errno, name)
)
# Functions of the socket module that resolve or connect: an OSError raised under one of them
# is a network failure whatever its errno.
_SOCKET_CALLS = frozenset({"getaddrinfo", "gethostbyname", "gethostbyname_ex", "create_connection", "connect", "connect_ex"})


def environment_cause(exc: BaseException, root: Path) -> dict[str, Any] | None:
    """Why the test could not run *here*, when the failure is one of the environment's and not
    of the code: the network could not be reached, or an optional package is not installed.
    Looks along the exception's chain (a library often re-raises the socket error as its own).
    None for every other failure."""
    seen: set[int] = set()
    current: BaseException | None = original_exception(exc)
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        # An assertion (or pytest.fail) is the test's own verdict, even when it is raised
        # while a network error was being handled: that is a real failure.
        if isinstance(current, (AssertionError, pytest.fail.Exception)):
            return None
        found = _network_cause(current) or _missing_package(current, root)
        if found is not None:
            return found
        current = current.__cause__ or current.__context__
    return None


def _network_cause(exc: BaseException) -> dict[str, Any] | None:
    names = {f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__}
    if names & _NETWORK_CLASSES:
        return {"kind": "network", "type": f"{type(exc).__module__}.{type(exc).__qualname__}", "detail": str(exc)[:500]}
    if isinstance(exc, OSError):
        calls = {f.name for f in traceback.extract_tb(exc.__traceback__) if os.path.basename(f.filename) == "socket.py"}
        if exc.errno in _NETWORK_ERRNOS or calls & _SOCKET_CALLS:
            return {"kind": "network", "type": f"{type(exc).__module__}.{type(exc).__qualname__}", "detail": str(exc)[:500]}
    return None


def _missing_package(exc: BaseException, root: Path) -> dict[str, Any] | None:
    """An import of a module that is neither installed nor part of the target's own tree (a
    missing module of the target itself is a defect of the code, not of the environment)."""
    if not isinstance(exc, ImportError) or not exc.name:
        return None
    top = exc.name.split(".")[0]
    for base in (root, root / "src"):
        if (base / top).is_dir() or (base / f"{top}.py").is_file():
            return None
    return {"kind": "missing-package", "module": exc.name, "package": top, "detail": str(exc)[:500]}


class EventRecorder:
    """Hands the run's events back over `channel`, one record each."""

    def __init__(self, channel: ChannelWriter, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self._out = channel
        self._failures: dict[tuple[str, str], DescribedException] = {}
        self._collect_failures: dict[str, DescribedException] = {}
        self._deselected = 0
        self._warnings = 0
        # Set by the launcher: what the gate itself saw of each phase, added to its report event.
        self.phase_facts: Callable[[pytest.TestReport], dict[str, Any]] | None = None

    def emit(self, event: PytestEvent) -> None:
        try:
            self._out.send(PYTEST_EVENT, event.model_dump(mode="json"))
        except Exception:  # noqa: BLE001 - a lost event shows as a missing outcome; the gate fails closed on it
            pass

    def close(self) -> None:
        self._out.close()

    # -- configuration and collection ------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_load_initial_conftests(self, early_config: Any, parser: Any, args: list[str]) -> Generator[None, Any, Any]:
        try:
            return (yield)
        except BaseException as exc:
            described = describe_exception(exc, self.root)
            self.emit(ConftestErrorEvent(conftest=str(getattr(exc, "path", "")), **dict(described)))
            raise

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        config = session.config
        self.emit(
            StartEvent(
                pytest=pytest.__version__,
                rootdir=str(config.rootpath),
                inifile=str(config.inipath) if config.inipath else None,
                args=[str(a) for a in config.invocation_params.args],
                pid=os.getpid(),
                xdist_workers=getattr(config.option, "numprocesses", None),
            )
        )

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(self, collector: pytest.Collector) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
        report = yield
        # pytest hands the exception to the report only here; it is gone by pytest_collectreport.
        excinfo = getattr(getattr(report, "call", None), "excinfo", None)
        if report.failed and excinfo is not None:
            self._collect_failures[report.nodeid] = describe_exception(excinfo.value, self.root)
        return report

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if not report.failed:
            return
        described = self._collect_failures.pop(report.nodeid, None)
        self.emit(
            CollectErrorEvent(
                nodeid=report.nodeid,
                path=_node_path(report.nodeid),
                longrepr=report.longreprtext[-MAX_TEXT:],
                **(dict(described) if described is not None else {}),
            )
        )

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self._deselected += len(items)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # The node ids let the gate check that every collected test got a terminal report.
        self.emit(CollectedEvent(count=len(session.items), deselected=self._deselected, nodeids=[item.nodeid for item in session.items]))

    # -- running ---------------------------------------------------------------------------

    def pytest_runtest_logstart(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        path, line, _ = location
        self.emit(TestStartEvent(nodeid=nodeid, path=path, line=(line + 1) if line is not None else None))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if report.failed and call.excinfo is not None:
            self._failures[(report.nodeid, report.when)] = describe_exception(call.excinfo.value, self.root)
        return report

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # Last of the implementations: the outcome as pytest finally logs it, after any hook.
        event: dict[str, Any] = {
            "nodeid": str(report.nodeid),
            "when": str(report.when),
            "outcome": str(report.outcome),
            "duration": round(float(report.duration), 6),
            "observed": None,
        }
        if hasattr(report, "wasxfail"):
            event["wasxfail"] = str(report.wasxfail)
        if report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
            path, line, reason = report.longrepr
            event["skip"] = SkipSite(path=self._rel(str(path)), line=line if isinstance(line, int) else None, reason=str(reason))
        if report.failed:
            event["failure"] = self._failures.pop((report.nodeid, report.when), None)
            event["longrepr"] = report.longreprtext[-MAX_TEXT:]
        if self.phase_facts is not None:
            event.update(self.phase_facts(report))
        self.emit(ReportEvent(**event))

    def pytest_warning_recorded(self, warning_message: warnings.WarningMessage, when: str, nodeid: str, location: tuple[str, int, str] | None) -> None:
        self._warnings += 1
        if self._warnings > MAX_WARNINGS:
            return
        stack: list[tuple[str, int, str]] = getattr(warning_message, "recorded_stack", [])
        site = innermost_target(stack, self.root, innermost_first=True) if stack else None
        filename = str(warning_message.filename)
        if site is None and is_target_file(filename, self.root):
            site = innermost_target([(filename, int(warning_message.lineno), "")], self.root, innermost_first=True)
        self.emit(
            WarningEvent(
                category=warning_message.category.__name__ if warning_message.category else "Warning",
                message=str(warning_message.message)[:2000],
                filename=self._rel(filename),
                lineno=int(warning_message.lineno),
                when=str(when),
                nodeid=str(nodeid),
                target_frame=target_frame(site),
                via_torch=_issued_by_torch(stack, self.root),
            )
        )

    # -- ends ------------------------------------------------------------------------------

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        self.emit(InterruptEvent(**dict(describe_exception(excinfo.value, self.root))))

    def pytest_internalerror(self, excrepr: Any, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        self.emit(InternalErrorEvent(**dict(describe_exception(excinfo.value, self.root))))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.emit(
            FinishEvent(
                exitstatus=int(exitstatus),
                testscollected=session.testscollected,
                testsfailed=session.testsfailed,
                # Why pytest stopped before running every collected test (`-x`, `--maxfail`), if it did.
                stopped=str(session.shouldfail or session.shouldstop or "") or None,
            )
        )

    def _rel(self, path: str) -> str:
        if is_target_file(path, self.root):
            return relative(path, self.root)
        return path


def _node_path(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _issued_by_torch(stack: list[tuple[str, int, str]], root: Path) -> bool:
    """Whether a frame of the torch package sits between `warnings.warn` and the target's line."""
    for filename, _, _ in stack:
        if is_target_file(filename, root):
            return False
        if f"{os.sep}torch{os.sep}" in filename:
            return True
    return False
