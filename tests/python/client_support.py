"""What the tests of the opserve Python package share: a real server per test class.

The tests run under the venv that the python_client_install fixture made (the package installed
there, Debian's grpcio, protobuf and numpy seen through --system-site-packages). ctest passes:
  OPSERVE_BINARY         the server (its CPU backend);
  OPSERVE_TEST_WORK_DIR  for server logs, certificates and the like.
Not a test itself.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "support"))
from e2e_script import start_opserve  # noqa: E402

STARTUP_SECONDS = 60


def wait_listening(channel, what, stop, log, seconds=STARTUP_SECONDS):
    """Waits for `channel` to connect, then closes it; on a timeout stops the server (`stop()`)
    and raises with its log (`log()`)."""
    try:
        grpc.channel_ready_future(channel).result(timeout=seconds)
    except grpc.FutureTimeoutError:
        stop()
        raise RuntimeError(f"{what} did not listen within {seconds} s:\n{log()}") from None
    finally:
        channel.close()


def work_dir(name):
    """An empty directory for one test class: OPSERVE_TEST_WORK_DIR/name, emptied of an earlier
    run's files (a temporary directory without the variable)."""
    root = os.environ.get("OPSERVE_TEST_WORK_DIR")
    if not root:
        return tempfile.mkdtemp(prefix=f"{name}-")
    path = os.path.join(root, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


class Server:
    """opserve on a free loopback port; `target` is its address. Stop it with stop()."""

    def __init__(self, directory, extra_args=(), tls_root=None, binary=None, name="opserve", device="cpu"):
        binary = binary or os.environ.get("OPSERVE_BINARY")
        if not binary:
            raise RuntimeError("OPSERVE_BINARY is not set (ctest sets it to the server binary)")
        self.log_path = os.path.join(directory, f"{name}.log")
        self.process, port = start_opserve(binary, device, self.log_path, extra_args)
        self.target = f"127.0.0.1:{port}"
        if tls_root is None:
            channel = grpc.insecure_channel(self.target)
        else:
            channel = grpc.secure_channel(self.target, grpc.ssl_channel_credentials(tls_root))
        wait_listening(channel, "opserve", self.stop, self.log)

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        """SIGTERM, as a deployment stops it; returns the exit status (0 when it drained)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STARTUP_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


class ServerTestCase(unittest.TestCase):
    """One server for the whole class: starting one per test would cost more than the tests."""

    server_args = ()
    server_device = "cpu"  # its --device: "cpu:2" for two CPU devices

    @classmethod
    def setUpClass(cls):
        cls.work_dir = work_dir(cls.__name__)
        cls.server = Server(cls.work_dir, cls.server_args, device=cls.server_device)

    @classmethod
    def tearDownClass(cls):
        status = cls.server.stop()
        if status != 0:
            raise AssertionError(f"opserve exited {status}:\n{cls.server.log()}")



class ClientTestCase(ServerTestCase):
    """A ServerTestCase with an opserve.Client per test; every tensor a test leaves is deleted."""

    def setUp(self):
        import opserve  # the package under test; pure-protobuf suites import this module too
        self.opserve = opserve
        self.client = opserve.Client(self.server.target, timeout=30)
        self.addCleanup(self.client.close)
        self.addCleanup(self.delete_all)

    def delete_all(self):
        for info in self.client.list():
            self.client.delete(info.name)

    def assertError(self, code, call, *message_parts):
        with self.assertRaises(self.opserve.OpserveError) as caught:
            call()
        self.assertEqual(caught.exception.code, code, caught.exception.message)
        for part in message_parts:
            self.assertIn(part, caught.exception.message)
        self.assertTrue(str(caught.exception).startswith(f"{code.name}: "))
        return caught.exception
