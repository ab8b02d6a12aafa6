"""roles/llama_front/files/llama-front-drain, run as llama-server's ExecStop runs it, against a real Unix socket that
answers HAProxy's `show stat` as the front's admin socket does, and real processes standing in for llama-server."""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

DRAIN = Path(__file__).resolve().parents[2] / "roles" / "llama_front" / "files" / "llama-front-drain"
HEADER = "# pxname,svname,qcur,qmax,scur,smax,bin,bout"


class Admin:
    """The front's admin socket: each `show stat` answers the next count of requests llama-server runs (the last one
    again once they are used up), and the bytes it has sent: constant, or growing by `growth` each time."""

    def __init__(self, path, counts, growth=0, silent=()):
        self.counts, self.asked, self.growth, self.silent = list(counts), 0, growth, set(silent)
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(str(path))
        self.server.listen(8)
        self.run_dir, self.closed = Path(path).parent, False
        threading.Thread(target=self.serve, daemon=True).start()
        self.gating = threading.Thread(target=self.gate, daemon=True)
        self.gating.start()

    def gate(self):
        """The gate's part: the drain file's line written to drain.held once it holds (read every 0.2 s, as its
        task; written once per line, as the gate does)."""
        held = None
        while not self.closed:
            try:
                line = (self.run_dir / "drain").read_text().splitlines()[0]
                if line != held:
                    (self.run_dir / "drain.held").write_text(f"{line}\n")
                    held = line
            except (OSError, IndexError):
                pass
            time.sleep(0.2)

    def serve(self):
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            with connection:
                connection.recv(1024)
                if self.asked in self.silent:  # closes without an answer, as a front too busy to answer in time
                    self.asked += 1
                    continue
                count = self.counts[min(self.asked, len(self.counts) - 1)]
                self.asked += 1
                sent = 1000 + self.growth * self.asked
                rows = [HEADER, "api,FRONTEND,,,3,9,0,0", f"llama_server,llama-server,0,0,{count},4,0,{sent}",
                        f"llama_server,BACKEND,0,0,{count},4,0,{sent}"]
                connection.sendall(("\n".join(rows) + "\n\n").encode())

    def close(self):
        self.closed = True
        self.server.close()
        self.gating.join()


@pytest.fixture
def run_dir(tmp_path):
    return tmp_path


def drain(run_dir, *args, stall=15, container=False):
    """The drain as llama-server's unit runs it: UMask=0077; with `container`, as root without CAP_SYS_PTRACE (a
    container's root: /proc/PID/fd of llama-server, another user's process, cannot be read)."""
    started = time.monotonic()
    prefix = ["setpriv", "--bounding-set=-sys_ptrace"] if container else []
    done = subprocess.run([*prefix, sys.executable, str(DRAIN), *map(str, args)], capture_output=True, text=True,
                          timeout=60, check=False, preexec_fn=lambda: os.umask(0o077),
                          env=dict(os.environ, LLAMA_FRONT_RUN_DIR=str(run_dir), LLAMA_FRONT_DRAIN_STALL=str(stall),
                                   JOURNAL_STREAM="test"))  # as under systemd: stdout only, not this host's syslog
    return done, time.monotonic() - started


def as_llama_server_user(container):
    """preexec_fn for a stand-in llama-server: in a container's case, another user's process (nobody)."""
    if not container:
        return None
    if os.geteuid() != 0:
        pytest.skip("runs a process as another user: needs root")

    def demote():
        os.setgid(65534)
        os.setuid(65534)

    return demote


def test_it_holds_new_requests_until_those_running_end(run_dir):
    admin = Admin(run_dir / "admin.sock", [2, 2, 1, 1, 0])
    try:
        done, took = drain(run_dir, 30)
    finally:
        admin.close()
    assert done.returncode == 0, done.stderr
    assert re.search(r"holding new requests; 2 running \(the gate held after 0\.\d s\), waiting up to 30 s",
                     done.stdout), done.stdout
    assert "drained in" in done.stdout and took < 5
    # Without a PID (upgrade.yml, before its switch) the front keeps holding: the file stays, with its end, readable
    # by the front's user although llama-server's unit has UMask=0077 (the gate, unable to read it, held nothing).
    assert int((run_dir / "drain").read_text().split()[0]) >= time.time() + 30
    assert (run_dir / "drain").stat().st_mode & 0o777 == 0o644
    assert (run_dir / "drain.held").read_text() == (run_dir / "drain").read_text()  # counted once the gate held
    done, _ = drain(run_dir, "--end")
    assert done.returncode == 0 and not (run_dir / "drain").exists() and not (run_dir / "drain.held").exists()


def test_with_a_pid_it_stops_llama_server_itself_once_drained(run_dir):
    admin = Admin(run_dir / "admin.sock", [1, 0])
    server = subprocess.Popen(["sleep", "300"])
    try:
        done, _ = drain(run_dir, 30, server.pid)
        assert server.wait(timeout=5) == -signal.SIGTERM
    finally:
        admin.close()
        server.kill()
    assert done.returncode == 0, done.stderr


def test_a_request_running_past_the_drain_is_cut(run_dir):
    """One request never ends: after SECONDS the drain gives up, SIGTERM, and SIGKILL 3 s later for a llama-server
    that does not end on SIGTERM (one with a request running never does)."""
    admin = Admin(run_dir / "admin.sock", [1])
    server = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                               "signal.SIG_IGN); print('ready', flush=True); time.sleep(300)"], stdout=subprocess.PIPE)
    assert server.stdout.readline() == b"ready\n"
    try:
        done, took = drain(run_dir, 1, server.pid)
        assert server.wait(timeout=5) == -signal.SIGKILL
    finally:
        admin.close()
        server.kill()
    assert "1 request(s) still running after 1." in done.stdout and "they are cut" in done.stdout, done.stdout
    assert "did not end within 3 s of SIGTERM: killed" in done.stdout
    assert 4 <= took < 10, took


def test_without_a_front_it_only_stops_llama_server(run_dir):
    server = subprocess.Popen(["sleep", "300"])
    try:
        done, took = drain(run_dir, 30, server.pid)
        assert server.wait(timeout=5) == -signal.SIGTERM
    finally:
        server.kill()
    assert done.returncode == 0 and done.stdout == "" and took < 3
    assert not (run_dir / "drain").exists()


def test_after_a_crash_there_is_no_pid_and_nothing_to_wait_for(run_dir):
    """systemd runs ExecStop after a crash too, with $MAINPID empty."""
    admin = Admin(run_dir / "admin.sock", [0])
    try:
        done, took = drain(run_dir, 30, "")
    finally:
        admin.close()
    assert done.returncode == 0 and "drained in" in done.stdout and took < 3


# llama-server standing in: idle (blocked, as on an answer from a worker that never comes), or busy (computing).
IDLE = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(300)"
BUSY = ("import signal, time; signal.signal(signal.SIGTERM, lambda *_: exit(0)); print('ready', flush=True)\n"
        "while True: pass")


def stand_in(code):
    server = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert server.stdout.readline() == b"ready\n"
    return server


def test_a_llama_server_that_makes_no_progress_is_not_waited_for(run_dir):
    """A request runs, but llama-server sends nothing and computes nothing (it waits for a worker restarted before
    it): the drain stops waiting after the stall time, not after llama_front_drain_seconds."""
    admin, server = Admin(run_dir / "admin.sock", [1]), stand_in(IDLE)
    try:
        done, took = drain(run_dir, 30, server.pid, stall=1)
        assert server.wait(timeout=5) == -signal.SIGKILL
    finally:
        admin.close()
        server.kill()
    assert "1 request(s) running, but llama-server has made no progress for 1 s" in done.stdout, done.stdout
    assert 4 <= took < 8, took


@pytest.mark.parametrize("progress", ["bytes", "cpu"])
def test_a_llama_server_that_progresses_is_waited_for_past_the_stall_time(run_dir, progress):
    """A stream (its bytes grow through the front) or a request llama-server computes (its CPU time grows) runs for
    3 s, three times the stall time: the drain waits for it to end."""
    polls = 30  # about 3 s: one `show stat` every 0.1 s and a little
    admin = Admin(run_dir / "admin.sock", [1] * polls + [0], growth=100 if progress == "bytes" else 0)
    server = stand_in(IDLE if progress == "bytes" else BUSY)
    try:
        done, took = drain(run_dir, 30, server.pid, stall=1)
    finally:
        admin.close()
        server.kill()
    assert "drained in" in done.stdout and "no progress" not in done.stdout, done.stdout
    assert took >= 3, took


def test_a_llama_server_that_ends_by_itself_ends_the_wait(run_dir):
    admin, server = Admin(run_dir / "admin.sock", [1]), stand_in(IDLE)
    try:
        threading.Timer(1, server.kill).start()
        done, took = drain(run_dir, 30, server.pid)
    finally:
        admin.close()
        server.kill()
    assert done.returncode == 0 and took < 5, (took, done.stdout)


@pytest.mark.parametrize("container", [False, True], ids=["host", "container"])
def test_a_worker_that_closed_its_connection_ends_the_wait_at_once(run_dir, container):
    """llama-server's connection to a worker (--rpc) is closed by the worker (restarted before llama-server): the
    socket is in CLOSE-WAIT, and the request llama-server runs can never end. The drain stops waiting at once."""
    worker = socket.create_server(("127.0.0.1", 0))
    endpoint = f"127.0.0.1:{worker.getsockname()[1]}"
    code = ("import socket, sys, time; s = socket.create_connection(('127.0.0.1', int(sys.argv[-1].split(':')[1])));"
            " print('ready', flush=True); time.sleep(300)")
    server = subprocess.Popen([sys.executable, "-c", code, "--rpc", endpoint], stdout=subprocess.PIPE,
                              preexec_fn=as_llama_server_user(container))
    assert server.stdout.readline() == b"ready\n"
    accepted, _ = worker.accept()
    accepted.close()  # the worker restarts
    admin = Admin(run_dir / "admin.sock", [1])
    try:
        done, took = drain(run_dir, 30, server.pid, container=container)
    finally:
        admin.close()
        server.kill()
        worker.close()
    assert f"worker(s) {endpoint} closed their connection to llama-server" in done.stdout, done.stdout
    assert took < 6, took


def test_a_front_that_does_not_answer_once_is_not_taken_for_nothing_running(run_dir):
    """A `show stat` unanswered (a loaded host) in the middle of a stream: the drain goes on waiting for it."""
    admin = Admin(run_dir / "admin.sock", [1] * 20 + [0], growth=100, silent=range(3, 12))
    server = stand_in(IDLE)
    try:
        done, took = drain(run_dir, 30, server.pid, stall=5)
    finally:
        admin.close()
        server.kill()
    waited = re.search(r"drained in ([\d.]+) s", done.stdout)
    assert waited and float(waited.group(1)) >= 1.5, done.stdout  # 20 answers of `show stat`, 0.1 s apart


@pytest.mark.parametrize("container", [False, True], ids=["host", "container"])
def test_another_process_s_connection_closed_by_a_worker_is_not_llama_server_s(run_dir, container):
    """A probe of the worker's port, by another process (root's, as status.yml's), left in CLOSE-WAIT: llama-server's
    own connection is fine, and its request is waited for."""
    worker = socket.create_server(("127.0.0.1", 0))
    endpoint = f"127.0.0.1:{worker.getsockname()[1]}"
    probe = socket.create_connection(("127.0.0.1", worker.getsockname()[1]))  # this test's, not llama-server's
    accepted, _ = worker.accept()
    accepted.close()
    server = subprocess.Popen([sys.executable, "-c", IDLE, "--rpc", endpoint], stdout=subprocess.PIPE,
                              preexec_fn=as_llama_server_user(container))
    assert server.stdout.readline() == b"ready\n"
    admin = Admin(run_dir / "admin.sock", [1] * 15 + [0], growth=100)
    try:
        done, _ = drain(run_dir, 30, server.pid, stall=5, container=container)
    finally:
        admin.close()
        server.kill()
        probe.close()
        worker.close()
    assert "drained in" in done.stdout and "closed their connection" not in done.stdout, done.stdout
