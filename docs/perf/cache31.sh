#!/usr/bin/env bash
# Issue 31: what Pebble's block cache (--cache-size) does to a GET's and a
# SET's server CPU once the tree outgrows it. For each cache size, a fresh
# pair (a with --resp-listen, paired with b) is filled with 1,000,000 SETs of
# 100 bytes over 1,000,000 random keys (-P 16), then measured with
# redis-benchmark -P 1 and -P 16 (GET, SET). Run from the repository root:
#   bash docs/perf/cache31.sh           # ROUNDS=3 by default, medians printed
set -euo pipefail
ROUNDS=${ROUNDS:-3}
N=${N:-100000}
SIZES=${SIZES:-"32MiB 256MiB"}
BIN=${BIN:-/tmp/replicator-cache31}
go build -o "$BIN" ./cmd/replicator
tmp=$(mktemp -d)
apid= bpid=
cleanup() { kill $apid $bpid 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
. "$(dirname "$0")/lib.sh"  # hz, ticks, median, us
run() { # P TEST: prints server CPU us per request
  local c0 c1
  c0=$(ticks $apid)
  redis-benchmark -p 17379 -t "$2" -n "$N" -c 64 -P "$1" -r 1000000 -d 100 -q >/dev/null 2>&1
  c1=$(ticks $apid)
  awk -v a="$c0" -v b="$c1" -v hz="$hz" -v n="$N" 'BEGIN {printf "%.1f", (b-a)/hz*1e6/n}'
}
declare -A res
for r in $(seq "$ROUNDS"); do
  for size in $SIZES; do
    rm -rf "$tmp/a" "$tmp/b"
    "$BIN" serve --cluster-id a --data "$tmp/a" --listen 127.0.0.1:17401 --resp-listen 127.0.0.1:17379 --cache-size "$size" \
      --peer b=http://127.0.0.1:17402 --peer-secret b=s --log-level warn >>"$tmp/a.log" 2>&1 & apid=$!
    "$BIN" serve --cluster-id b --data "$tmp/b" --listen 127.0.0.1:17402 \
      --peer a=http://127.0.0.1:17401 --peer-secret a=s --log-level warn >>"$tmp/b.log" 2>&1 & bpid=$!
    for _ in $(seq 50); do redis-cli -p 17379 ping >/dev/null 2>&1 && break; sleep 0.1; done
    redis-benchmark -p 17379 -t set -n 1000000 -c 64 -P 16 -r 1000000 -d 100 -q >/dev/null 2>&1
    for m in "1 get" "1 set" "16 get" "16 set"; do
      v=$(run $m)
      echo "round $r: cache $size -P ${m% *} ${m#* }: $v us" >&2
      res["$size $m"]+="$v "
    done
    kill $apid $bpid; wait $apid $bpid 2>/dev/null || true
  done
done
echo
echo "medians of $ROUNDS rounds, server CPU us per request on a tree of ~632,000 keys (1,000,000 random SETs):"
for m in "1 get" "1 set" "16 get" "16 set"; do
  line="-P ${m% *} ${m#* }:"
  for size in $SIZES; do line+="  cache $size $(echo ${res["$size $m"]} | tr ' ' '\n' | median)"; done
  echo "$line"
done
