#!/bin/bash
# What the shim costs a process that never uses it: a bash loop of N `/bin/true` (bash and
# every /bin/true loading the library), natively and under each library given, ROUNDS rounds,
# each round running every variant once in a shuffled order; prints each variant's median wall
# and its ratio to native. Side by side in one run: this 2-vCPU guest drifts by ±20% between
# sittings.
#
#   crates/zerofault-preload/load-cost.sh [ROUNDS [N [LIB...]]]
#   (default: 30 rounds of 500, target/release/libzerofault.so)
set -eu
rounds=${1:-30}
n=${2:-500}
shift $(($# < 2 ? $# : 2))
libs=("$@")
[ ${#libs[@]} -gt 0 ] || libs=("$(cd "$(dirname "$0")/../.." && pwd)/target/release/libzerofault.so")
for l in "${libs[@]}"; do
  case $l in /*) ;; *) echo "load-cost.sh: give libraries by absolute path: $l" >&2; exit 2 ;; esac
  [ -f "$l" ] || { echo "load-cost.sh: no such library: $l (cargo build --release)" >&2; exit 2; }
done
loop="for i in \$(seq $n); do /bin/true; done"
TIMEFORMAT=%R
for r in $(seq "$rounds"); do
  for v in $(printf '%s\n' native "${libs[@]}" | shuf); do
    p=; [ "$v" = native ] || p=$v
    t=$( { time LD_PRELOAD=$p bash -c "$loop"; } 2>&1 )
    echo "$v $t"
  done
done | sort -k1,1 -k2n | awk -v n="$n" -v rounds="$rounds" '
  { v[$1] = v[$1] " " $2; c[$1]++ }
  END {
    for (k in v) { split(substr(v[k], 2), a, " "); m[k] = a[int((c[k] + 1) / 2)] }
    printf "%d rounds of %d /bin/true from bash, medians:\n", rounds, n
    printf "  %-60s %.3f s\n", "native", m["native"]
    for (k in m) if (k != "native") printf "  %-60s %.3f s  %.3fx native\n", k, m[k], m[k] / m["native"]
  }'
