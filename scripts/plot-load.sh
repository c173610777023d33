#!/usr/bin/env bash
# Draws opserve-bench's load.csv (the service under concurrent load) as a PNG: req/s against
# concurrency, one panel per workload, one line per lane count, gRPC's Health/Check floor dashed
# in every panel. Needs gnuplot (Debian: gnuplot-nox).
#   scripts/plot-load.sh OUT_DIR/load.csv docs/performance/load.png
set -euo pipefail
csv=$1
png=$2
command -v gnuplot >/dev/null || { echo "plot-load: gnuplot is missing (apt-get install gnuplot-nox)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# One small data file per (workload, lanes): "concurrency req_per_s", sorted by concurrency.
lanes=$(tail -n +2 "$csv" | cut -d, -f1 | sort -un)
workloads=$(tail -n +2 "$csv" | cut -d, -f2 | grep -v '^health$' | awk '!seen[$0]++')
for l in $lanes; do
  while IFS= read -r w; do
    f="$tmp/$(echo "$w" | tr ' x' '__')_$l.dat"
    awk -F, -v l="$l" -v w="$w" '$1 == l && $2 == w {print $3, $5}' "$csv" | sort -n >"$f"
  done <<<"$(printf '%s\nhealth\n' "$workloads")"
done
n=$(echo "$workloads" | wc -l)
{
  echo "set terminal pngcairo size $((520 * n)),460 noenhanced font ',10'"
  echo "set output '$png'"
  echo "set multiplot layout 1,$n title 'opserve under concurrent load: req/s against concurrency (stored inputs, threads on one channel)'"
  echo "set logscale x 2; set xlabel 'concurrency'; set ylabel 'req/s'; set grid; set key top left"
  echo "set yrange [0:*]"
  while IFS= read -r w; do
    plot="plot "
    sep=""
    for l in $lanes; do
      f="$tmp/$(echo "$w" | tr ' x' '__')_$l.dat"
      plot+="$sep'$f' using 1:2 with linespoints lw 2 title '$l lane(s)'"
      sep=", "
      h="$tmp/health_$l.dat"
      plot+=", '$h' using 1:2 with lines dt 2 lc rgb 'gray' title (${l} == ${lanes%%$'\n'*} ? 'Health/Check floor' : '')"
    done
    echo "set title '$w'"
    echo "$plot"
  done <<<"$workloads"
  echo "unset multiplot"
} >"$tmp/plot.gp"
gnuplot "$tmp/plot.gp"
echo "plot-load: wrote $png"
