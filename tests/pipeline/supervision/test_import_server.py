"""The import server (pipeline/supervision/import_server.py): a fork it hands out is the host a
fresh interpreter would have been, refuses what it cannot serve, and dies with its connection."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from traingate.pipeline.model.registry import build_registry, parts
from traingate.pipeline.supervision import import_server
from traingate.pipeline.supervision.processes import descendants, read_process

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the import server is Linux only")

TAG_NAME = "PROBEPKG_RUN_TAG"

# Run as the host would run the warm interpreter's module: it reports what it sees, then (when
# asked on its socket) leaves a setsid grandchild behind and waits.
PROBE = textwrap.dedent(
    """
    import ctypes, json, os, socket, sys, time
    def _subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from _subclasses(sub)
    flag = ctypes.c_int(0)
    ctypes.CDLL(None).prctl(37, ctypes.byref(flag), 0, 0, 0)
    block = open("/proc/self/environ", "rb").read().split(b"\\0")
    facts = {
        "argv": sys.argv[1:], "cwd": os.getcwd(), "path0": sys.path[0], "sid": os.getsid(0),
        "env": dict(os.environ), "subreaper": flag.value,
        "block_tag": [e.decode() for e in block if e.startswith(b"PROBEPKG_RUN_TAG=")],
        "slot_left": [e.decode()[:40] for e in block if e.startswith(b"TRAINGATE")],
        "cmdline": open("/proc/self/cmdline", "rb").read().decode(errors="replace"),
        "modules": sorted(m for m in sys.modules if m.split(".")[0] in ("traingate", "pytest", "_pytest", "torch")),
        "hash": hash("traingate"),
        # Models of the gate's modules still to build on first use (pydantic's deferred ones).
        "unbuilt_models": sorted(
            m.__qualname__ for m in _subclasses(sys.modules["pydantic"].BaseModel)
            if m.__module__.startswith("traingate.") and not m.__pydantic_complete__
        ) if "pydantic" in sys.modules else None,
    }
    print(json.dumps(facts), flush=True)
    sock = socket.socket(fileno=int(sys.argv[1]))
    if sock.recv(16) == b"daemon":
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(600)
            os._exit(0)
        sock.sendall(b"left")
    time.sleep(600)
    """
)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[Path, dict[str, str]]]:
    """A server for gate runs of this process's environment; its socket and the hosts' environment."""
    folder = Path(tempfile.mkdtemp(prefix="tg-import-test-"))
    socket_path = folder / "socket"
    gate_env = {k: v for k, v in os.environ.items() if k != import_server.SERVER_ENV}
    process = import_server.start(socket_path, gate_env, "cpu")
    try:
        assert import_server.wait_ready(socket_path, process), (folder / "import-server.stderr").read_text()
        yield socket_path, import_server.host_environment(gate_env, "cpu")
    finally:
        import_server.stop(process)
        shutil.rmtree(folder, ignore_errors=True)


def _request(socket_path: Path, env: dict[str, str], folder: Path, out: Path, preload: list[str], monkeypatch: pytest.MonkeyPatch):
    (folder / "probe_host.py").write_text(PROBE)
    monkeypatch.setenv(import_server.SERVER_ENV, str(socket_path))
    with open(out, "wb") as stdout, open(out.with_suffix(".err"), "wb") as stderr:
        return import_server.request_host(env, TAG_NAME, "123:warm:1".ljust(160), folder, "probe_host", str(folder), preload, stdout.fileno(), stderr.fileno())


def _facts(out: Path) -> dict:
    deadline = time.monotonic() + 60
    while not out.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.02)
    return json.loads(out.read_text())


def test_a_served_host_is_what_a_fresh_interpreter_would_have_been(server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    socket_path, env = server
    served = _request(socket_path, env, tmp_path, tmp_path / "out", [], monkeypatch)
    assert served is not None
    sock, host = served
    try:
        facts = _facts(tmp_path / "out")
        assert facts["cwd"] == str(tmp_path) and facts["path0"] == str(tmp_path)
        assert facts["env"] == {**env, TAG_NAME: "123:warm:1".ljust(160)}
        # The tag in the block /proc shows, where the server's reserved slot was; nothing of it left.
        [entry] = facts["block_tag"]
        assert entry.rstrip(" ") == f"{TAG_NAME}=123:warm:1"
        assert facts["slot_left"] == []
        # torch imported already; nothing of the gate's and no pytest a fresh host would not have.
        assert "torch" in facts["modules"] and "torch._dynamo" in facts["modules"]
        assert not [m for m in facts["modules"] if m.startswith(("traingate", "pytest", "_pytest"))]
        assert "traingate" not in facts["cmdline"]  # a fork shows the server's command line as its own
        assert facts["argv"][1:] == [] and facts["sid"] == host.pid and facts["subreaper"] == 1
        assert read_process(host.pid).ppid != os.getpid()  # the server's child, not ours
    finally:
        host.kill()
        sock.close()


def test_pytest_stays_imported_for_a_host_that_preloads_it(server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    socket_path, env = server
    served = _request(socket_path, env, tmp_path, tmp_path / "out", ["pytest"], monkeypatch)
    assert served is not None
    sock, host = served
    try:
        facts = _facts(tmp_path / "out")
        assert "pytest" in facts["modules"] and facts["argv"][1:] == ["pytest"]
        assert not [m for m in facts["modules"] if m.startswith("traingate")]
    finally:
        host.kill()
        sock.close()


def test_a_host_that_prepares_stage_agents_keeps_the_gates_modules_the_server_prepared(server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server prepared what every stage agent imports and builds (`stages/agent/preload.py`)
    once; an agents' host keeps it for the agents it forks (whose forks that run target code
    forget it again: test_warm_start.py), and no other host does."""
    socket_path, env = server
    served = _request(socket_path, env, tmp_path, tmp_path / "out", [import_server.AGENTS_PRELOAD], monkeypatch)
    assert served is not None
    sock, host = served
    try:
        facts = _facts(tmp_path / "out")
        assert {import_server.AGENTS_PRELOAD_MODULE, "traingate.pipeline.model.registry", "traingate.stages.contract.messages"} <= set(facts["modules"])
        # Each stage's own work, and every model its payloads and details are checked with.
        works = {name for stage in build_registry().values() for name in parts(stage).agent_modules}
        assert works >= {f"traingate.stages.{name}.stage" for name in ("execution", "performance", "concurrency", "correctness")}
        assert works <= set(facts["modules"]) and facts["unbuilt_models"] == []
        assert "pytest" not in facts["modules"] and not [m for m in facts["modules"] if m.startswith("__editable__")]
        assert "traingate" not in facts["cmdline"]  # the preload is named in hexadecimal
    finally:
        host.kill()
        sock.close()


def test_another_environment_is_refused_and_the_run_starts_its_own(server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    socket_path, env = server
    assert _request(socket_path, {**env, "PYTHONHASHSEED": "7"}, tmp_path, tmp_path / "out", [], monkeypatch) is None
    assert _request(socket_path, {k: v for k, v in env.items() if k != "PYTHONHASHSEED"}, tmp_path, tmp_path / "out", [], monkeypatch) is None


def test_the_concurrency_stages_other_hash_seed_is_served_by_an_interpreter_started_with_it(server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hash seed is fixed as an interpreter starts: the determinism rerun's is served by the
    server's sibling of that seed, whose forks hash as a fresh interpreter of that seed does."""
    from traingate.stages.concurrency.stage import _rerun_hash_seed

    socket_path, env = server
    seed = _rerun_hash_seed(1)
    assert seed in import_server.SIBLING_HASH_SEEDS and seed != env["PYTHONHASHSEED"]
    served = _request(socket_path, {**env, "PYTHONHASHSEED": seed}, tmp_path, tmp_path / "out", [], monkeypatch)
    assert served is not None
    sock, host = served
    try:
        facts = _facts(tmp_path / "out")
        fresh = subprocess.run([sys.executable, "-c", "print(hash('traingate'))"], env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True, text=True, timeout=60)
        assert facts["env"]["PYTHONHASHSEED"] == seed and facts["hash"] == int(fresh.stdout)
        assert "torch._dynamo" in facts["modules"]
    finally:
        host.kill()
        sock.close()


def test_killing_a_host_kills_what_it_left_and_waits_for_it(server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    socket_path, env = server
    served = _request(socket_path, env, tmp_path, tmp_path / "out", [], monkeypatch)
    assert served is not None
    sock, host = served
    _facts(tmp_path / "out")
    sock.sendall(b"daemon")
    assert sock.recv(16) == b"left"
    below = [p.pid for p in descendants(host.pid) if p.alive]
    assert below, "the setsid grandchild stays below the host, a subreaper"
    host.kill()  # returns once the server has killed them
    assert all(read_process(pid) is None or not read_process(pid).alive for pid in [host.pid, *below])
    sock.close()


def test_a_host_dies_with_the_connection_of_a_run_that_died(server, tmp_path: Path) -> None:
    """A gate run killed outright closes its connection by dying: the server kills its host."""
    socket_path, env = server
    (tmp_path / "probe_host.py").write_text(PROBE)
    script = textwrap.dedent(
        f"""
        import json, os, sys
        from pathlib import Path
        from traingate.pipeline.supervision import import_server
        out = open({str(tmp_path / 'out')!r}, "wb")
        served = import_server.request_host(json.loads(sys.argv[1]), {TAG_NAME!r}, "1:warm:1".ljust(160), Path({str(tmp_path)!r}), "probe_host", {str(tmp_path)!r}, [], out.fileno(), out.fileno())
        print(served[1].pid if served else "refused", flush=True)
        sys.stdin.read()
        os._exit(0)
        """
    )
    run = subprocess.Popen(
        [sys.executable, "-c", script, json.dumps(env)], env={**os.environ, import_server.SERVER_ENV: str(socket_path)},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    with run:
        line = run.stdout.readline().strip()
        assert line.isdigit(), line
        host = int(line)
        run.kill()
    deadline = time.monotonic() + 10
    while (info := read_process(host)) is not None and info.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    assert info is None or not info.alive


def test_a_process_that_is_not_the_servers_parent_or_its_child_is_refused(server, tmp_path: Path) -> None:
    """A target's process (a grandchild of the process that started the server) gets nothing."""
    socket_path, env = server
    (tmp_path / "probe_host.py").write_text(PROBE)
    inner = (
        "import json, sys; from pathlib import Path; from traingate.pipeline.supervision import import_server; "
        f"print(import_server.request_host(json.loads(sys.argv[1]), 'X', 't', Path({str(tmp_path)!r}), 'probe_host', None, [], 1, 2))"
    )
    outer = f"import subprocess, sys; sys.exit(subprocess.run([sys.executable, '-c', {inner!r}, sys.argv[1]]).returncode)"
    done = subprocess.run(
        [sys.executable, "-c", outer, json.dumps(env)], env={**os.environ, import_server.SERVER_ENV: str(socket_path)},
        capture_output=True, text=True, timeout=60,
    )
    assert done.stdout.strip() == "None", done.stderr


def test_a_server_stopped_before_it_is_up_leaves_nothing_running(tmp_path: Path) -> None:
    """Its gate server and its siblings start before its imports, and die with it whenever it
    dies: stopped at once, during its imports, nothing of it is left."""
    folder = Path(tempfile.mkdtemp(prefix="tg-import-test-"))
    socket_path = folder / "socket"
    try:
        process = import_server.start(socket_path, {k: v for k, v in os.environ.items() if k != import_server.SERVER_ENV}, "cpu")
        deadline = time.monotonic() + 30
        # Until it has started the servers beside it (they name its socket), then at once.
        while len(_naming(socket_path)) < 1 + len(import_server.SIBLING_HASH_SEEDS) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not socket_path.exists()  # still importing
        import_server.stop(process)
        while _naming(socket_path) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _naming(socket_path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _naming(socket_path: Path) -> list[int]:
    """The live processes whose command line names the socket."""
    from traingate.pipeline.supervision.processes import process_table

    return [p.pid for p in process_table().values() if p.alive and str(socket_path) in p.cmdline]
