#!/usr/bin/python3
"""The Open Inference Protocol (KServe v2) side of opserve, from a client written from the
specification alone: proto/inference/grpc_service.proto, proto/opserve/v1/opserve.proto and
docs/API.md's "Open Inference Protocol (KServe v2)" section, and the op table read through
opserve-op-table (op_table.py: the ops, their shapes and their CPU reference; no op list here).
Against real servers on the CPU backend in `make test`, on the CUDA backend in the GPU suite
(OPSERVE_TEST_DEVICE=cuda): every RPC, every op model and datatype against the CPU reference,
every op's empty inputs, a saved graph (against numpy), stored-tensor inputs and outputs,
system shared memory with a 256 MiB region, ModelConfig and ModelStatistics, docs/API.md's
hostile cases (code, culprit named, nothing changed) and tenancy. Stubs are generated at test time with protoc and
grpc_python_plugin (Debian's python3-grpcio has no grpc_tools).

  kserve_test.py --opserve BINARY --proto-root proto --work-dir DIR [--op-table TOOL]
                 [--junit-xml FILE] [unittest args]
"""

import argparse
import os
import re
import sys
import threading
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kserve_support as ks  # noqa: E402
import op_table  # noqa: E402
from kserve_support import MiB, Client, In, Out, request  # noqa: E402

import grpc  # noqa: E402

ARGS = None
TABLE = None  # op_table.OpTable
K = KG = O = OG = R = RG = None  # generated modules: inference, opserve.v1, reflection
C = grpc.StatusCode
CUDA = ks.device().startswith("cuda")  # the GPU suite runs this file against the CUDA backend
# docs/API.md, "Open Inference Protocol": an op model's inputs by its arity; its output is "y".
INPUT_NAMES = {1: ["x"], 2: ["a", "b"]}


class Base(unittest.TestCase):
    server_args = ()
    token = None

    @classmethod
    def setUpClass(cls):
        cls.dir = os.path.join(ARGS.work_dir, cls.__name__)
        os.makedirs(cls.dir, exist_ok=True)
        cls.server = ks.Server(ARGS.opserve, cls.dir, "opserve", cls.extra_args())
        cls.c = Client(cls.server.target, cls.token)
        listed = cls.c.ListOps(O.ListOpsRequest())
        cls.backend = listed.backend
        cls.ops = {op.name: op for op in listed.ops}

    @classmethod
    def extra_args(cls):
        return cls.server_args

    @classmethod
    def tearDownClass(cls):
        status = cls.server.stop()
        if status != 0:
            raise AssertionError(f"opserve exited {status}:\n{cls.server.log()[-4000:]}")

    def setUp(self):
        self.seed = int.from_bytes(os.urandom(4), "little")  # named in check_output's messages
        self.rng = np.random.default_rng(self.seed)
        self.shms = []

    def tearDown(self):
        for shm in self.shms:
            shm.close()

    def shm(self, size):
        shm = ks.Shm(f"kserve_test_{os.getpid()}_{len(self.shms)}_{self.id().rsplit('.', 1)[-1][:30]}", size)
        self.shms.append(shm)
        return shm

    def register(self, name, shm, offset=0, size=None, client=None):
        (client or self.c).SystemSharedMemoryRegister(K.SystemSharedMemoryRegisterRequest(
            name=name, key=shm.key, offset=offset, byte_size=shm.size - offset if size is None else size))
        self.addCleanup(self.unregister_quietly, client or self.c, name)

    def unregister_quietly(self, client, name):
        self.quietly(lambda: client.SystemSharedMemoryUnregister(K.SystemSharedMemoryUnregisterRequest(name=name)))

    @staticmethod
    def quietly(call):
        """A clean-up call whose object the test may have removed already."""
        try:
            call()
        except grpc.RpcError:
            pass

    def expect_error(self, code, call, *culprits, client=None):
        """call() fails with `code`, its message matches every culprit (a regex, \\b-bounded when it
        is a plain word), and the server's regions, tensors and graphs are as they were."""
        client = client or self.c
        before = client.state()
        with self.assertRaises(grpc.RpcError, msg=f"expected {code.name}, the call succeeded") as caught:
            call()
        error = caught.exception
        with open(os.path.join(ARGS.work_dir, "errors.txt"), "a") as log:  # for reading the messages
            print(f"{self.id()}: {error.code().name}: {error.details()}", file=log)
        self.assertEqual(error.code(), code, f"expected {code.name}, got {error.code().name}: {error.details()}")
        for culprit in culprits:  # a tuple: any one of them
            options = culprit if isinstance(culprit, tuple) else (culprit,)
            patterns = [rf"\b{re.escape(c)}\b" if re.fullmatch(r"\w+", c) else re.escape(c) for c in options]
            self.assertTrue(any(re.search(p, error.details()) for p in patterns),
                            f"{code.name} message does not name {' or '.join(options)}: {error.details()}")
        self.assertEqual(client.state(), before, f"{code.name} ({error.details()}) changed the server's state")
        return error.details()

    def stats(self, name="", version="", client=None):
        """ModelStatistics by model name."""
        reply = (client or self.c).ModelStatistics(K.ModelStatisticsRequest(name=name, version=version))
        return {m.name: m for m in reply.model_stats}

    def auto_algorithm(self, op):
        """What `auto` must report: the op's default on the CPU; on the GPU `auto` also chooses by
        shape (docs/API.md), so there any algorithm ListOps lists for the op (None: checked that way)."""
        return None if CUDA else self.ops[op].default_algorithm

    def input_rounding(self, op, algorithm, datatype):
        """The relative rounding an algorithm applies to its inputs before multiplying: TF32 (10
        mantissa bits) where ListOps describes the algorithm as TF32 for FLOAT32, else none."""
        info = {a.name: a for a in self.ops[op].algorithms}.get(algorithm)
        return 2.0 ** -11 if datatype == "FP32" and info is not None and "TF32" in info.description else 0.0

    def check_params(self, response, algorithm=None, op=None):
        params = response.parameters
        for key in ("kernel_us", "gbps", "compute_us", "queue_us", "total_us"):
            self.assertIn(key, params, f"response parameters lack {key}: {dict(params)}")
            self.assertEqual(params[key].WhichOneof("parameter_choice"), "double_param", key)
            self.assertTrue(np.isfinite(params[key].double_param) and params[key].double_param >= 0, key)
        self.assertGreaterEqual(params["total_us"].double_param, params["compute_us"].double_param)
        self.assertIn("algorithm", params)
        got = params["algorithm"].string_param
        self.assertTrue(got and got != "auto", f"algorithm '{got}'")
        if algorithm:
            # docs/API.md's "Fallbacks are reported": a row that cannot take a shape runs, and names,
            # the fallback the table gives it.
            fallback = TABLE.op(op).fallback(algorithm) if op else ""
            self.assertIn(got, (algorithm, fallback), f"asked for {algorithm}")
        if op:
            self.assertIn(got, [a.name for a in self.ops[op].algorithms], f"{op} ran '{got}'")

    def op_inputs(self, op, datatype, typed=False, case=None, **params):
        """Fresh random inputs for an op on one of its table's small cases (`case`, else one
        drawn at random): (messages, arrays)."""
        cases = TABLE.op(op).small_shapes
        shapes = cases[int(self.rng.integers(0, len(cases)))] if case is None else case
        names = INPUT_NAMES[TABLE.op(op).arity]
        arrays = [ks.random_input(self.rng, datatype, shape, big_ints=True) for shape in shapes]
        return [In(n, datatype, a.shape, a, typed, **params) for n, a in zip(names, arrays)], arrays

    def check_output(self, what, op, datatype, arrays, response, index=0, raw=None):
        """The output is named y and is what the CPU reference answers within the op's
        tolerance for the algorithm that ran (opserve-op-table check)."""
        what = f"{what} (random seed {self.seed})"
        out = response.outputs[index]
        self.assertEqual(out.name, "y", what)
        self.assertIn(out.datatype, ks.DTYPE_OF_KSERVE, what)
        data = response.raw_output_contents[index] if raw is None else raw
        ok, message = TABLE.check(
            op, response.parameters["algorithm"].string_param,
            [(ks.DTYPE_OF_KSERVE[datatype], a.shape, a.tobytes()) for a in arrays],
            (ks.DTYPE_OF_KSERVE[out.datatype], out.shape, data))
        self.assertTrue(ok, f"{what}: {message}")


class KServeTest(Base):

    def test_health_and_metadata(self):
        self.assertTrue(self.c.ServerLive(K.ServerLiveRequest()).live)
        self.assertTrue(self.c.ServerReady(K.ServerReadyRequest()).ready)
        meta = self.c.ServerMetadata(K.ServerMetadataRequest())
        self.assertEqual(meta.name, "opserve")
        self.assertTrue(meta.version, "ServerMetadata.version is empty")
        for extension in ("system_shared_memory", "opserve_saved_graphs", "opserve_stored_tensors"):
            self.assertIn(extension, meta.extensions)
        if CUDA:
            self.assertIn("cuda_shared_memory", meta.extensions)
        else:
            self.assertNotIn("cuda_shared_memory", meta.extensions, "the CPU backend has no CUDA shared memory")

    def test_repository_and_model_readiness(self):
        index = {m.name: m for m in self.c.RepositoryIndex(K.RepositoryIndexRequest()).models}
        self.assertEqual(set(self.ops), TABLE.names(self.backend), "ListOps against the op table")
        for op in self.ops:
            self.assertIn(op, index)
            self.assertEqual((index[op].version, index[op].state), ("1", "READY"), op)
            for version in ("", "1"):
                self.assertTrue(self.c.ModelReady(K.ModelReadyRequest(name=op, version=version)).ready, op)
        for name, version in (("no_such_model", ""), ("row_sum", "2")):
            # As Triton answers: not ready, not an error.
            self.assertFalse(self.c.ModelReady(K.ModelReadyRequest(name=name, version=version)).ready,
                             (name, version))
            for call in (lambda: self.c.ModelMetadata(K.ModelMetadataRequest(name=name, version=version)),
                         lambda: self.c.ModelInfer(request(name, [In("x", "FP32", [2, 2], np.ones((2, 2), np.float32))],
                                                           version=version))):
                self.expect_error(C.NOT_FOUND, call, name if version == "" else version)

    def test_model_metadata_of_ops(self):
        for op, info in self.ops.items():
            meta = self.c.ModelMetadata(K.ModelMetadataRequest(name=op))
            self.assertEqual(meta.name, op)
            self.assertIn("1", meta.versions)
            model = TABLE.op(op)
            self.assertEqual([i.name for i in meta.inputs], INPUT_NAMES[model.arity], op)
            self.assertEqual([o.name for o in meta.outputs], ["y"], op)
            # The rank of the op's typical case of the highest rank (docs/API.md).
            typical = max(model.small_shapes, key=lambda case: len(case[0]))
            for i, shape in zip(meta.inputs, typical):
                self.assertEqual(i.datatype, ks.KSERVE_OF_DTYPE[info.dtypes[0]], f"{op}: the op's first datatype")
                self.assertTrue(all(d == -1 for d in i.shape), f"{op}: dimensions {list(i.shape)}")
                self.assertEqual(len(i.shape), len(shape), f"{op}: rank")

    def test_every_op_and_datatype_against_the_reference(self):
        for op, info in self.ops.items():
            for datatype in (ks.KSERVE_OF_DTYPE[d] for d in info.dtypes):
                # Raw contents on every small case of the op's table; typed contents on one.
                runs = [(False, case) for case in TABLE.op(op).small_shapes]
                if datatype != "BF16":  # BF16 has no typed field
                    runs.append((True, None))
                for typed, case in runs:
                    with self.subTest(op=op, datatype=datatype, typed=typed, case=case):
                        inputs, arrays = self.op_inputs(op, datatype, typed, case)
                        outputs = [Out("y")] if typed else None  # none requested: every output
                        response = self.c.ModelInfer(request(op, inputs, outputs, version="1" if typed else ""))
                        self.assertEqual(response.model_name, op)
                        self.assertEqual(len(response.outputs), 1)
                        self.assertEqual(len(response.raw_output_contents), 1)
                        self.check_output(f"{op} {datatype} typed={typed}", op, datatype, arrays, response)
                        self.check_params(response, self.auto_algorithm(op), op)

    def test_algorithm_parameter(self):
        for op, info in self.ops.items():
            datatype = ks.KSERVE_OF_DTYPE[info.dtypes[0]]
            for algorithm in info.algorithms:
                # The algorithm's own first dtype: not every row takes the op's first one.
                dt = ks.KSERVE_OF_DTYPE[algorithm.dtypes[0]]
                inputs, arrays = self.op_inputs(op, dt)
                response = self.c.ModelInfer(request(op, inputs, algorithm=algorithm.name))
                self.check_params(response, algorithm.name, op)
                self.check_output(f"{op}/{algorithm.name}", op, dt, arrays, response)
            inputs, _ = self.op_inputs(op, datatype)
            self.check_params(self.c.ModelInfer(request(op, inputs, algorithm="auto")), self.auto_algorithm(op), op)
            self.expect_error(C.INVALID_ARGUMENT,
                              lambda: self.c.ModelInfer(request(op, inputs, algorithm="no_such_algorithm")),
                              "no_such_algorithm")
            # A row of the table this server does not offer (another backend's, or one above
            # the device's compute capability): this server's limit, naming the row and what
            # it runs instead.
            listed = [a.name for a in info.algorithms]
            for row in {a["name"] for a in TABLE.op(op).algorithms} - set(listed):
                with self.subTest(op=op, unlisted=row):
                    self.expect_error(C.UNIMPLEMENTED,
                                      lambda: self.c.ModelInfer(request(op, inputs, algorithm=row)),
                                      row, listed[0])

    def test_specified_rpcs_not_served_are_unimplemented(self):
        """UNIMPLEMENTED with a message naming the RPC, not gRPC's empty one."""
        for rpc in ("RepositoryModelLoad", "RepositoryModelUnload", "TraceSetting", "LogSettings"):
            call = self.c.channel.unary_unary(f"/inference.GRPCInferenceService/{rpc}")
            details = self.expect_error(C.UNIMPLEMENTED, lambda: call(b"", timeout=10), rpc)
            self.assertIn(f"{rpc} is not served by opserve", details)

    # ---- ModelConfig and ModelStatistics ----

    def test_model_config(self):
        """Each op model's configuration says what its metadata says, in model_config.proto's
        terms (DataType TYPE_<datatype>, dims -1 where free), with no batch dimension of Triton's
        kind (max_batch_size 0); a saved graph's has its planned shapes."""
        def tensors(config_tensors):
            return [(t.name, K.DataType.Name(t.data_type), list(t.dims)) for t in config_tensors]

        def meta_tensors(meta_tensors):
            return [(t.name, "TYPE_" + t.datatype, list(t.shape)) for t in meta_tensors]

        for op in self.ops:
            for version in ("", "1"):
                config = self.c.ModelConfig(K.ModelConfigRequest(name=op, version=version)).config
                meta = self.c.ModelMetadata(K.ModelMetadataRequest(name=op))
                self.assertEqual((config.name, config.platform, config.backend, config.max_batch_size),
                                 (op, "opserve_op", "opserve", 0))
                self.assertEqual(config.parameters["opserve_max_batch_size"].string_value, "1")
                self.assertEqual(tensors(config.input), meta_tensors(meta.inputs), op)
                self.assertEqual(tensors(config.output), meta_tensors(meta.outputs), op)
                self.assertEqual([t.name for t in config.input], INPUT_NAMES[TABLE.op(op).arity], op)
                for t in list(config.input) + list(config.output):
                    self.assertNotEqual(t.data_type, K.TYPE_INVALID, f"{op} {t.name}")
                    self.assertTrue(all(d == -1 for d in t.dims), f"{op} {t.name}: {list(t.dims)}")
        matmul = self.c.ModelConfig(K.ModelConfigRequest(name="matmul")).config
        self.assertEqual(tensors(matmul.input), [("a", "TYPE_FP32", [-1, -1]), ("b", "TYPE_FP32", [-1, -1])])
        self.assertEqual(tensors(matmul.output), [("y", "TYPE_FP32", [-1, -1])])

        name = "kv_config_graph"
        self.c.SaveGraph(O.SaveGraphRequest(name=name, graph=self.graph()))
        self.addCleanup(self.quietly, lambda: self.c.DeleteGraph(O.DeleteGraphRequest(name=name)))
        config = self.c.ModelConfig(K.ModelConfigRequest(name=name)).config
        self.assertEqual((config.name, config.platform, config.backend, config.max_batch_size),
                         (name, "opserve_graph", "opserve", 0))
        self.assertEqual(sorted(tensors(config.input)), [("A", "TYPE_FP32", [-1, 48]), ("B", "TYPE_FP32", [48, -1])])
        meta = self.c.ModelMetadata(K.ModelMetadataRequest(name=name))
        self.assertEqual(tensors(config.output), meta_tensors(meta.outputs))
        self.assertEqual([t.name for t in config.output], ["mean"])

        for model, version in (("no_such_model", ""), ("row_sum", "2")):
            self.expect_error(C.NOT_FOUND, lambda: self.c.ModelConfig(K.ModelConfigRequest(name=model, version=version)),
                              model if version == "" else version)

    def test_model_statistics(self):
        """Each ModelInfer counts in its model's statistics (the server lives through the class's
        tests, so these are differences): successes with times whose parts are no more than the
        client waited, a refused request as a failure, a request for no model nowhere."""
        before = self.stats("row_sum")["row_sum"]
        start_ms = int(time.time() * 1000)
        wall = 0.0
        runs = 4
        for _ in range(runs):
            x = self.rng.standard_normal((8, 32)).astype(np.float32)
            t0 = time.perf_counter()
            self.c.ModelInfer(request("row_sum", [In("x", "FP32", x.shape, x)]))
            wall += time.perf_counter() - t0
        t0 = time.perf_counter()
        with self.assertRaises(grpc.RpcError) as caught:  # 8x32 floats said to be 7x32
            self.c.ModelInfer(request("row_sum", [In("x", "FP32", (7, 32), x)]))
        wall += time.perf_counter() - t0
        self.assertEqual(caught.exception.code(), C.INVALID_ARGUMENT, caught.exception.details())
        for model, version in (("no_such_model", ""), ("row_sum", "2")):
            with self.assertRaises(grpc.RpcError):
                self.c.ModelInfer(request(model, [In("x", "FP32", x.shape, x)], version=version))
        after = self.stats("row_sum", "1")["row_sum"]
        self.assertEqual((after.name, after.version), ("row_sum", "1"))

        def delta(field):
            return field(after) - field(before)
        stats = lambda m: m.inference_stats  # noqa: E731
        self.assertEqual(delta(lambda m: m.inference_count), runs)
        self.assertEqual(delta(lambda m: m.execution_count), runs, "--max_batch_size 1: a run each")
        self.assertEqual(delta(lambda m: stats(m).success.count), runs)
        self.assertEqual(delta(lambda m: stats(m).fail.count), 1)
        parts = 0
        for part in ("queue", "compute_input", "compute_infer", "compute_output"):
            self.assertEqual(delta(lambda m: getattr(stats(m), part).count), runs, part)
            parts += delta(lambda m: getattr(stats(m), part).ns)
        self.assertGreater(parts, 0)
        self.assertLessEqual(parts, wall * 1e9, "the parts of the requests' time against the client's wall time")
        total = delta(lambda m: stats(m).success.ns) + delta(lambda m: stats(m).fail.ns)
        self.assertGreater(delta(lambda m: stats(m).fail.ns), 0)
        self.assertLessEqual(parts, total)
        self.assertLessEqual(total, wall * 1e9)
        self.assertGreaterEqual(after.last_inference, start_ms)
        self.assertLessEqual(after.last_inference, int(time.time() * 1000))

        every = self.stats()
        self.assertLessEqual(set(self.ops), set(every), "ModelStatistics with no name lists every op")
        self.assertEqual(every["row_sum"].inference_count, after.inference_count)
        for model, version in (("no_such_model", ""), ("row_sum", "2")):
            self.expect_error(C.NOT_FOUND, lambda: self.stats(model, version), model if version == "" else version)

    def test_statistics_of_a_model_never_called_are_zeros(self):
        """Triton fills inference_stats for a model with no request yet, and its clients read
        every duration of it."""
        name = "kv_stats_never_called"
        self.c.SaveGraph(O.SaveGraphRequest(name=name, graph=self.graph(), overwrite=True))
        self.addCleanup(self.quietly, lambda: self.c.DeleteGraph(O.DeleteGraphRequest(name=name)))
        for stats in (self.stats(name)[name], self.stats()[name]):
            self.assertTrue(stats.HasField("inference_stats"))
            for part in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output"):
                self.assertTrue(stats.inference_stats.HasField(part), part)
                duration = getattr(stats.inference_stats, part)
                self.assertEqual((duration.count, duration.ns), (0, 0), part)
            self.assertEqual((stats.inference_count, stats.execution_count, stats.last_inference), (0, 0, 0))

    def test_triton_parameters_opserve_does_not_serve_are_refused(self):
        """Sequences (a correlation ID) and an output's classification are refused naming the
        parameter, never ignored; a value that asks for nothing is accepted, as Triton does."""
        x = self.rng.standard_normal((3, 5)).astype(np.float32)
        ok = In("x", "FP32", x.shape, x)
        infer = lambda *args, **kw: lambda: self.c.ModelInfer(request(*args, **kw))  # noqa: E731
        bad = C.INVALID_ARGUMENT
        for params in ({"sequence_id": 7}, {"sequence_id": "session-7"},
                       {"sequence_id": 7, "sequence_start": True, "sequence_end": True},
                       {"sequence_start": True}, {"sequence_end": True}):
            with self.subTest(params=params):
                key = next(k for k, v in params.items() if v)
                self.expect_error(bad, infer("row_sum", [ok], **params), "row_sum", f"'{key}'", "sequence")
        self.expect_error(bad, infer("row_sum", [ok], sequence_id=1.5), "sequence_id")
        self.expect_error(bad, infer("row_sum", [ok], [Out("y", classification=3)]), "'y'", "classification")
        self.expect_error(bad, infer("row_sum", [ok], [Out("y", classification="3")]), "'y'", "classification")
        for outputs, params in (([Out("y", classification=0)], {}),
                                (None, {"sequence_id": 0, "sequence_start": False, "sequence_end": False}),
                                (None, {"sequence_id": ""})):
            with self.subTest(outputs=outputs, params=params):
                response = self.c.ModelInfer(request("row_sum", [ok], outputs, **params))
                self.check_output("row_sum", "row_sum", "FP32", [x], response)

    def test_reflection_lists_both_services(self):
        stub = RG.ServerReflectionStub(self.c.channel)
        replies = list(stub.ServerReflectionInfo(iter([R.ServerReflectionRequest(list_services="")]), timeout=10))
        self.assertEqual(len(replies), 1)
        names = {s.name for s in replies[0].list_services_response.service}
        self.assertLessEqual({"inference.GRPCInferenceService", "opserve.v1.OpServe"}, names)

    # ---- saved graphs ----

    def graph(self, a_shape=(-1, 48), b_shape=(48, -1), data=b""):
        return O.ExecuteRequest(
            nodes=[O.Node(id="ab", op="matmul", inputs=[O.Input(inline_name="A"), O.Input(inline_name="B")]),
                   O.Node(id="ab_t", op="transpose", inputs=[O.Input(node="ab")]),
                   O.Node(id="mean", op="row_mean", inputs=[O.Input(node="ab_t")])],
            inline_tensors={"A": O.Tensor(dtype=O.FLOAT32, shape=a_shape, data=data),
                            "B": O.Tensor(dtype=O.FLOAT32, shape=b_shape)},
            outputs=[O.OutputSpec(node="mean", return_inline=True)])

    def test_saved_graph(self):
        name = "kv_graph/rtm"
        info = self.c.SaveGraph(O.SaveGraphRequest(name=name, graph=self.graph())).info
        self.addCleanup(self.quietly, lambda: self.c.DeleteGraph(O.DeleteGraphRequest(name=name)))
        self.assertEqual(sorted((i.name, list(i.shape)) for i in info.inputs), [("A", [-1, 48]), ("B", [48, -1])])
        self.assertEqual([o.name for o in info.outputs], ["mean"])
        self.assertIn(name, [g.name for g in self.c.ListGraphs(O.ListGraphsRequest()).graphs])
        self.assertIn(name, [m.name for m in self.c.RepositoryIndex(K.RepositoryIndexRequest()).models])
        self.assertTrue(self.c.ModelReady(K.ModelReadyRequest(name=name)).ready)
        meta = self.c.ModelMetadata(K.ModelMetadataRequest(name=name))
        self.assertEqual(sorted((i.name, i.datatype, list(i.shape)) for i in meta.inputs),
                         [("A", "FP32", [-1, 48]), ("B", "FP32", [48, -1])])
        self.assertEqual([(o.name, o.datatype) for o in meta.outputs], [("mean", "FP32")])

        a = self.rng.standard_normal((64, 48)).astype(np.float32)
        b = self.rng.standard_normal((48, 32)).astype(np.float32)
        response = self.c.ModelInfer(request(name, [In("A", "FP32", a.shape, a), In("B", "FP32", b.shape, b)]))
        self.assertEqual([(o.name, o.datatype, list(o.shape)) for o in response.outputs], [("mean", "FP32", [32])])
        got = ks.decode("FP32", [32], response.raw_output_contents[0])
        want = (a.astype(np.float64) @ b.astype(np.float64)).T.mean(axis=1)
        absref = (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))).T.mean(axis=1)
        params = response.parameters
        ab = params["ab.algorithm"].string_param
        ks.check_close(self, f"saved graph (matmul {ab})", "FP32", "FP32", got, want, 48 + 64, absref,
                       self.input_rounding("matmul", ab, "FP32"))
        total = 0.0
        # The transpose and the mean run as one column mean (fusion): both report it, and the
        # transpose names the node whose kernel ran it; the total counts that kernel once.
        algorithms = {"ab": self.auto_algorithm("matmul"), "ab_t": "fused:col_mean", "mean": "fused:col_mean"}
        for node in ("ab", "ab_t", "mean"):
            for key in ("algorithm", "kernel_us", "gbps"):
                self.assertIn(f"{node}.{key}", params, f"graph response parameters: {sorted(params)}")
            if algorithms[node] is None:
                self.assertIn(params[f"{node}.algorithm"].string_param, [a.name for a in self.ops["matmul"].algorithms])
            else:
                self.assertEqual(params[f"{node}.algorithm"].string_param, algorithms[node])
            if node == "ab_t":
                self.assertEqual(params["ab_t.fused_into"].string_param, "mean")
                self.assertEqual(params["ab_t.kernel_us"].double_param, params["mean.kernel_us"].double_param)
                continue
            self.assertNotIn(f"{node}.fused_into", params)
            total += params[f"{node}.kernel_us"].double_param
        self.assertIn("kernel_us", params)
        self.assertAlmostEqual(params["kernel_us"].double_param, total, delta=1e-6 * max(total, 1) + 1e-3)

        response = self.c.ModelInfer(request(name, [In("A", "FP32", a.shape, a), In("B", "FP32", b.shape, b)],
                                             [Out("mean", opserve_store_as="kv_graph_mean", opserve_overwrite=True)]))
        self.addCleanup(self.quietly, lambda: self.c.DeleteTensor(O.DeleteTensorRequest(name="kv_graph_mean")))
        self.assertEqual(list(response.raw_output_contents), [b""])
        self.assertEqual(self.c.get("kv_graph_mean")[1], got.tobytes(), "the stored graph output")
        # Hostile: a fixed dimension that disagrees, the algorithm parameter, SaveGraph's refusals.
        bad = a[:, :40].copy()
        self.expect_error(C.INVALID_ARGUMENT, lambda: self.c.ModelInfer(
            request(name, [In("A", "FP32", bad.shape, bad), In("B", "FP32", b.shape, b)])), "A", "40")
        self.expect_error(C.INVALID_ARGUMENT, lambda: self.c.ModelInfer(
            request(name, [In("A", "FP32", a.shape, a), In("B", "FP32", b.shape, b)], algorithm="reference")),
            "algorithm")
        self.expect_error(C.ALREADY_EXISTS, lambda: self.c.SaveGraph(O.SaveGraphRequest(name=name, graph=self.graph())),
                          name)
        self.c.SaveGraph(O.SaveGraphRequest(name=name, graph=self.graph(), overwrite=True))
        self.expect_error(C.INVALID_ARGUMENT, lambda: self.c.SaveGraph(
            O.SaveGraphRequest(name="row_sum", graph=self.graph())), "row_sum")
        self.expect_error(C.INVALID_ARGUMENT, lambda: self.c.SaveGraph(
            O.SaveGraphRequest(name="kv_with_data", graph=self.graph(a_shape=(1, 48), data=bytes(192)))), "A")
        self.expect_error(C.INVALID_ARGUMENT, lambda: self.c.SaveGraph(
            O.SaveGraphRequest(name="kv_never_runs", graph=self.graph(b_shape=(32, -1)))), "ab")

        self.assertEqual(self.c.DeleteGraph(O.DeleteGraphRequest(name=name)).info.name, name)
        self.assertNotIn(name, [g.name for g in self.c.ListGraphs(O.ListGraphsRequest()).graphs])
        self.expect_error(C.NOT_FOUND, lambda: self.c.ModelInfer(
            request(name, [In("A", "FP32", a.shape, a), In("B", "FP32", b.shape, b)])), name)

    # ---- stored tensors ----

    def test_stored_tensor_input_and_output(self):
        x = self.rng.standard_normal((32, 64)).astype(np.float32)
        self.c.put("kv_x", "FP32", x, overwrite=True)
        for n in ("kv_x", "kv_y"):
            self.addCleanup(self.quietly, lambda n=n: self.c.DeleteTensor(O.DeleteTensorRequest(name=n)))
        stored_x = In("x", "FP32", x.shape, None, opserve_stored_tensor="kv_x")
        response = self.c.ModelInfer(request("row_sum", [stored_x], [Out("y", opserve_store_as="kv_y")]))
        self.assertEqual(len(response.raw_output_contents), 1, "one entry per requested output")
        self.assertEqual(response.raw_output_contents[0], b"", "a stored output sends no bytes")
        info, data = self.c.get("kv_y")
        self.assertEqual((info.dtype, list(info.shape)), (O.FLOAT32, [32]))
        self.check_output("row_sum of a stored tensor", "row_sum", "FP32", [x], response, raw=data)
        self.expect_error(C.ALREADY_EXISTS, lambda: self.c.ModelInfer(
            request("row_sum", [stored_x], [Out("y", opserve_store_as="kv_y")])), "kv_y")
        x2 = self.rng.standard_normal((32, 64)).astype(np.float32)
        self.c.ModelInfer(request("row_sum", [In("x", "FP32", x2.shape, x2)],
                                  [Out("y", opserve_store_as="kv_y", opserve_overwrite=True)]))
        self.check_output("overwritten stored output", "row_sum", "FP32", [x2], response, raw=self.c.get("kv_y")[1])
        # The stored tensor's shape or datatype against the input's, and a name nobody stored.
        for shape, datatype in (([64, 32], "FP32"), ([32, 64], "INT32")):
            self.expect_error(C.INVALID_ARGUMENT, lambda: self.c.ModelInfer(request(
                "row_sum", [In("x", datatype, shape, None, opserve_stored_tensor="kv_x")],
                [Out("y", opserve_store_as="kv_z")])), "kv_x")
        self.expect_error(C.NOT_FOUND, lambda: self.c.ModelInfer(request(
            "row_sum", [In("x", "FP32", [32, 64], None, opserve_stored_tensor="kv_nobody")])), "kv_nobody")

    # ---- system shared memory ----

    def test_shared_memory_256_mib(self):
        big = self.shm(256 * MiB)
        x = big.array(np.float32, (8192, 8192))
        self.rng.random(out=x, dtype=np.float32)
        out = self.shm(1 * MiB)
        self.register("kv_in", big)
        self.register("kv_out", out, offset=4096)
        status = self.c.SystemSharedMemoryStatus(K.SystemSharedMemoryStatusRequest()).regions
        self.assertEqual((status["kv_in"].key, status["kv_in"].offset, status["kv_in"].byte_size),
                         (big.key, 0, 256 * MiB))
        self.assertEqual((status["kv_out"].key, status["kv_out"].offset, status["kv_out"].byte_size),
                         (out.key, 4096, MiB - 4096))
        only = self.c.SystemSharedMemoryStatus(K.SystemSharedMemoryStatusRequest(name="kv_out")).regions
        self.assertEqual(list(only), ["kv_out"])

        x_in = In("x", "FP32", x.shape, None, shared_memory_region="kv_in", shared_memory_byte_size=256 * MiB)
        response = self.c.ModelInfer(request("row_mean", [x_in], [Out(
            "y", shared_memory_region="kv_out", shared_memory_offset=64, shared_memory_byte_size=8192 * 4 + 4096)]))
        self.assertEqual(list(response.raw_output_contents), [b""], "one entry per output, empty: in the region")
        self.assertEqual((response.outputs[0].name, list(response.outputs[0].shape)), ("y", [8192]))
        want = np.mean(x, axis=1, dtype=np.float64)
        got = out.array(np.float32, (8192,), offset=4096 + 64).copy()
        ks.check_close(self, "row_mean of 256 MiB in shm", "FP32", "FP32", got, want, 8192, want)
        response = self.c.ModelInfer(request("row_mean", [x_in]))  # the output back in the message
        ks.check_close(self, "row_mean, returned", "FP32", "FP32",
                       ks.decode("FP32", [8192], response.raw_output_contents[0]), want, 8192, want)

        for name in ("kv_in", "kv_out"):
            self.c.SystemSharedMemoryUnregister(K.SystemSharedMemoryUnregisterRequest(name=name))
        status = self.c.SystemSharedMemoryStatus(K.SystemSharedMemoryStatusRequest()).regions
        self.assertFalse({"kv_in", "kv_out"} & set(status), f"still listed: {sorted(status)}")

    def test_shared_memory_hostile(self):
        shm = self.shm(MiB)
        reg = lambda name, key=shm.key, offset=0, size=MiB: self.c.SystemSharedMemoryRegister(  # noqa: E731
            K.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=offset, byte_size=size))
        self.expect_error(C.NOT_FOUND, lambda: reg("kv_nokey", key="/kserve_test_no_such_object"),
                          "/kserve_test_no_such_object")
        self.expect_error(C.INVALID_ARGUMENT, lambda: reg("kv_past", offset=4096, size=MiB), ("kv_past", shm.key))
        self.expect_error(C.INVALID_ARGUMENT, lambda: reg("kv_past2", offset=2 * MiB, size=16), ("kv_past2", shm.key))
        self.register("kv_r", shm, offset=0, size=MiB)
        self.expect_error(C.ALREADY_EXISTS, lambda: reg("kv_r", size=4096), "kv_r")
        x = self.rng.standard_normal((16, 16)).astype(np.float32)
        infer = lambda offset, size, region="kv_r", outputs=None: self.c.ModelInfer(request(  # noqa: E731
            "row_sum", [In("x", "FP32", x.shape, None, shared_memory_region=region, shared_memory_offset=offset,
                           shared_memory_byte_size=size)], outputs))
        self.expect_error(C.INVALID_ARGUMENT, lambda: infer(MiB - 512, 1024), "kv_r")
        self.expect_error(C.INVALID_ARGUMENT, lambda: infer(0, 1000), "1000", "1024")
        self.expect_error(C.NOT_FOUND, lambda: infer(0, 1024, region="kv_unregistered"), "kv_unregistered")
        self.expect_error(C.INVALID_ARGUMENT, lambda: infer(0, 1024, outputs=[Out(
            "y", shared_memory_region="kv_r", shared_memory_offset=MiB - 32, shared_memory_byte_size=64)]), "kv_r")
        self.expect_error(C.INVALID_ARGUMENT, lambda: infer(0, 1024, outputs=[Out(
            "y", shared_memory_region="kv_r", shared_memory_byte_size=32)]), "32", "64")
        from_region = [In("x", "FP32", x.shape, None, shared_memory_region="kv_r", shared_memory_byte_size=1024)]
        for _ in range(2):  # the server maps the object: what is written here is what the next request reads
            x = self.rng.standard_normal((16, 16)).astype(np.float32)
            shm.array(np.float32, x.shape)[:] = x
            self.check_output("row_sum from a region", "row_sum", "FP32", [x],
                              self.c.ModelInfer(request("row_sum", from_region)))
        self.c.SystemSharedMemoryUnregister(K.SystemSharedMemoryUnregisterRequest(name="kv_r"))
        self.expect_error(C.NOT_FOUND, lambda: self.c.ModelInfer(request("row_sum", from_region)), "kv_r")
        # CUDA shared memory: none on the CPU backend; on the GPU a handle no process exported.
        self.expect_error(C.INVALID_ARGUMENT if CUDA else C.UNIMPLEMENTED,
                          lambda: self.c.CudaSharedMemoryRegister(K.CudaSharedMemoryRegisterRequest(
                              name="kv_cuda", raw_handle=bytes(64), device_id=0, byte_size=1024)))

    def test_more_than_256_regions(self):
        shm = self.shm(4096)
        existing = len(self.c.SystemSharedMemoryStatus(K.SystemSharedMemoryStatusRequest()).regions)
        for i in range(256 - existing):
            self.register(f"kv_many_{i}", shm, size=4096)
        self.expect_error(C.RESOURCE_EXHAUSTED, lambda: self.register("kv_many_last", shm, size=4096),
                          ("kv_many_last", "256"))
        self.c.SystemSharedMemoryUnregister(K.SystemSharedMemoryUnregisterRequest(name=""))  # all of them
        self.assertEqual(dict(self.c.SystemSharedMemoryStatus(K.SystemSharedMemoryStatusRequest()).regions), {})

    def test_more_than_1024_saved_graphs(self):
        existing = len(self.c.ListGraphs(O.ListGraphsRequest()).graphs)
        for i in range(1024 - existing):
            self.c.SaveGraph(O.SaveGraphRequest(name=f"kv_g{i}", graph=self.graph()))
            self.addCleanup(self.quietly, lambda i=i: self.c.DeleteGraph(O.DeleteGraphRequest(name=f"kv_g{i}")))
        self.expect_error(C.RESOURCE_EXHAUSTED, lambda: self.c.SaveGraph(
            O.SaveGraphRequest(name="kv_g_last", graph=self.graph())), ("kv_g_last", "1024"))

    def test_empty_tensors(self):
        """Every op's empty cases (op_table.empty_cases) on every datatype: the output the op's
        shape rule infers, filled as the table says (0, or NaN for a mean of nothing); or, where
        the shape rule refuses empty inputs, the same refusal."""
        for op, info in self.ops.items():
            cases = op_table.empty_cases(TABLE.op(op))
            self.assertTrue(cases, f"{op}: its test model has no shape to empty")
            for case in cases:
                for datatype in (ks.KSERVE_OF_DTYPE[d] for d in info.dtypes):
                    with self.subTest(op=op, datatype=datatype, case=case):
                        inputs, arrays = self.op_inputs(op, datatype, case=case)
                        shaped = TABLE.infer(op, [(ks.DTYPE_OF_KSERVE[datatype], a.shape) for a in arrays])
                        if not shaped["ok"]:
                            self.expect_error(getattr(C, shaped["code"]),
                                              lambda: self.c.ModelInfer(request(op, inputs)))
                            continue
                        response = self.c.ModelInfer(request(op, inputs))
                        self.assertEqual(response.parameters["kernel_us"].double_param, 0.0,
                                         "a kernel ran on zero elements")
                        self.check_output(f"{op} of {datatype}{case}", op, datatype, arrays, response)

    def test_unregister_a_region_in_use(self):
        # A matmul whose inputs and output are in the region, sized to take ~3 s here (on the GPU
        # the `naive` row, a thread per output, which docs/performance/history.md times at 2.2 s
        # for 8192^3); made larger and tried again if it ends before the unregisters do (a faster
        # machine).
        algorithm, largest = ({"algorithm": "naive"}, 8192) if CUDA else ({}, 4096)

        def matmul_seconds(n):
            a = np.ones((n, n), np.float32)
            started = time.monotonic()
            self.c.ModelInfer(request("matmul", [In("a", "FP32", a.shape, a), In("b", "FP32", a.shape, a)],
                                      **algorithm))
            return time.monotonic() - started
        n = int(min(largest, max(1024, 768 * (3.0 / max(matmul_seconds(768), 1e-3)) ** (1 / 3))) // 64 * 64)
        started = time.monotonic()
        for attempt in range(3):
            size = n * n * 4
            shm = self.shm(3 * size)
            a, b = shm.array(np.float32, (n, n)), shm.array(np.float32, (n, n), size)
            self.rng.random(out=a, dtype=np.float32)
            self.rng.random(out=b, dtype=np.float32)
            self.register("kv_busy", shm)
            self.register("kv_idle", shm, size=4096)
            before = self.c.state()
            region = lambda offset: dict(shared_memory_region="kv_busy", shared_memory_offset=offset,  # noqa: E731
                                         shared_memory_byte_size=size)
            req = request("matmul", [In("a", "FP32", (n, n), None, **region(0)),
                                     In("b", "FP32", (n, n), None, **region(size))], [Out("y", **region(2 * size))],
                          **algorithm)
            result = {}
            worker = threading.Thread(target=lambda: result.update(r=self.c.ModelInfer(req)))
            worker.start()
            time.sleep(0.3)
            errors = []
            for name in ("", "kv_busy"):  # all of them (kv_idle must stay too), then the busy one
                try:
                    self.c.SystemSharedMemoryUnregister(K.SystemSharedMemoryUnregisterRequest(name=name))
                    errors.append(None)
                except grpc.RpcError as e:
                    errors.append(e)
            in_flight = worker.is_alive()
            worker.join(120)
            if in_flight or all(errors):
                break
            for name in ("kv_busy", "kv_idle"):  # ended too soon to tell: larger
                self.unregister_quietly(self.c, name)
            n = min(int(n * 1.5) // 64 * 64, largest)
        print(f"\n  matmul {n}: {time.monotonic() - started:.2f} s, {attempt + 1} attempt(s)", file=sys.stderr)
        for name, error in zip(("''", "kv_busy"), errors):
            self.assertIsNotNone(error, f"unregistering {name} while a request uses kv_busy succeeded")
            self.assertEqual(error.code(), C.FAILED_PRECONDITION, error.details())
            self.assertRegex(error.details(), r"\bkv_busy\b")
        self.assertIn("r", result, "the matmul in flight failed")
        self.assertEqual(self.c.state(), before, "a refused unregister changed the regions")
        rows = self.rng.integers(0, n, 8)
        got = shm.array(np.float32, (n, n), 2 * size)[rows]
        want = a[rows].astype(np.float64) @ b.astype(np.float64)
        ks.check_close(self, f"matmul {n} in shm", "FP32", "FP32", got, want, n, want)
        self.c.SystemSharedMemoryUnregister(K.SystemSharedMemoryUnregisterRequest(name="kv_busy"))
        self.assertEqual(list(self.c.state()[0]), ["kv_idle"])
        self.assertLess(time.monotonic() - started, 60)

    # ---- hostile requests without shared memory ----

    def test_hostile_requests(self):
        x = self.rng.standard_normal((3, 5)).astype(np.float32)
        ok = In("x", "FP32", x.shape, x)
        infer = lambda *args, **kw: lambda: self.c.ModelInfer(request(*args, **kw))  # noqa: E731
        bad = C.INVALID_ARGUMENT
        self.expect_error(C.NOT_FOUND, infer("no_such_model", [ok]), "no_such_model")
        self.expect_error(bad, infer("row_sum", [ok, In("bogus_input", "FP32", x.shape, x)]), "bogus_input")
        self.expect_error(bad, infer("matmul", [In("a", "FP32", x.shape, x)]), "b")
        self.expect_error(bad, infer("row_sum", [ok, ok]), "x")
        self.expect_error(bad, infer("row_sum", [ok], [Out("bogus_output")]), "bogus_output")
        self.expect_error(bad, infer("row_sum", [ok], [Out("y"), Out("y")]), "y")
        self.expect_error(bad, infer("row_sum", [In("x", "FP16", x.shape, np.zeros(15, np.float16))]), "FP16")
        self.expect_error(bad, infer("matmul", [In("a", "INT32", [2, 2], np.ones((2, 2), np.int32)),
                                                In("b", "INT32", [2, 2], np.ones((2, 2), np.int32))]), "INT32")
        self.expect_error(bad, infer("row_sum", [In("x", "FP32", x.shape, x[:, :4].copy())]), "60", "48")
        self.expect_error(bad, infer("row_sum", [In("x", "INT64", x.shape, x)]), "120", "60")
        self.expect_error(bad, infer("row_sum", [In("x", "FP32", x.shape)]), "x")
        self.expect_error(bad, infer("row_sum", [In("x", "FP32", x.shape, x.ravel()[:14], typed=True)]), "15", "14")
        bf16 = In("x", "BF16", [2, 2])[0]
        bf16.contents.fp32_contents.extend([1, 2, 3, 4])  # BF16 has no typed field
        self.expect_error(bad, lambda: self.c.ModelInfer(K.ModelInferRequest(model_name="row_sum", inputs=[bf16])),
                          ("x", "BF16"))
        int32 = In("x", "INT32", [2, 2])[0]
        int32.contents.fp32_contents.extend([1, 2, 3, 4])  # INT32's field is int_contents
        self.expect_error(bad, lambda: self.c.ModelInfer(K.ModelInferRequest(model_name="row_sum", inputs=[int32])),
                          ("x", "INT32", "fp32_contents", "int_contents"))
        two_raw = request("row_sum", [ok])
        two_raw.raw_input_contents.append(x.tobytes())
        self.expect_error(bad, lambda: self.c.ModelInfer(two_raw), "raw_input_contents")
        mixed = request("matmul", [In("a", "FP32", [2, 2], np.eye(2, dtype=np.float32)),
                                   In("b", "FP32", [2, 2], np.eye(2, dtype=np.float32), typed=True)])
        self.expect_error(bad, lambda: self.c.ModelInfer(mixed), ("raw_input_contents", "contents", "b"))
        self.c.put("kv_two_sources", "FP32", x, overwrite=True)
        self.addCleanup(self.quietly, lambda: self.c.DeleteTensor(O.DeleteTensorRequest(name="kv_two_sources")))
        stored = In("x", "FP32", x.shape, x, opserve_stored_tensor="kv_two_sources")
        self.expect_error(bad, infer("row_sum", [stored]), ("x", "raw_input_contents"))  # two sources for one input
        # A failed request stores nothing (expect_error compares ListTensors).
        self.expect_error(bad, infer("row_sum", [In("x", "FP32", [3, 4], x)], [Out("y", opserve_store_as="kv_not")]),
                          "60", "48")


class KServeShrunkObjectTest(Base):
    """A client shrinks its object after registering it: a request must meet the object's end
    ("an offset plus size past the region's or the object's end": INVALID_ARGUMENT), and the
    server must live (a read or write of the vanished pages would be SIGBUS)."""

    def test_object_shrunk_after_register(self):
        for direction in ("input", "output"):
            with self.subTest(direction=direction):
                server = ks.Server(ARGS.opserve, self.dir, f"shrunk_{direction}")
                try:
                    client = Client(server.target)
                    shm = self.shm(MiB)
                    self.register("kv_shrunk", shm, client=client)
                    os.truncate(shm.path, 4096)
                    x = np.ones((4, 4), np.float32)
                    far = dict(shared_memory_region="kv_shrunk", shared_memory_offset=MiB // 2)
                    req = request("row_sum", [In("x", "FP32", x.shape, None, shared_memory_byte_size=64, **far)]) \
                        if direction == "input" else \
                        request("row_sum", [In("x", "FP32", x.shape, x)], [Out("y", shared_memory_byte_size=16, **far)])
                    try:
                        client.ModelInfer(req)
                        outcome = "OK"
                    except grpc.RpcError as e:
                        outcome = f"{e.code().name}: {e.details()}"
                    alive = server.process.poll() is None
                    if alive:
                        self.expect_error(C.INVALID_ARGUMENT, lambda: client.ModelInfer(req), "kv_shrunk",
                                          client=client)
                finally:
                    status = server.stop()
                self.assertTrue(alive and status == 0, f"the {direction} past the shrunk object's end got '{outcome}'; "
                                f"opserve exited {status}:\n{server.log()[-600:]}")


    def test_object_truncated_while_the_server_copies_it(self):
        """A client that truncates its object while a request copies from it gets OK (the copy
        was done first) or INVALID_ARGUMENT, never a dead server (docs/SECURITY.md, item 11)."""
        server = ks.Server(ARGS.opserve, self.dir, "truncated_mid_copy")
        outcomes = []
        try:
            client = Client(server.target)
            size = 256 * MiB
            shm = self.shm(size)
            self.register("kv_cut", shm, client=client)
            shape = (size // 4096, 1024)
            req = request("row_sum", [In("x", "FP32", shape, None, shared_memory_region="kv_cut",
                                         shared_memory_byte_size=size)])
            rng = np.random.default_rng(5)
            for _ in range(12):
                os.truncate(shm.path, size)  # whole again: the cut pages read as zeros
                result = {}

                def infer():
                    try:
                        client.ModelInfer(req, timeout=60)
                        result["code"] = "OK"
                    except grpc.RpcError as e:
                        result["code"], result["details"] = e.code().name, e.details()
                t = threading.Thread(target=infer)
                t.start()
                time.sleep(rng.uniform(0, 0.05))
                os.truncate(shm.path, 4096)
                t.join()
                outcomes.append(result.get("code"))
                if server.process.poll() is not None:
                    break
                self.assertIn(result.get("code"), ("OK", "INVALID_ARGUMENT"), result)
                if result["code"] == "INVALID_ARGUMENT":  # the size check, or the guarded copy
                    self.assertTrue("kv_cut" in result["details"] or "'x'" in result["details"],
                                    result["details"])
            alive = server.process.poll() is None
        finally:
            status = server.stop()
        self.assertTrue(alive and status == 0, f"outcomes {outcomes}; opserve exited {status}:\n"
                        f"{server.log()[-600:]}")


class KServeTenancyTest(Base):
    token = "tok-alice-1234"

    @classmethod
    def extra_args(cls):
        os.makedirs(os.path.join(ARGS.work_dir, cls.__name__), exist_ok=True)
        path = os.path.join(ARGS.work_dir, cls.__name__, "tokens.txt")
        with open(path, "w") as f:
            f.write("alice:tok-alice-1234\nbob:tok-bob-5678\n")
        return (f"--auth_tokens_file={path}",)

    def test_tokens(self):
        anonymous = Client(self.server.target)
        self.assertTrue(anonymous.ServerLive(K.ServerLiveRequest()).live)
        self.assertTrue(anonymous.ServerReady(K.ServerReadyRequest()).ready)
        x = np.ones((2, 3), np.float32)
        for client in (anonymous, Client(self.server.target, "tok-wrong")):
            for call in (lambda: client.ModelInfer(request("row_sum", [In("x", "FP32", x.shape, x)])),
                         lambda: client.SystemSharedMemoryStatus(K.SystemSharedMemoryStatusRequest()),
                         lambda: client.ListGraphs(O.ListGraphsRequest())):
                with self.assertRaises(grpc.RpcError) as caught:
                    call()
                self.assertEqual(caught.exception.code(), C.UNAUTHENTICATED, caught.exception.details())
        self.c.ModelInfer(request("row_sum", [In("x", "FP32", x.shape, x)]))

    def test_region_limit_is_per_tenant(self):
        alice, bob = self.c, Client(self.server.target, "tok-bob-5678")
        shm = self.shm(4096)
        for i in range(256):
            self.register(f"kv_many_{i}", shm, size=4096, client=alice)
        self.expect_error(C.RESOURCE_EXHAUSTED, lambda: self.register("kv_many_last", shm, size=4096, client=alice),
                          ("kv_many_last", "256"))
        self.register("kv_bob_one", shm, size=4096, client=bob)
        alice.SystemSharedMemoryUnregister(K.SystemSharedMemoryUnregisterRequest(name=""))
        self.assertEqual(list(bob.state()[0]), ["kv_bob_one"],
                         "alice's unregister-all touched bob's region")

    def test_tenants_see_only_their_own(self):
        alice, bob = self.c, Client(self.server.target, "tok-bob-5678")
        graph = KServeTest.graph(self)
        alice.SaveGraph(O.SaveGraphRequest(name="kv_alice_graph", graph=graph))
        self.addCleanup(self.quietly, lambda: alice.DeleteGraph(O.DeleteGraphRequest(name="kv_alice_graph")))
        x = self.rng.standard_normal((4, 6)).astype(np.float32)
        alice.put("kv_alice_x", "FP32", x, overwrite=True)
        self.addCleanup(self.quietly, lambda: alice.DeleteTensor(O.DeleteTensorRequest(name="kv_alice_x")))
        shm = self.shm(MiB)
        shm.array(np.float32, x.shape)[:] = x
        self.register("kv_alice_region", shm, client=alice)
        alice_state = alice.state()

        self.assertEqual(bob.state(), ({}, [], []), "bob sees alice's regions, tensors or graphs")
        self.assertNotIn("kv_alice_graph", [m.name for m in bob.RepositoryIndex(K.RepositoryIndexRequest()).models])
        a, b = np.ones((2, 48), np.float32), np.ones((48, 3), np.float32)
        graph_inputs = [In("A", "FP32", a.shape, a), In("B", "FP32", b.shape, b)]
        self.expect_error(C.NOT_FOUND, lambda: bob.ModelInfer(request("kv_alice_graph", graph_inputs)),
                          "kv_alice_graph", client=bob)
        self.expect_error(C.NOT_FOUND, lambda: bob.ModelMetadata(K.ModelMetadataRequest(name="kv_alice_graph")),
                          "kv_alice_graph", client=bob)
        self.expect_error(C.NOT_FOUND, lambda: bob.ModelInfer(request("row_sum", [In(
            "x", "FP32", x.shape, None, shared_memory_region="kv_alice_region", shared_memory_byte_size=x.nbytes)])),
            "kv_alice_region", client=bob)
        self.expect_error(C.NOT_FOUND, lambda: bob.ModelInfer(request("row_sum", [In(
            "x", "FP32", x.shape, None, opserve_stored_tensor="kv_alice_x")])), "kv_alice_x", client=bob)
        bob.SystemSharedMemoryUnregister(K.SystemSharedMemoryUnregisterRequest(name=""))  # all of bob's: none
        # Names are per tenant: bob may take alice's names for his own.
        bob.SaveGraph(O.SaveGraphRequest(name="kv_alice_graph", graph=graph))
        bob.DeleteGraph(O.DeleteGraphRequest(name="kv_alice_graph"))
        self.register("kv_alice_region", shm, client=bob)
        bob.SystemSharedMemoryUnregister(K.SystemSharedMemoryUnregisterRequest(name="kv_alice_region"))
        self.assertEqual(alice.state(), alice_state, "bob's calls changed what alice has")
        for inputs in ([In("x", "FP32", x.shape, None, opserve_stored_tensor="kv_alice_x")],
                       [In("x", "FP32", x.shape, None, shared_memory_region="kv_alice_region",
                           shared_memory_byte_size=x.nbytes)]):
            self.check_output("alice's own", "row_sum", "FP32", [x], alice.ModelInfer(request("row_sum", inputs)))
        alice.ModelInfer(request("kv_alice_graph", graph_inputs))

    def test_statistics_of_ops_are_everyones_and_of_graphs_their_tenants(self):
        """Op models are the server's, so their statistics count every tenant's requests, as
        Triton's would; a saved graph is its tenant's, and so are its configuration and
        statistics: another tenant's graph of the same name is another model."""
        alice, bob = self.c, Client(self.server.target, "tok-bob-5678")
        name = "kv_stats_graph"
        for client in (alice, bob):
            client.SaveGraph(O.SaveGraphRequest(name=name, graph=KServeTest.graph(self), overwrite=True))
            self.addCleanup(self.quietly, lambda c=client: c.DeleteGraph(O.DeleteGraphRequest(name=name)))
        row_sum_before = self.stats("row_sum", client=bob)["row_sum"].inference_count
        x = np.ones((2, 3), np.float32)
        alice.ModelInfer(request("row_sum", [In("x", "FP32", x.shape, x)]))
        a, b = np.ones((2, 48), np.float32), np.ones((48, 3), np.float32)
        alice.ModelInfer(request(name, [In("A", "FP32", a.shape, a), In("B", "FP32", b.shape, b)]))
        self.assertEqual(self.stats("row_sum", client=bob)["row_sum"].inference_count,
                         row_sum_before + 1, "bob's view of row_sum counts alice's request")
        self.assertEqual(self.stats(name, client=alice)[name].inference_count, 1)
        self.assertEqual(self.stats(name, client=bob)[name].inference_count, 0, "alice's run is not bob's")
        bob.DeleteGraph(O.DeleteGraphRequest(name=name))
        self.assertNotIn(name, self.stats(client=bob))
        self.assertIn(name, self.stats(client=alice))
        for call in (lambda: bob.ModelStatistics(K.ModelStatisticsRequest(name=name)),
                     lambda: bob.ModelConfig(K.ModelConfigRequest(name=name))):
            self.expect_error(C.NOT_FOUND, call, name, client=bob)


def main():
    global ARGS, TABLE, K, KG, O, OG, R, RG
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--opserve", required=True, help="the server binary")
    parser.add_argument("--proto-root", required=True, help="the directory holding inference/ and opserve/")
    parser.add_argument("--work-dir", required=True, help="for generated stubs and server logs")
    parser.add_argument("--op-table", help="opserve-op-table of the server's build (default: op_table.find_tool)")
    parser.add_argument("--junit-xml", help="also write each test's outcome there (the GPU suite counts them)")
    ARGS, rest = parser.parse_known_args()
    os.makedirs(ARGS.work_dir, exist_ok=True)
    K, KG, O, OG, R, RG = ks.generate_stubs(ARGS.proto_root, os.path.join(ARGS.work_dir, "gen"))
    TABLE = op_table.OpTable(ARGS.op_table or op_table.find_tool(ARGS.opserve))
    runner = unittest.TextTestRunner(verbosity=2, resultclass=ks.RecordingResult)
    result = unittest.main(argv=[sys.argv[0], *rest], testRunner=runner, exit=False).result
    if ARGS.junit_xml:
        ks.write_junit_xml(result, "python_kserve", ARGS.junit_xml)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
