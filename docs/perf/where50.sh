#!/usr/bin/env bash
# Issue 50: where a writer's CPU per RESP SET goes at -P 16, by part, for
# each build given, from a CPU profile taken in the middle of the run (the
# part's share of the profile times the run's CPU per SET). Run from the
# repository root:
#   BUILDS="old=/tmp/rep-old new=/tmp/rep-new" ROUNDS=3 bash docs/perf/where50.sh
#   A_ARGS="--memtable-size 16777216" ...   # extra flags for a
#   BUILDS="m16=/tmp/rep-new m64=/tmp/rep-new" ARGS_m16="--memtable-size 16777216" ...  # per build
# Each round and build: a fresh pair (a with --resp-listen and
# --pprof-listen), 100,000 SETs at -P 1, then N (200,000) at -P 16 with a
# 4 s profile of a taken 1 s in. Medians over the rounds.
set -euo pipefail
ROUNDS=${ROUNDS:-3}
N=${N:-200000}
BUILDS=${BUILDS:-new=/tmp/rep-new}
tmp=$(mktemp -d)
apid= bpid=
cleanup() { kill $apid $bpid 2>/dev/null || true; wait 2>/dev/null || true; [ -n "$KEEP" ] || rm -rf "$tmp"; }
trap cleanup EXIT
KEEP=${KEEP:-}
. "$(dirname "$0")/lib.sh"  # hz, ticks, median, us
# part NAME REGEX: the cumulative share (%) of the frames matching REGEX
parts=(
  "state machine: previous version read|store\.\(\*Batch\)\.recordLocked$"
  "state machine: Pebble commit (memtable)|store\.\(\*Batch\)\.Commit$"
  "state machine: all|machine\.\(\*FSM\)\.Apply$"
  "raft log append|wal\.\(\*Store\)\.StoreLogs$"
  "RESP door|resp\.\(\*Server\)\.serveConn$"
  "committer|replica\.\(\*Committer\)\.run$"
  "Pebble flushes|pebble/v2\.\(\*DB\)\.flush1$"
  "Pebble compactions|pebble/v2\.\(\*DB\)\.compactAndWrite$"
  "shipping to b|transport\.\(\*Shipper\)\.Run$"
  "garbage collector|runtime\.gcBgMarkWorker$"
)
declare -A res
for r in $(seq "$ROUNDS"); do
  for build in $BUILDS; do
    name=${build%%=*} bin=${build#*=}
    args_var="ARGS_$name"; extra=${!args_var:-}
    rm -rf "$tmp/a" "$tmp/b"
    "$bin" serve --cluster-id a --data "$tmp/a" --listen 127.0.0.1:17601 --resp-listen 127.0.0.1:17679 --pprof-listen 127.0.0.1:17660 ${A_ARGS:-} $extra \
      --peer b=http://127.0.0.1:17602 --peer-secret b=s --log-level warn >>"$tmp/a.log" 2>&1 & apid=$!
    "$bin" serve --cluster-id b --data "$tmp/b" --listen 127.0.0.1:17602 \
      --peer a=http://127.0.0.1:17601 --peer-secret a=s --log-level warn >>"$tmp/b.log" 2>&1 & bpid=$!
    for _ in $(seq 100); do redis-cli -p 17679 ping >/dev/null 2>&1 && break; sleep 0.1; done
    redis-benchmark -p 17679 -t set -n 100000 -c 64 -P 1 -r 1000000 -d 100 -q >/dev/null 2>&1
    a0=$(ticks $apid)
    redis-benchmark -p 17679 -t set -n "$N" -c 64 -P 16 -r 1000000 -d 100 -q >/dev/null 2>&1 &
    bench=$!
    sleep 1
    curl -s -o "$tmp/p.prof" 'http://127.0.0.1:17660/debug/pprof/profile?seconds=4'
    wait $bench
    a1=$(ticks $apid)
    per=$(awk -v a="$a0" -v b="$a1" -v hz="$hz" -v n="$N" 'BEGIN {printf "%.2f", (b-a)/hz*1e6/n}')
    res["$name total"]+="$per "
    top=$(go tool pprof -top -cum -nodecount=100000 "$bin" "$tmp/p.prof" 2>/dev/null)
    for p in "${parts[@]}"; do
      label=${p%%|*} re=${p#*|}
      pct=$(echo "$top" | { grep -E "$re" || true; } | head -1 | awk '{print $5}' | tr -d '%')
      res["$name $label"]+="$(awk -v p="${pct:-0}" -v t="$per" 'BEGIN {printf "%.2f", p/100*t}') "
    done
    echo "round $r $name: $per us per SET" >&2
    kill $apid $bpid; wait $apid $bpid 2>/dev/null || true; apid= bpid=
  done
done
echo
echo "a's CPU per RESP SET at -P 16 by part, us (medians of $ROUNDS rounds; parts overlap where nested: the state machine's total includes its first two lines)"
printf "%-44s" ""; for build in $BUILDS; do printf "%10s" "${build%%=*}"; done; echo
for p in "total|" "${parts[@]}"; do
  label=${p%%|*}
  printf "%-44s" "$label"
  for build in $BUILDS; do printf "%10s" "$(echo ${res["${build%%=*} $label"]} | tr ' ' '\n' | median)"; done
  echo
done
