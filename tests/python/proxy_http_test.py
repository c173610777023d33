"""The HTTP/REST frontend of deploy/proxy/haproxy.cfg: two replicas serving the Open Inference
Protocol's HTTP API on --http_port behind the real HAProxy.

Calls without `x-opserve-session` spread over both replicas; a session's HTTP calls all reach
one replica, the one its gRPC calls reach (both backends hash the header on the same ring); the
proxy checks GET /v2/health/ready, so a stopped replica leaves the HTTP ring; TLS at the proxy.
The replica that answered is the response header x-opserve-replica, which the HTTP server sends
as the gRPC one does.
"""

import collections
import json
import ssl
import unittest
import urllib.error
import urllib.request

from client_support import work_dir
from proxy_support import Proxy, Replica

NAMES = ("replica-a", "replica-b")


class ProxyHttpTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = work_dir(cls.__name__)
        cls.replicas = {n: Replica(cls.dir, n, http=True) for n in NAMES}
        for r in cls.replicas.values():
            r.start()
        cls.proxy = Proxy(cls.dir, list(cls.replicas.values()))
        cls.proxy.wait_for_replicas(NAMES)
        cls.base = f"http://127.0.0.1:{cls.proxy.ports['http']}"
        seen = set()
        cls.proxy.wait_for(lambda: seen.add(cls.get("/v2/health/ready")[1]) or seen >= set(NAMES),
                           "every replica answers HTTP through the proxy")

    @classmethod
    def tearDownClass(cls):
        cls.proxy.stop()
        for r in cls.replicas.values():
            r.stop()

    @classmethod
    def get(cls, path, session=None, base=None, context=None):
        """(status, replica, body) of GET base+path."""
        request = urllib.request.Request((base or cls.base) + path)
        if session:
            request.add_header("x-opserve-session", session)
        try:
            with urllib.request.urlopen(request, timeout=5, context=context) as r:
                return r.status, r.headers.get("x-opserve-replica"), r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("x-opserve-replica"), e.read()

    def test_balance_sessions_and_failover(self):
        status, _, body = self.get("/v2")
        self.assertEqual(status, 200, body)
        self.assertIn("name", json.loads(body))

        spread = collections.Counter(self.get("/v2/health/ready")[1] for _ in range(100))
        for name in NAMES:
            self.assertTrue(30 <= spread[name] <= 70, spread)

        for i in range(50):
            session = f"http-session-{i}"
            seen = {self.get("/v2/health/ready", session)[1] for _ in range(4)}
            self.assertEqual(seen, {self.proxy.replica_of(session)}, session)

        gone, kept = NAMES
        self.assertEqual(self.replicas[gone].stop(), 0, self.replicas[gone].log())
        self.proxy.wait_for(lambda: all(self.get("/v2/health/ready")[1] == kept for _ in range(4)),
                            f"{gone} leaves the HTTP ring")
        for i in range(20):
            status, replica, _ = self.get("/v2/health/ready", f"http-session-{i}")
            self.assertEqual((status, replica), (200, kept))
        self.replicas[gone].start()
        self.proxy.wait_for(lambda: {self.get("/v2/health/ready")[1] for _ in range(4)} == set(NAMES),
                            f"{gone} rejoins the HTTP ring")

    def test_tls_at_the_proxy(self):
        context = ssl.create_default_context(cafile=self.proxy.ca)
        status, replica, _ = self.get("/v2/health/ready",
                                      base=f"https://localhost:{self.proxy.ports['http_tls']}",
                                      context=context)
        self.assertEqual(status, 200)
        self.assertIn(replica, NAMES)


if __name__ == "__main__":
    unittest.main()
