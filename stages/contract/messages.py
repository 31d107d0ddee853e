"""The requests and results that cross a process boundary, defined once for both sides.

Every model forbids unknown keys: a misspelt key, a missing field or a record of the wrong
shape is a validation error, which the reading side turns into a stage error (fail closed),
never a silent default. Requests reach a child on stdin; results come back over the
channel (`traingate.stages.contract.channel`) inside an envelope that carries the run's nonce.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from traingate.stages.contract.channel import ChannelSpec

# Envelope kinds on the channel.
AGENT_REPLY = "agent-reply"
HARNESS_RESULT = "harness-result"
PYTEST_EVENT = "pytest-event"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# -- the stage agent (pipeline.orchestrator <-> stages.agent) ------------------------------


class AgentRequest(Strict):
    stage: str
    root: str
    config: dict[str, Any]  # a TargetConfig, validated by the agent
    device: Literal["cpu", "cuda"]
    deadline: float  # time.time() by which the stage must have returned
    scratch: str
    margin_s: float
    baseline: dict[str, Any] | None
    registry: str  # `module:function` building the stage registry
    channel: ChannelSpec


class AgentReply(Strict):
    """Exactly one of: the stage's outcome (a StageOutcome, validated by the gate), or the
    traceback of the exception the stage raised."""

    outcome: dict[str, Any] | None = None
    error: str | None = None

    @model_validator(mode="after")
    def _one_of(self) -> AgentReply:
        if (self.outcome is None) == (self.error is None):
            raise ValueError("an agent reply holds exactly one of outcome and error")
        return self


# -- one entrypoint call (stages.base.run_entrypoint <-> stages.harness.entrypoint) --------


class EntrypointRequest(Strict):
    """Exactly one of `call` (module:function or module:Class.method) and `script` (a .py
    file relative to the target root, run as `__main__` with `sys.argv = [script, *args]`)."""

    target_root: str
    call: str | None
    script: str | None = None
    args: list[str] = Field(default_factory=list)  # the script's arguments, AMP setting included
    setup: str | None
    kwargs: dict[str, Any]
    amp_flag: str | None
    amp: bool | None
    seed: int
    device: Literal["cpu", "cuda"]
    instruments: list[str]  # specs from traingate.stages.contract.instruments
    instrument_options: dict[str, Any]
    deterministic: bool
    channel: ChannelSpec

    @model_validator(mode="after")
    def _one_shape(self) -> EntrypointRequest:
        if (self.call is None) == (self.script is None):
            raise ValueError("an entrypoint request names exactly one of call and script")
        return self


class TargetFrame(Strict):
    """The innermost frame in the target's own code."""

    path: str  # relative to the target root
    line: int
    function: str
    code: str


class FrameRecord(Strict):
    path: str
    line: int
    function: str


class ExceptionRecord(Strict):
    type: str
    message: str
    traceback: str
    frames: list[FrameRecord]
    target_frame: TargetFrame | None


class WarningRecord(Strict):
    category: str
    message: str
    filename: str
    lineno: int
    target_frame: TargetFrame | None


class HarnessResult(Strict):
    """What the entrypoint harness hands back after the call."""

    ok: bool  # the call returned (the gate also requires exit status 0 and the nonce)
    phase: Literal["import", "setup", "call"]
    exception: ExceptionRecord | None
    returned: Any  # a size-capped, JSON-safe summary of the return value
    returned_truncated: bool = False
    duration_s: float
    warnings: list[WarningRecord]
    warnings_omitted: int = 0
    # spec -> the instrument's collect() result, or {"error": traceback} when it failed.
    instruments: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> HarnessResult:
        if self.ok == (self.exception is not None):
            raise ValueError("a harness result is ok exactly when it holds no exception")
        return self


# -- the test suite (stages.execution.suite <-> stages.harness.pytest_launcher) ------------


class CoverageSpec(Strict):
    data_file: str
    include: list[str]


class PytestRequest(Strict):
    root: str
    args: list[str]
    coverage: CoverageSpec | None
    channel: ChannelSpec


PYTEST_EVENT_KINDS = frozenset(
    {"conftest_error", "start", "collect_error", "collected", "test_start", "report", "warning", "interrupt", "internal_error", "finish"}
)
