"""opserve-cli against a server of two devices (opserve --device=cpu:2), checked by
cli_e2e_test.py: `ops` lists the devices, `put --device` and `--shard` place tensors, `ls` shows
where each lives and a sharded one's parts, `move` moves one and says what it copied, `run` says
where the graph ran and what it copied between devices, a graph's output "device" keeps its
stored copy there, and the placement mistakes get their code and name their culprit. With a
test build's --test_fail_device, `ops` shows a failed device and why while the other serves.

Not a test itself; cli_e2e_test.py imports it. Stdlib only.
"""

import json
import os
import struct

from e2e_script import check

DEVICES = ["cpu:0", "cpu:1"]
FLOAT32_EPS = 2.0 ** -24


def read_npy_floats(path):
    """The float32 values of a .npy file the CLI wrote (C order, little-endian)."""
    with open(path, "rb") as f:
        image = f.read()
    header_len = struct.unpack("<H", image[8:10])[0]
    data = image[10 + header_len:]
    return list(struct.unpack("<%df" % (len(data) // 4), data))


def table_rows(text):
    """A CLI table's lines split on runs of two or more spaces (cells may hold one space)."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().split("  ") if c.strip()]
        if cells:
            rows.append(cells)
    return rows


def write_graph(work, name, graph):
    with open(os.path.join(work, name), "w") as f:
        json.dump(graph, f)


def check_ops(cli):
    out, _ = cli("ops", "--json")
    devices = json.loads(out).get("devices", [])
    check([d["name"] for d in devices] == DEVICES, f"ops --json devices: {devices}")
    for d in devices:
        check(d["serving"] is True and d["error"] == "", f"{d['name']} not serving: {d}")
        check(d["capability"] == "cpu", f"{d['name']} capability {d['capability']!r}")
        for key in ("memoryTotal", "memoryBudget", "memoryUsed"):
            check(type(d[key]) is int, f"{d['name']}.{key} = {d[key]!r}: not an int")
        check(0 < d["memoryBudget"] and d["memoryUsed"] <= d["memoryBudget"],
              f"{d['name']} memory: {d}")
        check(d["algorithms"] and all("/" in a for a in d["algorithms"]),
              f"{d['name']} lists no op/algorithm rows: {d['algorithms']}")
    check(devices[0]["algorithms"] == devices[1]["algorithms"],
          "two CPU devices list different algorithm rows")

    out, _ = cli("ops")
    check(out.startswith("backend cpu, 2 devices\n"), f"ops' first line: {out.splitlines()[:1]}")
    rows = {r[0]: r for r in table_rows(out)}
    for name in DEVICES:
        check(name in rows and "serving" in rows[name],
              f"ops lacks a serving row for {name}:\n{out}")
    check("budget" in out and "capability" in out, f"ops' device table lacks its headers:\n{out}")
    # Devices that run the same rows need no per-row device column.
    op_header = next((r for r in table_rows(out) if r[0] == "op"), None)
    check(op_header is not None and "devices" not in op_header,
          f"ops shows a devices column for identical devices:\n{out}")


def check_placement(cli, work):
    out, _ = cli("put", "A", "a.npy", "--device=cpu:1")
    check("put A: float32[64, 48], 12.0 KiB on cpu:1" in out, f"put --device printed {out!r}")
    out, _ = cli("put", "B", "b.npy", "--device", "cpu:0", "--json")
    info = json.loads(out)["info"]
    check(info["device"] == "cpu:0" and info.get("shards", []) == [], f"put --json: {info}")

    out, _ = cli("ls")
    rows = {r[0]: r for r in table_rows(out)}
    check(rows.get("A", [""])[-1] == "cpu:1" and rows.get("B", [""])[-1] == "cpu:0",
          f"ls does not show where A and B live:\n{out}")

    # A graph runs where most of its stored input bytes are: A (12 KiB on cpu:1), not B
    # (6 KiB on cpu:0), which is copied over. Its stored output stays there.
    graph = {"nodes": [{"id": "ab", "op": "matmul",
                        "inputs": [{"stored": "A"}, {"stored": "B"}]}],
             "outputs": [{"node": "ab", "storeAs": "AB", "overwrite": True}]}
    write_graph(work, "placed.json", graph)
    out, _ = cli("run", "placed.json", "--json")
    response = json.loads(out)["response"]
    check(response["device"] == "cpu:1", f"the graph ran on {response['device']}, not cpu:1")
    check(response["peerCopyBytes"] == 48 * 32 * 4,
          f"peerCopyBytes {response['peerCopyBytes']!r}, expected B's 6144")
    check(type(response["timing"]["peerCopyUs"]) in (int, float)
          and response["timing"]["peerCopyUs"] >= 0, f"timing: {response['timing']}")
    check(response["stored"][0]["device"] == "cpu:1",
          f"AB stored on {response['stored'][0]['device']}, not where it ran")
    out, _ = cli("run", "placed.json")
    check("device cpu:1: queue" in out, f"run's timing line does not name cpu:1:\n{out}")
    check("peer copies: 6.00 KiB in " in out, f"run does not show the peer copy:\n{out}")

    # The output's "device" keeps the stored copy on cpu:0: AB's 8 KiB are copied too.
    graph["outputs"][0]["device"] = "cpu:0"
    write_graph(work, "placed_out.json", graph)
    out, _ = cli("run", "placed_out.json", "--json")
    response = json.loads(out)["response"]
    check(response["stored"][0]["device"] == "cpu:0",
          f"output device cpu:0, stored on {response['stored'][0]['device']}")
    check(response["peerCopyBytes"] == 48 * 32 * 4 + 64 * 32 * 4,
          f"peerCopyBytes {response['peerCopyBytes']!r}, expected B's 6144 and AB's 8192")
    out, _ = cli("run", "placed_out.json")
    check("stored AB: float32[64, 32], 8.00 KiB on cpu:0" in out, f"run's stored line:\n{out}")
    check("peer copies: 14.0 KiB in " in out, f"run does not show both peer copies:\n{out}")

    # Inline inputs only, nothing stored on the way: no peer copy, no line for it.
    write_graph(work, "inline.json", {
        "nodes": [{"id": "s", "op": "sum", "inputs": [{"inlineName": "X"}]}],
        "inlineTensors": {"X": {"npy": "b.npy"}},
        "outputs": [{"node": "s", "returnInline": True}]})
    out, _ = cli("run", "inline.json")
    check("peer copies" not in out, f"a peer-copy line for a run that copied nothing:\n{out}")


def check_move(cli):
    out, _ = cli("move", "A", "cpu:0")
    check(out.startswith("moved A: float32[64, 48], 12.0 KiB on cpu:0 (12.0 KiB copied in ")
          and "GB/s)" in out, f"move printed {out!r}")
    out, _ = cli("move", "A", "cpu:0")
    check(out == "A: float32[64, 48], 12.0 KiB on cpu:0 (there already, nothing moved)\n",
          f"a move to where it is printed {out!r}")
    out, _ = cli("move", "A", "cpu:1", "--json")
    moved = json.loads(out)
    check(moved["info"]["device"] == "cpu:1" and moved["bytes"] == 64 * 48 * 4
          and type(moved["seconds"]) in (int, float), f"move --json: {moved}")
    out, _ = cli("ls", "--json")
    where = {t["name"]: t["device"] for t in json.loads(out)["tensors"]}
    check(where.get("A") == "cpu:1", f"after the move ls has A on {where.get('A')}")


def check_shards(cli, work, demo):
    # 5 rows over 2 devices: the first takes 3, the second 2.
    rows = demo.matrix(5, 3, 7)
    with open(os.path.join(work, "s.npy"), "wb") as f:
        f.write(demo.npy_bytes(rows))
    out, _ = cli("put", "S", "s.npy", "--shard")
    check(out.splitlines()[0].startswith("put S: float32[5, 3], 60 B on cpu:0,cpu:1 in "),
          f"put --shard printed {out!r}")
    check("  shard 0: rows [0, 3) on cpu:0, 36 B\n  shard 1: rows [3, 5) on cpu:1, 24 B\n" in out,
          f"put --shard does not list the shards:\n{out}")

    out, _ = cli("ls", "--json")
    info = next(t for t in json.loads(out)["tensors"] if t["name"] == "S")
    check(info["device"] == "cpu:0,cpu:1", f"ls --json S device {info['device']!r}")
    check(info["shards"] == [{"device": "cpu:0", "rowBegin": 0, "rows": 3, "bytes": 36},
                             {"device": "cpu:1", "rowBegin": 3, "rows": 2, "bytes": 24}],
          f"ls --json S shards {info['shards']}")
    out, _ = cli("ls")
    table = table_rows(out)
    at = next(i for i, r in enumerate(table) if r[0] == "S")
    check(table[at + 1] == ["shard 0", "rows [0, 3)", "36", "cpu:0"]
          and table[at + 2] == ["shard 1", "rows [3, 5)", "24", "cpu:1"],
          f"ls does not show S's shards under it:\n{out}")

    cli("get", "S", "s_back.npy")
    flat = [v for row in rows for v in row]
    check(read_npy_floats(os.path.join(work, "s_back.npy")) == flat, "get S: not the rows put")

    # row_sum of a sharded input runs on each shard's device.
    write_graph(work, "sharded.json", {
        "nodes": [{"id": "rs", "op": "row_sum", "inputs": [{"stored": "S"}]}],
        "outputs": [{"node": "rs", "returnInline": True}]})
    out, _ = cli("run", "sharded.json", "--json")
    result = json.loads(out)
    check(result["response"]["device"] == "cpu:0,cpu:1",
          f"a sharded row_sum ran on {result['response']['device']!r}")
    values = result["outputs"]["rs"]["values"]
    for i, (value, row) in enumerate(zip(values, rows)):
        tolerance = 4 * FLOAT32_EPS * sum(abs(v) for v in row) + 1e-7
        check(abs(value - sum(row)) <= tolerance, f"row_sum[{i}] = {value}, reference {sum(row)}")
    check(len(values) == 5, f"row_sum gave {len(values)} rows")

    out, _ = cli("move", "S", "cpu:1", "--json")
    moved = json.loads(out)
    check(moved["info"]["device"] == "cpu:1" and moved["info"].get("shards", []) == []
          and 0 < moved["bytes"] <= 60, f"gathering S onto cpu:1: {moved}")


def check_errors(cli, work):
    _, err = cli("put", "X", "a.npy", "--device=cpu:7", code=1)
    check("INVALID_ARGUMENT: " in err and "cpu:7" in err, f"put on an unknown device: {err!r}")
    _, err = cli("move", "A", "cpu:9", code=1)
    check("INVALID_ARGUMENT: " in err and "cpu:9" in err, f"move to an unknown device: {err!r}")
    _, err = cli("move", "nope", "cpu:0", code=1)
    check("NOT_FOUND: " in err and "nope" in err, f"move of a missing tensor: {err!r}")
    with open(os.path.join(work, "v.npy"), "wb") as f:
        f.write(demo_vector_npy())
    _, err = cli("put", "V", "v.npy", "--shard", code=1)
    check("INVALID_ARGUMENT: " in err, f"sharding a vector: {err!r}")
    out, _ = cli("ls", "--json")
    names = {t["name"] for t in json.loads(out)["tensors"]}
    check(not names & {"X", "V"}, f"a refused put left a tensor: {names}")
    # Usage: the placement flags are put's, and --shard picks no device.
    for args in [("ls", "--device=cpu:0"), ("get", "A", "x.npy", "--shard"),
                 ("put", "A", "a.npy", "--shard", "--device=cpu:0"), ("move", "A"),
                 ("put", "A", "a.npy", "--device=")]:
        out, err = cli(*args, code=2)
        check(len(err.splitlines()) == 1 and "--help" in err and not out,
              f"usage error for {args} is not one line pointing at --help:\n{err}")


def demo_vector_npy():
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }"
    header += " " * (63 - len(header) % 64) + "\n"
    return (b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() +
            struct.pack("<4f", 1, 2, 3, 4))


def exercise(cli, work, demo):
    """Everything above, against a fresh server of DEVICES holding nothing yet."""
    check_ops(cli)
    check_placement(cli, work)
    check_move(cli)
    check_shards(cli, work, demo)
    check_errors(cli, work)


def check_failed_device(cli, work):
    """Against a server started with --test_fail_device=cpu:1: the first request that runs there
    fails INTERNAL; `ops` then shows cpu:1 out, with its error, and health stays SERVING."""
    write_graph(work, "inline.json", {
        "nodes": [{"id": "s", "op": "sum", "inputs": [{"inlineName": "X"}]}],
        "inlineTensors": {"X": {"npy": "b.npy"}},
        "outputs": [{"node": "s", "returnInline": True}]})
    # Inline-only graphs alternate between the devices: one of the first two lands on cpu:1.
    failures = []
    for _ in range(2):
        out, err = cli("run", "inline.json", code=None)
        if err:
            failures.append(err)
    check(len(failures) == 1 and "INTERNAL: " in failures[0],
          f"expected one INTERNAL failure from cpu:1, got {failures}")
    out, _ = cli("ops")
    rows = {r[0]: r for r in table_rows(out)}
    check("serving" in rows.get("cpu:0", []), f"cpu:0 is no longer serving:\n{out}")
    state = next((c for c in rows.get("cpu:1", []) if c.startswith("out: ")), "")
    check(len(state) > len("out: "), f"ops does not show cpu:1 out with its error:\n{out}")
    out, _ = cli("ops", "--json")
    failed = {d["name"]: d for d in json.loads(out)["devices"]}["cpu:1"]
    check(failed["serving"] is False and failed["error"], f"ops --json cpu:1: {failed}")
    out, _ = cli("health")
    check(out.strip() == "SERVING", f"health with one device out: {out!r}")
    _, err = cli("put", "Y", "a.npy", "--device=cpu:1", code=1)
    check("UNAVAILABLE: " in err and "cpu:1" in err, f"put on the failed device: {err!r}")
    out, _ = cli("put", "Y", "a.npy")
    check("on cpu:0" in out, f"put without a device went to the failed one: {out!r}")
