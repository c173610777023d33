"""Two opserve replicas behind the real HAProxy of deploy/proxy/haproxy.cfg.

What a deployment relies on, through the opserve package: 200 sessions each put, execute and
get their own tensors with no miss (each session's calls reach one replica); calls without a
session are balanced per call over one HTTP/2 connection; a replica that is stopped leaves the
ring, its sessions get the NOT_FOUND that says their replica is gone, the others keep working;
when it comes back, only its share of the sessions moves. One session runs through TLS at the
proxy.
"""

import collections
import concurrent.futures
import os
import unittest

import grpc
import numpy as np

from client_support import work_dir
from proxy_support import Proxy, Replica

SESSIONS = 200
STATELESS_CALLS = 200
NAMES = ("replica-a", "replica-b")


def session_ids():
    return [f"proxy-test-{i:03d}" for i in range(SESSIONS)]


class ProxyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import opserve
        cls.opserve = opserve
        cls.dir = work_dir(cls.__name__)
        cls.replicas = {n: Replica(cls.dir, n) for n in NAMES}
        for r in cls.replicas.values():
            r.start()
        cls.proxy = Proxy(cls.dir, list(cls.replicas.values()))
        cls.proxy.wait_for_replicas(NAMES)
        cls.pool = concurrent.futures.ThreadPoolExecutor(8)

    @classmethod
    def tearDownClass(cls):
        cls.pool.shutdown()
        cls.proxy.stop()
        for r in cls.replicas.values():
            r.stop()

    def client(self, session=None, tls=False):
        if tls:
            return self.opserve.Client(self.proxy.tls_target, session=session, timeout=20,
                                       tls=self.opserve.TLS(root_ca=self.proxy.ca,
                                                            server_name="localhost"))
        return self.opserve.Client(self.proxy.target, session=session, timeout=20)

    def put_run_get(self, session, tls=False):
        """Puts the session's own x, computes its row mean into y on the server, reads y back;
        returns the replica that holds the session."""
        x = np.random.default_rng(abs(hash(session)) % 2**32).random((6, 10), dtype=np.float32)
        with self.client(session, tls) as c:
            c.put(f"{session}/x", x, overwrite=True)
            g = self.opserve.Graph()
            g.output(g.row_mean(g.stored(f"{session}/x")), name="m", store_as=f"{session}/y",
                     overwrite=True)
            np.testing.assert_allclose(c.run(g)["m"], x.mean(axis=1), rtol=1e-5)
            np.testing.assert_allclose(c.get(f"{session}/y"), x.mean(axis=1), rtol=1e-5)
        return self.proxy.replica_of(session)

    def run_stored(self, session):
        """Executes on the session's stored x: None when it worked, else the OpserveError."""
        with self.client(session) as c:
            g = self.opserve.Graph()
            g.output(g.row_mean(g.stored(f"{session}/x")), name="m")
            try:
                c.run(g)
                return None
            except self.opserve.OpserveError as e:
                return e

    def placement(self):
        ids = session_ids()
        return dict(zip(ids, self.pool.map(self.proxy.replica_of, ids)))

    def test_sessions_stateless_failover_and_return(self):
        ids = session_ids()
        # 1. Every session puts, runs and gets its own tensors: no miss.
        holders = dict(zip(ids, self.pool.map(self.put_run_get, ids)))
        by_replica = collections.Counter(holders.values())
        self.assertEqual(set(by_replica), set(NAMES), by_replica)
        for name in NAMES:  # consistent hashing spreads them, roughly
            self.assertGreater(by_replica[name], SESSIONS // 5, by_replica)
            direct = self.opserve.Client(f"127.0.0.1:{self.replicas[name].port}")
            stored = {t.name.split("/")[0] for t in direct.list()} & set(ids)
            direct.close()
            self.assertEqual(stored, {s for s, r in holders.items() if r == name},
                             f"{name} holds the tensors of exactly the sessions hashed to it")

        # 2. Calls without a session: balanced per call, over the one connection of one client.
        before = {n: r.counter("Execute") for n, r in self.replicas.items()}
        with self.client() as c:
            for i in range(STATELESS_CALLS):
                g = self.opserve.Graph()
                g.output(g.row_sum(g.input("a", np.full((2, 3), i, np.float32))), name="s")
                np.testing.assert_array_equal(c.run(g)["s"], [3 * i, 3 * i])
        counted = {n: r.counter("Execute") - before[n] for n, r in self.replicas.items()}
        self.assertEqual(sum(counted.values()), STATELESS_CALLS, counted)
        for name in NAMES:
            self.assertTrue(0.3 <= counted[name] / STATELESS_CALLS <= 0.7, counted)

        # 3. One replica stops (SIGTERM: it drains and exits 0).
        gone, kept = NAMES
        self.assertEqual(self.replicas[gone].stop(), 0, self.replicas[gone].log())
        self.proxy.wait_for(lambda: self.proxy.replica_of(ids[0]) == kept
                            and self.proxy.replica_of() == kept,
                            f"{gone} leaves the ring")
        errors = dict(zip(ids, self.pool.map(self.run_stored, ids)))
        for s in ids:
            e = errors[s]
            if holders[s] == kept:
                self.assertIsNone(e, f"{s} on {kept}")
                continue
            self.assertIsNotNone(e, f"{s} was on {gone}")
            self.assertEqual(e.code, grpc.StatusCode.NOT_FOUND, e.message)
            self.assertIn(f"replica {kept} has never stored anything for this x-opserve-session",
                          e.message)
            self.assertIn("put them again", e.message)
            self.assertEqual(e.session_unknown, kept)
        # A tensor deleted on its own replica is a plain NOT_FOUND: the session is known there.
        survivor = next(s for s in ids if holders[s] == kept)
        with self.client(survivor) as c:
            c.delete(f"{survivor}/y")
            with self.assertRaises(self.opserve.OpserveError) as caught:
                c.get(f"{survivor}/y")
        self.assertEqual(caught.exception.code, grpc.StatusCode.NOT_FOUND)
        self.assertIsNone(caught.exception.session_unknown, caught.exception.message)
        self.assertNotIn("never stored", caught.exception.message)
        # Sessions that put again work on their new replica.
        moved = [s for s in ids if holders[s] == gone]
        self.assertEqual(set(self.pool.map(self.put_run_get, moved)), {kept})

        # 4. The replica comes back: only the sessions it had return to it (consistent hashing
        # on a ring of the same servers), about half of them with two replicas.
        self.replicas[gone].start()
        self.proxy.wait_for(lambda: self.proxy.replica_of(moved[0]) == gone, f"{gone} rejoins")
        after = self.placement()
        changed = {s for s in ids if after[s] != kept}
        self.assertEqual(changed, set(moved))
        self.assertTrue(0.2 <= len(changed) / SESSIONS <= 0.8, len(changed))
        self.assertEqual(self.run_stored(moved[0]).session_unknown, gone)

    def test_a_session_known_by_what_it_stored(self):
        """A session is known to its replica once it stored something there, through Execute's
        store_as as well as PutTensor; before, its misses say the replica never stored for it."""
        session = "proxy-test-execute-only"
        with self.client(session) as c:
            with self.assertRaises(self.opserve.OpserveError) as caught:
                c.get("missing")
            self.assertEqual(caught.exception.session_unknown, self.proxy.replica_of(session))
            g = self.opserve.Graph()
            g.output(g.row_sum(g.input("a", np.ones((2, 2), np.float32))), name="s",
                     store_as=f"{session}/s", overwrite=True)
            c.run(g)
            with self.assertRaises(self.opserve.OpserveError) as caught:
                c.get("missing")
        self.assertEqual(caught.exception.code, grpc.StatusCode.NOT_FOUND)
        self.assertIsNone(caught.exception.session_unknown, caught.exception.message)

    def test_tls_at_the_proxy(self):
        holder = self.put_run_get("proxy-test-tls", tls=True)
        self.assertIn(holder, NAMES)
        with self.assertRaises(self.opserve.OpserveError) as caught:
            # The plain listener does not speak TLS, nor the TLS one plain HTTP/2.
            plain = self.opserve.Client(self.proxy.tls_target, timeout=3)
            try:
                plain.health()
            finally:
                plain.close()
        self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)


    def test_deployments_run_this_configuration(self):
        """Kubernetes' ConfigMap and Compose's mount carry deploy/proxy/haproxy.cfg itself."""
        import subprocess
        import yaml
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir)
        with open(os.path.join(root, "deploy", "proxy", "haproxy.cfg")) as f:
            config = f.read()
        rendered = subprocess.run(["kubectl", "kustomize", os.path.join(root, "deploy", "k8s", "proxy")],
                                  check=True, capture_output=True, text=True, timeout=60).stdout
        maps = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "ConfigMap"]
        self.assertEqual([m["data"]["haproxy.cfg"] for m in maps], [config],
                         "deploy/k8s/proxy/haproxy.cfg differs from deploy/proxy/haproxy.cfg")
        with open(os.path.join(root, "deploy", "docker", "compose.yaml")) as f:
            proxy = yaml.safe_load(f)["services"]["proxy"]
        self.assertIn("../proxy/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro", proxy["volumes"])


if __name__ == "__main__":
    unittest.main()
