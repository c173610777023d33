#!/usr/bin/env bash
# On a GPU machine: row_mean(transpose(matmul(A, B))) on 4096x4096 float32 tensors stored on the
# GPU beforehand, through opserve-cli, checked against a float64 numpy reference; then graphs of
# every op, and /metrics must show non-zero kernel bytes per op and algorithm.
# Usage: gpu-demo.sh BIN_DIR WORK_DIR   (BIN_DIR holds opserve and opserve-cli; needs numpy)
set -euo pipefail
bin=$1
work=$2
mkdir -p "$work"
cd "$work"
python3 - <<'PY'
import numpy as np
rng = np.random.default_rng()
for name in "ab":
    np.save(f"{name}.npy", rng.uniform(-1, 1, (4096, 4096)).astype(np.float32))
np.save("x.npy", rng.uniform(-1, 1, (1 << 20,)).astype(np.float32))
PY
"$bin/opserve" --device=cuda --port=0 --metrics_port=0 --http_port=-1 > server.log 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q "listening on" server.log && break; sleep 0.1; done
head -3 server.log
port=$(sed -n 's/^opserve: listening on .*:\([0-9]*\)$/\1/p' server.log)
mport=$(sed -n 's/^opserve: metrics on port \([0-9]*\).*/\1/p' server.log)
cli="$bin/opserve-cli --target 127.0.0.1:$port"
$cli put A a.npy
$cli put B b.npy
cat > graph.json <<'JSON'
{"nodes": [
  {"id": "ab", "op": "matmul", "inputs": [{"stored": "A"}, {"stored": "B"}]},
  {"id": "abt", "op": "transpose", "inputs": [{"node": "ab"}]},
  {"id": "mean", "op": "row_mean", "inputs": [{"node": "abt"}]}],
 "outputs": [{"node": "mean", "storeAs": "MEAN", "overwrite": true}]}
JSON
$cli run graph.json
$cli get MEAN mean.npy
python3 - <<'PY'
import numpy as np
a, b, got = np.load("a.npy").astype(np.float64), np.load("b.npy").astype(np.float64), np.load("mean.npy")
ref = (a @ b).T.mean(axis=1)
err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
print(f"gpu-demo: 4096^3 row_mean(transpose(matmul)) relative error vs float64 numpy: {err:.3e}")
assert np.all(np.isfinite(got)) and err < 1e-4, err
PY
# Every op and algorithm once, so that /metrics has a series for each.
python3 - "$bin" "$port" <<'PY'
import json, subprocess, sys
bin, port = sys.argv[1], sys.argv[2]
ops = json.loads(subprocess.check_output([f"{bin}/opserve-cli", "--target", f"127.0.0.1:{port}", "--json", "ops"]))
shapes = {"sum": ["A"], "row_sum": ["A"], "row_mean": ["A"], "transpose": ["A"], "matmul": ["A", "B"]}
for op in ops["ops"]:
    for algo in op["algorithms"]:
        g = {"nodes": [{"id": "n", "op": op["name"], "algorithm": algo["name"],
                        "inputs": [{"stored": s} for s in shapes[op["name"]]]}],
             "outputs": [{"node": "n", "storeAs": "out", "overwrite": True}]}
        open("one.json", "w").write(json.dumps(g))
        subprocess.check_call([f"{bin}/opserve-cli", "--target", f"127.0.0.1:{port}", "run", "one.json"],
                              stdout=subprocess.DEVNULL)
PY
python3 - "$mport" <<'PY'
import sys, urllib.request, re
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics").read().decode()
rows = re.findall(r'^opserve_kernel_bytes_total\{([^}]*)\} (\S+)$', text, re.M)
zero = [r for r in rows if float(r[1]) <= 0]
print(f"gpu-demo: /metrics has {len(rows)} opserve_kernel_bytes_total series, {len(zero)} at zero")
for labels, v in sorted(rows):
    print(f"  {labels} {float(v):.4g}")
secs = dict(re.findall(r'^opserve_kernel_seconds_total\{([^}]*)\} (\S+)$', text, re.M))
for labels, v in sorted(rows):
    if float(secs.get(labels, 0)) > 0:
        print(f"  GB/s {labels}: {float(v) / float(secs[labels]) / 1e9:.1f}")
assert rows and not zero
PY
kill -TERM $pid
wait $pid
trap - EXIT
echo "gpu-demo: server exit $?"
