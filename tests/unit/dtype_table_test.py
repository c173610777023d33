"""The Python client's dtype table (client/python/opserve/dtypes.py) against the C++ one
(common/dtype.cc), row by row: names, proto values, element sizes, numpy names and the Open
Inference Protocol's datatype names. Run by ctest as dtype_table; it fails on any difference.

dtypes.py is read, not imported (its imports need the generated protos and grpc): its TABLE is a
literal, and its DType enum's members are checked against the table's names too.
"""

import argparse
import ast
import subprocess
import sys


def python_table(path):
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    table, members = None, []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "TABLE" for t in node.targets):
            table = ast.literal_eval(node.value)
        if isinstance(node, ast.ClassDef) and node.name == "DType":
            for item in node.body:
                if isinstance(item, ast.Assign) and isinstance(item.value, ast.Constant):
                    members.append((item.targets[0].id, item.value.value))
    if table is None:
        sys.exit(f"{path}: no TABLE literal")
    return [tuple(row) for row in table], members


def cpp_table(dump):
    out = subprocess.run([dump], check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        name, value, size, numpy_name, oip_name = line.split()
        rows.append((name, int(value), int(size), numpy_name, oip_name))
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dump", required=True, help="the dtype_table executable")
    parser.add_argument("--python", required=True, help="client/python/opserve/dtypes.py")
    args = parser.parse_args()
    cpp = cpp_table(args.dump)
    py, members = python_table(args.python)
    failures = []
    if not cpp:
        failures.append("the C++ table printed no rows")
    if py != cpp:
        failures.append("TABLE differs from common/dtype.cc's:\n  python: "
                        + "\n          ".join(map(str, py)) + "\n  c++:    "
                        + "\n          ".join(map(str, cpp)))
    if members != [(row[0], row[0]) for row in cpp]:
        failures.append(f"DType's members (name, value) {members} are not the table's names "
                        f"{[row[0] for row in cpp]}")
    for f in failures:
        print("FAIL:", f)
    if failures:
        sys.exit(1)
    print(f"OK: {len(cpp)} dtypes agree")


if __name__ == "__main__":
    main()
