"""opserve.Client against a real CPU server: every call, every dtype, errors, progress, TLS and
tokens; and the bfloat16 conversions on their own."""

import os
import subprocess
import unittest

import grpc
import numpy as np

import op_table
import opserve
from client_support import ClientTestCase, Server, ServerTestCase, work_dir
from e2e_script import free_port

RNG = np.random.default_rng(16)


class ProtobufRuntimeTest(unittest.TestCase):
    def test_runs_on_the_implementation_asked_for(self):
        # ctest runs these suites once as Debian's runtime comes and once with the pure-Python
        # implementation; make sure the variable took, or the second run would prove nothing.
        from google.protobuf.internal import api_implementation
        wanted = os.environ.get("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION")
        print(f"protobuf implementation: {api_implementation.Type()}")
        if wanted:
            self.assertEqual(api_implementation.Type(), wanted)


class BFloat16Test(unittest.TestCase):
    def test_rounds_to_nearest_even(self):
        # 1 + 2^-8 lies halfway between bfloat16's 1 and 1 + 2^-7: ties go to the even one, 1;
        # 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: it goes up to 1 + 2^-6.
        values = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, -2.5, 0.0],
                          np.float32)
        back = opserve.bfloat16_bits_to_float32(opserve.float32_to_bfloat16_bits(values))
        np.testing.assert_array_equal(back, [1.0, 1 + 2 ** -6, 1 + 2 ** -7, -2.5, 0.0])

    def test_special_values(self):
        values = np.array([np.nan, np.inf, -np.inf, 3.4e38], np.float32)
        back = opserve.bfloat16_bits_to_float32(opserve.float32_to_bfloat16_bits(values))
        self.assertTrue(np.isnan(back[0]))
        np.testing.assert_array_equal(back[1:], [np.inf, -np.inf, np.inf])  # 3.4e38 rounds past max

    def test_float32_to_bits_and_back_is_exact_on_bfloat16_values(self):
        bits = RNG.integers(0, 1 << 16, 4096, dtype=np.uint16)
        bits = bits[~np.isnan(opserve.bfloat16_bits_to_float32(bits))]
        np.testing.assert_array_equal(
            opserve.float32_to_bfloat16_bits(opserve.bfloat16_bits_to_float32(bits)), bits)


def random_array(dtype, shape):
    if dtype == opserve.DType.INT32:
        info = np.iinfo(np.int32)
        return RNG.integers(info.min, info.max, shape, dtype=np.int32, endpoint=True)
    if dtype == opserve.DType.INT64:
        info = np.iinfo(np.int64)
        return RNG.integers(info.min, info.max, shape, dtype=np.int64, endpoint=True)
    return RNG.standard_normal(shape).astype(np.float32)


class ClientTest(ClientTestCase):
    def test_health(self):
        self.assertTrue(self.client.health())

    def test_ops(self):
        ops = self.client.ops()
        self.assertEqual(ops.backend, "cpu")
        self.assertTrue(ops.device)
        self.assertEqual({op.name for op in ops.ops}, op_table.shared().names("cpu"),
                         "ListOps against the op table")
        matmul = ops.op("matmul")
        self.assertEqual(set(matmul.dtypes), {opserve.DType.FLOAT32, opserve.DType.BFLOAT16})
        for op in ops.ops:
            self.assertIn(op.default_algorithm, [a.name for a in op.algorithms])
            self.assertTrue(op.description)
        with self.assertRaises(KeyError):
            ops.op("no_such_op")

    def test_put_list_get_delete(self):
        a = random_array(opserve.DType.FLOAT32, (64, 48))
        info = self.client.put("weights/layer1:0", a)
        self.assertEqual(info, opserve.TensorInfo("weights/layer1:0", opserve.DType.FLOAT32,
                                                  (64, 48), a.nbytes, "cpu"))
        self.assertEqual(self.client.list(), [info])
        got = self.client.get("weights/layer1:0")
        self.assertEqual(got.dtype, np.float32)
        np.testing.assert_array_equal(got, a)
        got[0, 0] = 1  # a writable array of its own
        self.assertEqual(self.client.delete("weights/layer1:0"), info)
        self.assertEqual(self.client.list(), [])

    def test_every_dtype_the_server_lists_round_trips(self):
        listed = {d for op in self.client.ops().ops for d in op.dtypes}
        self.assertEqual(listed, set(opserve.DType), "a dtype this client does not know")
        for dtype in listed:
            with self.subTest(dtype=dtype.value):
                if dtype == opserve.DType.BFLOAT16:
                    values = random_array(opserve.DType.FLOAT32, (7, 5))
                    bits = opserve.float32_to_bfloat16_bits(values)
                    self.client.put("t", values, dtype="bfloat16", overwrite=True)
                    got = self.client.get("t")
                    self.assertEqual(got.dtype, np.float32)  # the default: widened to float32
                    np.testing.assert_array_equal(got, opserve.bfloat16_bits_to_float32(bits))
                    raw = self.client.get("t", raw_bfloat16=True)
                    self.assertEqual(raw.dtype, np.uint16)
                    np.testing.assert_array_equal(raw, bits)
                    # uint16 bits are uploaded as they are.
                    self.client.put("t", bits, dtype=opserve.DType.BFLOAT16, overwrite=True)
                    np.testing.assert_array_equal(self.client.get("t", raw_bfloat16=True), bits)
                else:
                    values = random_array(dtype, (7, 5))
                    info = self.client.put("t", values, overwrite=True)
                    self.assertEqual(info.dtype, dtype)
                    got = self.client.get("t")
                    self.assertEqual(got.dtype, values.dtype)
                    np.testing.assert_array_equal(got, values)

    def test_shapes(self):
        for shape in [(), (0,), (3, 0), (1,), (4, 3, 2)]:
            with self.subTest(shape=shape):
                values = random_array(opserve.DType.INT64, shape)
                self.assertEqual(self.client.put("s", values, overwrite=True).shape, shape)
                got = self.client.get("s")
                self.assertEqual(got.shape, shape)
                np.testing.assert_array_equal(got, values)

    def test_layouts_and_byte_orders_are_converted(self):
        a = random_array(opserve.DType.FLOAT32, (6, 9))
        self.client.put("t", a.T)  # not C-contiguous
        np.testing.assert_array_equal(self.client.get("t"), a.T)
        self.client.put("b", a.astype(">f4"))  # big-endian float32 is still FLOAT32
        np.testing.assert_array_equal(self.client.get("b"), a)
        self.client.put("c", a.astype(np.float64), dtype="float32")  # narrowing when asked
        np.testing.assert_array_equal(self.client.get("c"), a)

    def test_progress_is_reported_per_chunk(self):
        # 40960 bytes: 10 chunks of 4096, the smallest chunk the server sends.
        data = random_array(opserve.DType.INT32, (10240,))
        with opserve.Client(self.server.target, chunk_bytes=4096) as client:
            sent, received = [], []
            client.put("p", data, progress=lambda done, total: sent.append((done, total)))
            got = client.get("p", progress=lambda done, total: received.append((done, total)))
        np.testing.assert_array_equal(got, data)
        expected = [(4096 * i, 40960) for i in range(1, 11)]
        self.assertEqual(sent, expected)
        self.assertEqual(received, expected)
        empty = []
        self.client.put("e", np.zeros((0,), np.int32), progress=lambda *p: empty.append(p))
        self.client.get("e", progress=lambda *p: empty.append(p))
        self.assertEqual(empty, [(0, 0), (0, 0)])

    def test_an_exception_in_progress_is_raised_as_it_is(self):
        class Stop(Exception):
            pass

        def stop(done, total):
            raise Stop(done)

        data = np.zeros(3 * 4096, np.int32)
        with opserve.Client(self.server.target, chunk_bytes=4096, timeout=30) as client:
            with self.assertRaises(Stop):
                client.put("p", data, progress=stop)
            client.put("p", data)
            with self.assertRaises(Stop):
                client.get("p", progress=stop)
            self.assertTrue(client.health())  # the channel is still usable

    def test_overwrite(self):
        self.client.put("o", np.zeros(3, np.int32))
        err = self.assertError(grpc.StatusCode.ALREADY_EXISTS,
                               lambda: self.client.put("o", np.ones(3, np.int32)), "'o'")
        self.assertIn("overwrite", err.message)
        self.client.put("o", np.ones(4, np.int64), overwrite=True)
        np.testing.assert_array_equal(self.client.get("o"), np.ones(4, np.int64))

    def test_errors_carry_code_and_message(self):
        self.assertError(grpc.StatusCode.NOT_FOUND, lambda: self.client.get("missing"), "'missing'")
        self.assertError(grpc.StatusCode.NOT_FOUND, lambda: self.client.delete("missing"),
                         "'missing'")
        self.assertError(grpc.StatusCode.INVALID_ARGUMENT,
                         lambda: self.client.put("bad name!", np.zeros(1, np.int32)), "bad name!")
        # Refused by the client before sending, coded as the server would.
        self.assertError(grpc.StatusCode.INVALID_ARGUMENT,
                         lambda: self.client.put("f64", np.zeros(3)), "float64")
        self.assertError(grpc.StatusCode.INVALID_ARGUMENT,
                         lambda: self.client.put("x", np.zeros(3, np.float32), dtype="int32"),
                         "INT32")
        self.assertError(grpc.StatusCode.INVALID_ARGUMENT,
                         lambda: self.client.put("x", np.zeros(3, np.int32), dtype="float16"),
                         "float16")

    def test_unreachable_server_is_unavailable(self):
        with opserve.Client(f"127.0.0.1:{free_port()}", timeout=10) as client:
            self.assertError(grpc.StatusCode.UNAVAILABLE, client.health)


def make_certificate(directory):
    """A self-signed certificate for 127.0.0.1 (openssl, a CI dependency)."""
    key, cert = os.path.join(directory, "server.key"), os.path.join(directory, "server.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", cert, "-days", "2",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    return key, cert


class SecureServerTest(unittest.TestCase):
    """TLS and bearer tokens: each token is a tenant that sees only its own tensors."""

    @classmethod
    def setUpClass(cls):
        directory = work_dir(cls.__name__)
        key, cls.cert = make_certificate(directory)
        tokens = os.path.join(directory, "tokens")
        with open(tokens, "w") as f:
            f.write("alice:alice-token\nbob:bob-token\n")
        with open(cls.cert, "rb") as f:
            cls.cert_pem = f.read()
        cls.server = Server(directory, [f"--tls_cert={cls.cert}", f"--tls_key={key}",
                                        f"--auth_tokens_file={tokens}"], tls_root=cls.cert_pem)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def client(self, token, tls=None):
        client = opserve.Client(self.server.target, token=token, timeout=30,
                                tls=opserve.TLS(root_ca=self.cert) if tls is None else tls)
        self.addCleanup(client.close)
        return client

    def test_tenants_see_their_own_tensors(self):
        alice = self.client("alice-token")
        bob = self.client("bob-token", tls=opserve.TLS(root_ca=self.cert_pem))  # PEM bytes work too
        alice.put("mine", np.arange(4, dtype=np.int32))
        self.assertEqual([t.name for t in alice.list()], ["mine"])
        self.assertEqual(bob.list(), [])
        with self.assertRaises(opserve.OpserveError) as caught:
            bob.get("mine")
        self.assertEqual(caught.exception.code, grpc.StatusCode.NOT_FOUND)
        np.testing.assert_array_equal(alice.get("mine"), np.arange(4, dtype=np.int32))
        alice.delete("mine")

    def test_a_wrong_or_missing_token_is_unauthenticated(self):
        for token in ("nobody", None):
            with self.subTest(token=token), self.assertRaises(opserve.OpserveError) as caught:
                self.client(token).list()
            self.assertEqual(caught.exception.code, grpc.StatusCode.UNAUTHENTICATED)

    def test_plaintext_to_a_tls_server_is_unavailable(self):
        with self.assertRaises(opserve.OpserveError) as caught:
            self.client("alice-token", tls=False).list(timeout=10)
        self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)


if __name__ == "__main__":
    unittest.main()
