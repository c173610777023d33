#!/usr/bin/env python3
"""The generated proto headers are on the edge's include path only, as the build sets it up.

Every header protoc makes from proto/**/*.proto (X.pb.h, X.grpc.pb.h) is included, alone, into a
probe compiled with the very command line of a source file of each layer below the edge
(compile_commands.json): each must fail, with the compiler naming that header as not found. The
same probe compiled as a file of server/rpc must succeed, so that the headers and the command
lines are the real ones. A layer that starts linking the generated code (opserve_proto), or
anything that brings its include path along, fails this test.

  proto_headers_test.py --source-root DIR --compile-commands FILE
"""
import argparse
import json
import pathlib
import shlex
import subprocess
import sys
import tempfile

LOWER_LAYERS = ["common", "kernels", "server/ops", "server/engine"]
EDGE = "server/rpc"


def generated_headers(source_root):
    protos = sorted((source_root / "proto").rglob("*.proto"))
    headers = []
    for proto in protos:
        stem = proto.relative_to(source_root / "proto").with_suffix("").as_posix()
        headers += [stem + ".pb.h", stem + ".grpc.pb.h"]
    return headers


def command_of(entries, source_root, layer):
    """The compile command of one C++ file directly in LAYER, or None."""
    folder = (source_root / layer).resolve()
    for e in entries:
        f = pathlib.Path(e["file"]).resolve()
        if f.parent == folder and f.suffix == ".cc":
            args = e.get("arguments") or shlex.split(e["command"])
            return e["directory"], args
    return None


def probe_args(args, probe):
    """ARGS compiling PROBE for syntax only: no object, no dependency file, no launcher."""
    out, skip = [], 0
    for i, a in enumerate(args):
        if skip:
            skip -= 1
            continue
        if i == 0 and pathlib.Path(a).name == "ccache":
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = 1
            continue
        if a in ("-c", "-MD", "-MMD"):
            if a == "-c":
                skip = 1  # the source that follows
            continue
        out.append(a)
    return out + ["-fsyntax-only", str(probe)]


def compile_probe(directory, args, header, work):
    probe = work / "probe.cc"
    probe.write_text('#include "%s"\n' % header)
    return subprocess.run(probe_args(args, probe), cwd=directory, capture_output=True, text=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source-root", required=True, type=pathlib.Path)
    ap.add_argument("--compile-commands", required=True, type=pathlib.Path)
    opts = ap.parse_args()
    root = opts.source_root.resolve()
    entries = json.loads(opts.compile_commands.read_text())
    headers = generated_headers(root)
    if not headers:
        print("proto_headers_test: no .proto under %s/proto" % root, file=sys.stderr)
        return 1
    failures = []
    checked = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        edge = command_of(entries, root, EDGE)
        if edge is None:
            failures.append("no C++ file of %s in %s" % (EDGE, opts.compile_commands))
        else:
            for h in headers:
                r = compile_probe(edge[0], edge[1], h, work)
                if r.returncode != 0:
                    failures.append("%s cannot include %s:\n%s" % (EDGE, h, r.stderr[-2000:]))
        for layer in LOWER_LAYERS:
            cmd = command_of(entries, root, layer)
            if cmd is None:
                if layer == "kernels":
                    continue  # a build without CUDA has no kernel layer
                failures.append("no C++ file of %s in %s" % (layer, opts.compile_commands))
                continue
            for h in headers:
                checked += 1
                r = compile_probe(cmd[0], cmd[1], h, work)
                if r.returncode == 0:
                    failures.append("%s can include %s" % (layer, h))
                elif "%s: No such file or directory" % h not in r.stderr:
                    failures.append("%s failed on %s for another reason:\n%s" %
                                    (layer, h, r.stderr[-2000:]))
    for f in failures:
        print("proto_headers_test: FAIL: " + f, file=sys.stderr)
    if failures:
        return 1
    print("proto_headers_test: %d generated headers found from %s, not found in %d probes below it"
          % (len(headers), EDGE, checked))
    return 0


if __name__ == "__main__":
    sys.exit(main())
