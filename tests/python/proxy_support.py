"""Replicas of opserve behind the real HAProxy of deploy/proxy/haproxy.cfg, on loopback ports.

The configuration runs as deploy/ has it, except for its two `server-template` lines (DNS names
in a deployment), which become one `server` line per replica here. Not a test itself.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "support"))
from e2e_script import free_port  # noqa: E402
from client_support import wait_listening  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir)
CONFIG = os.path.join(ROOT, "deploy", "proxy", "haproxy.cfg")
STARTUP_SECONDS = 30
HEALTH = "/grpc.health.v1.Health/Check"
SESSION = "x-opserve-session"
REPLICA = "x-opserve-replica"


class Replica:
    """One opserve on fixed loopback ports (gRPC, metrics, and the OIP HTTP port when asked),
    so that it can be stopped and started again where the proxy expects it."""

    def __init__(self, directory, name, http=False, extra_args=()):
        self.directory, self.name = directory, name
        self.port, self.metrics_port = free_port(), free_port()
        self.http_port = free_port()
        self.http = http
        self.extra_args = tuple(extra_args)
        self.process = None
        self.starts = 0

    def start(self):
        binary = os.environ.get("OPSERVE_BINARY")
        if not binary:
            raise RuntimeError("OPSERVE_BINARY is not set (ctest sets it to the server binary)")
        self.starts += 1
        self.log_path = os.path.join(self.directory, f"{self.name}.{self.starts}.log")
        args = [binary, "--host=127.0.0.1", f"--port={self.port}",
                f"--metrics_port={self.metrics_port}", "--device=cpu",
                f"--replica_name={self.name}", "--shutdown_grace_seconds=5", *self.extra_args]
        args.append(f"--http_port={self.http_port if self.http else -1}")
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        wait_listening(channel, self.name, self.stop, self.log, STARTUP_SECONDS)

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        """SIGTERM, as a deployment stops it; returns the exit status (0 when it drained)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STARTUP_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return None if self.process is None else self.process.returncode

    def counter(self, rpc, code="OK"):
        """opserve_requests_total{rpc, code} from this replica's /metrics."""
        import urllib.request
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        want = f'opserve_requests_total{{code="{code}",rpc="{rpc}"}}'
        for line in text.splitlines():
            if line.startswith(want + " "):
                return float(line.split()[-1])
        raise AssertionError(f"{want} is not in {self.name}'s metrics")


def render_config(replicas):
    """deploy/proxy/haproxy.cfg with its server-template lines replaced by the replicas."""
    with open(CONFIG) as f:
        lines = f.read().splitlines()
    out, replaced = [], 0
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("server-template "):
            replaced += 1
            http = stripped.split()[3].endswith(":8000")
            for r in replicas:
                port = r.http_port if http else r.port
                out.append(f"    server {r.name} 127.0.0.1:{port}")
        else:
            out.append(line)
    if replaced != 2:
        raise AssertionError(f"{CONFIG}: expected the gRPC and the HTTP server-template line, "
                             f"found {replaced}")
    return "\n".join(out) + "\n"


def make_certificate(directory):
    """A self-signed certificate for localhost and 127.0.0.1 made by openssl: (pem with the
    certificate and key for HAProxy, the certificate alone for clients)."""
    key, cert = os.path.join(directory, "proxy.key"), os.path.join(directory, "proxy.crt")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", cert, "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=30)
    both = os.path.join(directory, "proxy.pem")
    with open(both, "w") as out:
        for path in (cert, key):
            with open(path) as f:
                out.write(f.read())
    return both, cert


class Proxy:
    """HAProxy with the deployed configuration in front of `replicas`."""

    def __init__(self, directory, replicas):
        haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
        self.pem, self.ca = make_certificate(directory)
        self.config = os.path.join(directory, "haproxy.cfg")
        with open(self.config, "w") as f:
            f.write(render_config(replicas))
        self.ports = {k: free_port() for k in ("grpc", "grpc_tls", "http", "http_tls")}
        env = dict(os.environ, OPSERVE_PROXY_CERT=self.pem,
                   OPSERVE_PROXY_GRPC=f"127.0.0.1:{self.ports['grpc']}",
                   OPSERVE_PROXY_GRPC_TLS=f"127.0.0.1:{self.ports['grpc_tls']}",
                   OPSERVE_PROXY_HTTP=f"127.0.0.1:{self.ports['http']}",
                   OPSERVE_PROXY_HTTP_TLS=f"127.0.0.1:{self.ports['http_tls']}")
        check = subprocess.run([haproxy, "-c", "-f", self.config], env=env, capture_output=True,
                               text=True, timeout=30)
        if check.returncode != 0:
            raise AssertionError(f"haproxy -c: {check.stdout}{check.stderr}")
        self.log_path = os.path.join(directory, "haproxy.log")
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen([haproxy, "-f", self.config], env=env, stdout=log,
                                            stderr=subprocess.STDOUT)
        self._wait_listening()
        # Only now: a channel whose first connection is refused waits 10 s before it tries again
        # (gRPC's reconnect backoff), which was most of what the suites' setup waits.
        self.target = f"127.0.0.1:{self.ports['grpc']}"
        self.tls_target = f"127.0.0.1:{self.ports['grpc_tls']}"
        self.channel = grpc.insecure_channel(self.target)
        self.health = self.channel.unary_unary(HEALTH, request_serializer=lambda b: b,
                                               response_deserializer=lambda b: b)

    def _wait_listening(self):
        """Until every frontend port accepts a connection; raises with HAProxy's log if it
        exits or is not listening within STARTUP_SECONDS."""
        deadline = time.monotonic() + STARTUP_SECONDS
        for port in self.ports.values():
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        self.process.kill()
                        self.process.wait()
                        raise RuntimeError(f"haproxy is not listening on {port}:\n{self.log()}")
                    time.sleep(0.02)

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        self.channel.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def replica_of(self, session=None):
        """The replica that answers a health check of this session (None: without the header),
        read from its x-opserve-replica response header through the proxy."""
        metadata = [(SESSION, session)] if session else None
        _, call = self.health.with_call(b"", metadata=metadata, timeout=5)
        return dict(call.initial_metadata()).get(REPLICA)

    def wait_for(self, condition, what, seconds=30):
        """Polls condition() until it is true; fails naming `what` after `seconds`."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                if condition():
                    return
            except (grpc.RpcError, OSError):  # refused, reset or timed out while it changes
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {seconds} s: {what}\n{self.log()[-3000:]}")
            time.sleep(0.05)

    def wait_for_replicas(self, names):
        """Until calls without a session have reached every replica in `names`."""
        seen = set()
        self.wait_for(lambda: seen.add(self.replica_of()) or seen >= set(names),
                      f"every replica of {sorted(names)} answers through the proxy")
