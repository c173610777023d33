#!/usr/bin/env bash
# make demo: start opserve on the best backend present (the GPU if usable, else the CPU), run
# examples/demo_graph.json with opserve-cli, print the outputs and the timing table, stop it.
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
server="$build/server/opserve"
cli="$build/client/opserve-cli"
log=$(mktemp)

python3 examples/make_demo_inputs.py --out examples

"$server" --port=0 --metrics_port=-1 --http_port=-1 --device=auto 2>"$log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -f "$log"' EXIT
port=""
for _ in $(seq 1 100); do
  port=$(sed -n 's/^opserve: listening on .*:\([0-9]*\)$/\1/p' "$log")
  [[ -n "$port" ]] && break
  kill -0 $pid 2>/dev/null || { cat "$log"; echo "demo: the server exited" >&2; exit 1; }
  sleep 0.1
done
[[ -n "$port" ]] || { cat "$log"; echo "demo: the server did not start" >&2; exit 1; }
head -1 "$log"   # which backend, and why

target="127.0.0.1:$port"
echo "+ opserve-cli health"; "$cli" --target "$target" health
echo "+ opserve-cli put A examples/a.npy"; "$cli" --target "$target" put A examples/a.npy --overwrite
echo "+ opserve-cli run examples/demo_graph.json"; "$cli" --target "$target" run examples/demo_graph.json
echo "+ opserve-cli ls"; "$cli" --target "$target" ls

kill -TERM $pid
wait $pid
trap - EXIT
tail -2 "$log"
rm -f "$log"
