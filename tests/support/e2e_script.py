"""What the stdlib-Python end-to-end scripts share (tests/client/cli_e2e_test.py,
tests/python/foreign_client_test.py and the Python package's tests): how they fail, log and start
the server under test.

Not a test itself; the scripts import it from their own location (../support).
"""

import random
import socket
import subprocess
import traceback


class Failure(Exception):
    """A check that did not hold: reported by its message alone, without a traceback."""


def check(condition, message):
    if not condition:
        raise Failure(message)


def logger(name):
    """A print() that prefixes the script's name and flushes, so lines keep their order when the
    server's output or ctest's interleaves with them."""
    def log(*args):
        print(f"{name}:", *args, flush=True)
    return log


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def free_port():
    """A loopback port that was free a moment ago, for a server started next. Taken below the
    kernel's ephemeral range where there is room: a port from inside it, once released here, can
    become the source port of any process's outgoing connection before the server binds it (and
    again while a test restarts a server on the same port)."""
    low = _ephemeral_low()
    if low >= 12000:
        rng = random.Random()  # seeded from os.urandom: parallel tests pick apart
        for _ in range(100):
            port = rng.randrange(10000, low)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_opserve(binary, device, log_path, extra_args=()):
    """opserve on 127.0.0.1 and a free port, without the metrics listener, its output (stdout and
    stderr) in log_path; extra_args are more flags. Returns (process, port); the caller stops
    the process."""
    port = free_port()
    with open(log_path, "w") as server_log:
        server = subprocess.Popen([binary, "--host=127.0.0.1", f"--port={port}", "--metrics_port=-1", "--http_port=-1",
                                   f"--device={device}", *extra_args],
                                  stdout=server_log, stderr=subprocess.STDOUT)
    return server, port


def report_failure(log, error):
    """The end of a failed run: a traceback for an unexpected error (a Failure's message says it
    all), then the FAILED line."""
    if not isinstance(error, Failure):
        traceback.print_exc()
    log(f"FAILED: {error}")
