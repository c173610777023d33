"""opserve-cli's behaviour towards the person or script using it, checked by cli_e2e_test.py
against the real server: one-line usage errors, JSON numbers, OS reasons and line:column in
errors, the warning for a graph that keeps nothing, the progress bar (on a terminal only), bench
rows as they are measured, and the default deadlines against a server that never answers.

Not a test itself; cli_e2e_test.py imports it. Stdlib only.
"""

import json
import os
import pty
import select
import socket
import struct
import subprocess
import threading
import time

from e2e_script import Failure, check

# The CLI's default deadline for calls that run no graph, and its stall limit for transfers.
DEFAULT_DEADLINE_S = 30
PROGRESS_MIN_BYTES = 64 << 20


class MuteServer:
    """A listener that completes HTTP/2's handshake (its SETTINGS and the ack of the client's)
    and then never answers: a server that hangs, which the real one cannot be made to do."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.target = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                connection, _ = self.sock.accept()
            except OSError:
                return  # closed
            self.connections.append(connection)
            threading.Thread(target=self._drain, args=(connection,), daemon=True).start()

    @staticmethod
    def _drain(connection):
        try:
            connection.sendall(b"\0\0\0\x04\0\0\0\0\0" + b"\0\0\0\x04\x01\0\0\0\0")
            while connection.recv(65536):
                pass
        except OSError:
            pass

    def close(self):
        self.sock.close()
        for connection in self.connections:
            connection.close()


def write_npy_zeros(path, elements):
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d,), }" % elements
    header += " " * (63 - len(header) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.truncate(f.tell() + 4 * elements)


def run_on_terminal(argv, cwd, term="xterm", timeout=120):
    """Runs argv with stderr on a pseudo-terminal (stdout piped) and TERM set to `term` (whatever
    the test's own environment has); returns (exit code, stdout, what the terminal got)."""
    master, slave = pty.openpty()
    try:
        process = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=slave, env={**os.environ, "TERM": term})
    finally:
        os.close(slave)  # the child holds its own copy: EOF on master once it exits
    terminal = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1)
        if not ready:
            continue
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child's end is closed
            break
        if not data:
            break
        terminal += data
    os.close(master)
    stdout, _ = process.communicate(timeout=30)
    return process.returncode, stdout.decode(), terminal.decode(errors="replace")


def check_usage_errors(cli):
    for args in [("frobnicate",), ("put", "A"), ("--no_such_flag", "ls"), (),
                 ("ls", "--concurrency=2"), ("--timeout=soon", "ls"), ("bench",)]:
        out, err = cli(*args, code=2)
        lines = err.splitlines()
        check(len(lines) == 1 and "opserve-cli" in lines[0] and "--help" in lines[0] and not out,
              f"usage error for {args} is not one line pointing at --help:\n{err}")
    for flag in ("--help", "-h"):
        out, _ = cli(flag, target=False)
        for text in ("commands:", "put NAME FILE.npy", "--timeout=SECONDS", "--concurrency"):
            check(text in out, f"{flag} lacks {text!r}:\n{out}")


def check_json_numbers(cli):
    """Every integer field comes out as a JSON number, not as proto JSON's quoted string."""
    int_keys = {"bytes", "flops", "shape", "batchSize", "requests", "errors", "concurrency"}
    float_keys = {"kernelUs", "gbps", "gflops", "totalUs", "computeUs", "seconds"}

    def walk(value, where, seen):
        if isinstance(value, dict):
            for key, item in value.items():
                if key in int_keys:
                    items = item if isinstance(item, list) else [item]
                    check(all(type(i) is int for i in items), f"{where}.{key} = {item!r}: not ints")
                    seen.add(key)
                if key in float_keys:
                    check(type(item) in (int, float), f"{where}.{key} = {item!r}: not a number")
                    seen.add(key)
                walk(item, f"{where}.{key}", seen)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, f"{where}[{i}]", seen)

    for args, expect in [(("put", "A", "a.npy", "--overwrite", "--json"), {"bytes", "shape"}),
                         (("ls", "--json"), {"bytes", "shape"}),
                         (("run", "demo_graph.json", "--json"),
                          {"bytes", "flops", "shape", "kernelUs", "totalUs"}),
                         (("get", "A", "a_back.npy", "--json"), {"bytes", "shape", "seconds"})]:
        out, _ = cli(*args)
        seen = set()
        walk(json.loads(out), "$", seen)
        check(expect <= seen, f"opserve-cli {' '.join(args)}: fields {expect - seen} missing")
    out, _ = cli("ops", "--json")
    check(json.loads(out)["ops"], "ops --json lists no op")


def check_error_texts(cli, work):
    _, err = cli("run", "nosuch.json", code=1)
    check("nosuch.json: No such file or directory" in err, f"missing graph: {err!r}")
    with open(os.path.join(work, "bad_syntax.json"), "w") as f:
        f.write('{"nodes": [\n  {"id": "x",\n   "op": sum}]}\n')
    _, err = cli("run", "bad_syntax.json", code=1)
    check("bad_syntax.json:3:10: not valid JSON: expected a value, found 's'" in err,
          f"bad JSON without its line and column: {err!r}")

    with open(os.path.join(work, "keeps_nothing.json"), "w") as f:
        json.dump({"nodes": [{"id": "s", "op": "sum", "inputs": [{"stored": "A"}]}]}, f)
    out, err = cli("run", "keeps_nothing.json")
    check("warning" in err and "returns and stores nothing" in err,
          f"no warning for a graph without outputs: {err!r}")
    check("kernel_us" in out, f"the run's table is still printed:\n{out}")
    _, err = cli("run", "demo_graph.json")
    check("warning" not in err, f"a warning for a graph that has outputs: {err!r}")


def check_progress(cli, work):
    """A bar on a terminal for a transfer over 64 MiB; nothing when stderr is piped, for a small
    transfer, or on TERM=dumb."""
    elements = PROGRESS_MIN_BYTES // 4 + (1 << 20)  # 4 MiB over the threshold
    write_npy_zeros(os.path.join(work, "big.npy"), elements)
    try:
        _, err = cli("put", "BIG", "big.npy", "--overwrite")
        check(err == "", f"piped put printed on stderr: {err!r}")
        _, err = cli("get", "BIG", "big_back.npy")
        check(err == "", f"piped get printed on stderr: {err!r}")

        base = [cli.binary, f"--target={cli.target}"]
        for argv, label in [(base + ["put", "BIG", "big.npy", "--overwrite"], "put BIG ["),
                            (base + ["get", "BIG", "big_back.npy"], "get BIG [")]:
            code, out, terminal = run_on_terminal(argv, work)
            check(code == 0, f"{argv[2:]} on a terminal exited {code}: {terminal!r}")
            check(label in terminal and "100%" in terminal and "68.0 MiB" in terminal,
                  f"{argv[2:]} drew no progress bar on the terminal: {terminal!r}")
            check(out.startswith(("put BIG", "got BIG")), f"stdout: {out!r}")
        code, _, terminal = run_on_terminal(base + ["put", "A", "a.npy", "--overwrite"], work)
        check(code == 0 and "[" not in terminal, f"a bar for a small put: {terminal!r}")
        # A terminal that cannot clear a line would show the escape sequences as text.
        code, _, terminal = run_on_terminal(base + ["put", "BIG", "big.npy", "--overwrite"], work,
                                            term="dumb")
        check(code == 0 and terminal == "", f"a bar on TERM=dumb: {terminal!r}")
    finally:
        for name in ("big.npy", "big_back.npy"):
            if os.path.exists(os.path.join(work, name)):
                os.remove(os.path.join(work, name))
        cli("rm", "BIG")


def read_until(process, done, timeout=60):
    """Reads the process's stdout as it comes until done(what was read) holds; returns what was
    read and whether the process was still running then."""
    data = b""
    deadline = time.monotonic() + timeout
    fd = process.stdout.fileno()
    while not done(data) and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
    return data, process.poll() is None


def check_bench_streams(cli, work):
    """Each level's row leaves when it is measured, into a pipe too: the first row is read while
    the second level still runs."""
    def first_row(data):  # a complete line whose first cell is concurrency 1
        return any(line.split()[:1] == [b"1"] for line in data.split(b"\n")[:-1])

    def first_level(data):
        return b'"concurrency": 1,' in data

    for json_flag, done in [([], first_row), (["--json"], first_level)]:
        argv = [cli.binary, f"--target={cli.target}", "bench", "--op=row_sum", "--shape=64x64",
                "--concurrency=1:2", "--duration_s=2", *json_flag]
        with subprocess.Popen(argv, cwd=work, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) as process:
            first, running = read_until(process, done)
            first_at = time.monotonic()
            rest, err = process.communicate(timeout=60)
            # The second level runs 2 s after the first row; a row held back arrives at exit.
            ahead = time.monotonic() - first_at
        check(done(first), f"bench {json_flag}: no first row: {first!r} {err!r}")
        check(running and ahead > 1,
              f"bench {json_flag}: the first row came {ahead:.2f} s before the end:\n{first!r}")
        check(process.returncode == 0, f"bench exited {process.returncode}: {err!r}")
        full = (first + rest).decode()
        if json_flag:
            levels = json.loads(full)["levels"]
            check([level["concurrency"] for level in levels] == [1, 2], f"levels: {levels}")
        else:
            rows = [line.split()[0] for line in full.splitlines()[2:] if line.strip()]
            check(rows == ["1", "2"], f"bench rows: {full}")


class DeadlineChecks:
    """Against a server that hangs: calls that run no graph give up with DEADLINE_EXCEEDED by the
    default deadline, transfers after the same time without progress, a graph run waits."""

    def __init__(self, cli, work):
        self.cli, self.work, self.mute = cli, work, MuteServer()
        self.started = time.monotonic()
        self.background = {
            name: subprocess.Popen([cli.binary, f"--target={self.mute.target}", *args], cwd=work,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for name, args in [("ls", ["ls"]), ("put", ["put", "A", "a.npy"]),
                               ("run", ["run", "demo_graph.json"])]}

    def check_explicit(self):
        for args in (["ls"], ["run", "demo_graph.json"], ["put", "A", "a.npy"]):
            start = time.monotonic()
            _, err = self.cli("--timeout=1", *args, code=1, target=self.mute.target)
            took = time.monotonic() - start
            check("DEADLINE_EXCEEDED" in err and took < 5,
                  f"--timeout=1 {args} against a mute server: {took:.1f} s, {err!r}")

    def check_defaults(self):
        try:
            for name, text in (("ls", "--timeout=SECONDS"), ("put", "nothing moved for 30s")):
                process = self.background[name]
                try:
                    _, err = process.communicate(timeout=DEFAULT_DEADLINE_S + 30)
                except subprocess.TimeoutExpired:
                    raise Failure(f"{name} against a mute server still waits after "
                                  f"{time.monotonic() - self.started:.0f} s: no default deadline")
                took = time.monotonic() - self.started
                check(process.returncode == 1 and "DEADLINE_EXCEEDED" in err and text in err,
                      f"{name} against a mute server: exit {process.returncode}, {err!r}")
                check(took < DEFAULT_DEADLINE_S + 10, f"{name} gave up only after {took:.0f} s")
            check(time.monotonic() - self.started >= DEFAULT_DEADLINE_S, "the default came early")
            time.sleep(1)
            check(self.background["run"].poll() is None,
                  "run gave up on a graph without --timeout: graph runs have no default deadline")
        finally:
            self.close()

    def close(self):
        """Ends what is still running; safe to call more than once."""
        for process in self.background.values():
            if process.poll() is None:
                process.kill()
            process.communicate()
        self.mute.close()
