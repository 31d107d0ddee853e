"""The one-way channel a child hands its results back on: a pipe the parent created.

The parent passes the pipe's write end to the child (its number travels in the request, on
stdin, never in the environment) and reads the other end; once the child and everything it
started are dead, nothing can add to or rewrite what was read. Every line is one JSON
envelope carrying the run's nonce and a sequence number, so a line that the harness did not
write (the target found the descriptor and wrote to it), a record written twice or garbage
after the last record are told apart from the real thing, and the run fails closed.

The child side (`ChannelWriter`) runs inside the target's process; the parent side
(`read_records`, `read_single`) parses the bytes `run_child` collected.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import sys
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

# Lowest descriptor number the writer moves its end to: out of the range a target probes
# first (0-2 and the numbers Python hands out next), and different in every run.
_HIDE_FROM, _HIDE_TO = 300, 900


class ChannelError(ValueError):
    """What came over the channel is not what the harness writes: the stage fails closed."""


class ChannelSpec(BaseModel):
    """The part of a request that tells a child where and how to hand back its results."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fd: int
    nonce: str


class Envelope(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    nonce: str
    seq: int
    kind: str
    body: dict[str, Any]


RequestT = TypeVar("RequestT", bound=BaseModel)


def new_nonce() -> str:
    return secrets.token_hex(16)


# -- child side ----------------------------------------------------------------------------


class ChannelWriter:
    """Writes envelopes to the channel. Built right after the request is read: it moves the
    descriptor to a random high number, closes the one named in the request and keeps it
    out of every program the target executes (close-on-exec)."""

    def __init__(self, spec: ChannelSpec) -> None:
        self._fd = _hide(spec.fd)
        self._nonce = spec.nonce
        self._seq = 0

    def send(self, kind: str, body: dict[str, Any]) -> None:
        line = json.dumps({"nonce": self._nonce, "seq": self._seq, "kind": kind, "body": body}, default=repr) + "\n"
        self._seq += 1
        data = memoryview(line.encode("utf-8"))
        while data:
            written = os.write(self._fd, data)
            data = data[written:]

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass


def receive_request(model: type[RequestT]) -> tuple[RequestT, ChannelWriter]:
    """A child's first act: its request from stdin (validated; a malformed one raises), then
    stdin pointed at /dev/null and the channel moved out of sight, before any target code runs."""
    request = model.model_validate_json(sys.stdin.buffer.read())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    spec: ChannelSpec = request.channel  # type: ignore[attr-defined]  # every request model has one
    return request, ChannelWriter(spec)


def _hide(fd: int) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _HIDE_FROM + secrets.randbelow(_HIDE_TO - _HIDE_FROM))
    os.close(fd)
    return moved


# -- parent side ---------------------------------------------------------------------------


def read_records(data: bytes, nonce: str, *, allow_cut_tail: bool = False) -> list[Envelope]:
    """Every envelope on the channel, in order; ChannelError on anything the harness did not
    write. `allow_cut_tail`: a last line without its newline (the process died while writing
    it) is dropped instead of rejected, for streams written as events happen."""
    lines = data.split(b"\n")
    tail = lines.pop()  # after the last newline: empty, or a line cut off
    if tail and not allow_cut_tail:
        raise ChannelError(f"{len(tail)} byte(s) after the last record")
    records: list[Envelope] = []
    for number, raw in enumerate(lines, start=1):
        try:
            record = Envelope.model_validate_json(raw)
        except ValidationError as exc:
            raise ChannelError(f"line {number} is not a record of the harness: {_short(raw)} ({exc.error_count()} error(s))") from None
        if not secrets.compare_digest(record.nonce.encode(), nonce.encode()):
            raise ChannelError(f"line {number} does not carry this run's nonce: {_short(raw)}")
        if record.seq != len(records):
            raise ChannelError(f"line {number} has sequence number {record.seq}, expected {len(records)}: a record was added, repeated or lost")
        records.append(record)
    return records


def read_single(data: bytes, nonce: str, kind: str, notice: str | None = None) -> dict[str, Any] | None:
    """The one record of `kind` a child hands back; None when it wrote nothing (it died
    first); ChannelError when there is anything else on the channel. `notice`: the kind of
    one bodiless record the child may write first, while it runs (`first_notice`)."""
    records = read_records(data, nonce)
    if notice is not None and records and records[0].kind == notice:
        if records[0].body:
            raise ChannelError(f"a {notice!r} record with a body")
        records = records[1:]
    if not records:
        return None
    if len(records) > 1:
        raise ChannelError(f"{len(records)} records where the harness writes one")
    if records[0].kind != kind:
        raise ChannelError(f"a {records[0].kind!r} record where the harness writes {kind!r}")
    return records[0].body


def first_notice(data: bytes, nonce: str, notice: str) -> bool | None:
    """Whether the channel's first record, read while the child runs, is a `notice` record of
    this run: True or False once that record is complete, None while it is not. Read before
    the child is dead, a notice only moves when the parent does something; what the child
    hands back is still read whole, by `read_single`, once nothing can write to it."""
    end = data.find(b"\n")
    if end < 0:
        return None
    try:
        record = Envelope.model_validate_json(data[:end])
    except ValidationError:
        return False
    return secrets.compare_digest(record.nonce.encode(), nonce.encode()) and record.seq == 0 and record.kind == notice and not record.body


def _short(raw: bytes) -> str:
    text = raw[:120].decode("utf-8", errors="replace")
    return repr(text + ("..." if len(raw) > 120 else ""))
