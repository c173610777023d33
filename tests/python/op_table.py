"""The op table, read through opserve-op-table (tests/support/op_table_tool.cc), so that the
Python suites keep no op list and no per-op reference: which ops exist, their arity, dtypes,
test shapes and rows, and whether a server's answer is the CPU reference's within the op's
tolerance. A new op reaches these suites with no edit here. Not a test itself.

The tool is $OPSERVE_OP_TABLE (ctest sets it), else opserve-op-table on PATH (a bundle's bin/),
else the one the build tree of the server binary holds.
"""

import atexit
import json
import os
import shutil
import subprocess
import tempfile


def find_tool(server_binary=None):
    path = os.environ.get("OPSERVE_OP_TABLE") or shutil.which("opserve-op-table")
    if not path and server_binary:  # BUILD/server/opserve -> BUILD/tests/support/opserve-op-table
        build = os.path.dirname(os.path.dirname(os.path.abspath(server_binary)))
        path = os.path.join(build, "tests", "support", "opserve-op-table")
    if not path or not os.access(path, os.X_OK):
        raise RuntimeError("opserve-op-table not found: set OPSERVE_OP_TABLE, put it on PATH, or "
                           "build the opserve-op-table target beside the server")
    return path


def empty_cases(op):
    """The op's empty cases, as the contract test makes them: each small case with every
    dimension of one size set to 0 (all of them at once, so that sizes which must agree still
    do)."""
    cases = []
    for shapes in op.small_shapes:
        for size in sorted({d for shape in shapes for d in shape}):
            case = [tuple(0 if d == size else d for d in shape) for shape in shapes]
            if case not in cases:
                cases.append(case)
    return cases


class Op:
    """One op of the table: name, arity, dtypes (API names), small_shapes and edge_shapes (each
    case a list of input shapes), empty_fill ("zeros" or "nan") and its rows."""

    def __init__(self, entry):
        self.name = entry["name"]
        self.arity = entry["arity"]
        self.dtypes = entry["dtypes"]
        self.small_shapes = [[tuple(s) for s in case] for case in entry["small_shapes"]]
        self.edge_shapes = [[tuple(s) for s in case] for case in entry["edge_shapes"]]
        self.empty_fill = entry["empty_fill"]
        self.algorithms = entry["algorithms"]  # dicts: name, backend, dtypes, fallback

    def rows(self, backend):
        return [a for a in self.algorithms if a["backend"] == backend]

    def fallback(self, algorithm):
        """The row `algorithm` runs instead on shapes it does not take ("" for none)."""
        return next((a["fallback"] for a in self.algorithms if a["name"] == algorithm), "")


def _shape_arg(shape):
    return ",".join(str(int(d)) for d in shape)


class OpTable:
    def __init__(self, tool):
        self.tool = tool
        out = subprocess.run([tool, "describe"], check=True, capture_output=True, text=True).stdout
        self.ops = {entry["name"]: Op(entry) for entry in json.loads(out)["ops"]}
        self._dir = tempfile.mkdtemp(prefix="op_table-")
        atexit.register(self.close)

    def names(self, backend):
        """The ops with a row of `backend`: what ListOps on that backend must list."""
        return {name for name, op in self.ops.items() if op.rows(backend)}

    def op(self, name):
        if name not in self.ops:
            raise AssertionError(f"the server lists op {name!r}, which the op table lacks: this "
                                 f"suite cannot tell what it must answer")
        return self.ops[name]

    def infer(self, op, inputs):
        """inputs: [(dtype, shape)]. {"ok": True, "dtype", "shape"} or {"ok": False, "code",
        "message"}: the op's shape rule."""
        args = [self.tool, "infer", op]
        for dtype, shape in inputs:
            args += [dtype, _shape_arg(shape)]
        return json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)

    def check(self, op, algorithm, inputs, output):
        """inputs: [(dtype, shape, bytes)]; output: (dtype, shape, bytes), what the server
        answered, `algorithm` the row that ran (its tolerance applies). (True, "ok: ...") when it
        is the CPU reference's answer, else (False, why)."""
        args = [self.tool, "check", op, algorithm]
        for i, (dtype, shape, data) in enumerate([output, *inputs]):
            path = os.path.join(self._dir, f"{i}.bin")
            with open(path, "wb") as f:
                f.write(data)
            args += [dtype, _shape_arg(shape), path]
        run = subprocess.run(args, capture_output=True, text=True)
        if run.returncode == 2:
            raise RuntimeError(f"opserve-op-table {' '.join(args[1:4])}: {run.stderr}")
        return run.returncode == 0, (run.stdout + run.stderr).strip()

    def close(self):
        shutil.rmtree(self._dir, ignore_errors=True)


_SHARED = []


def shared():
    """One table for the process, from the tool find_tool finds beside $OPSERVE_BINARY."""
    if not _SHARED:
        _SHARED.append(OpTable(find_tool(os.environ.get("OPSERVE_BINARY"))))
    return _SHARED[0]
