#!/usr/bin/env bash
# Issue 51: a cluster's write capacity with several raft groups. One cluster
# of three nodes, each in a CPU cgroup of its own (../shared/tools/node-cpu.sh,
# QUOTA_US per 100 ms: 25000 = a quarter core), written through the RESP
# door by redis-benchmark (SET, CLIENTS=64 clients spread over the three nodes, each
# node forwarding what it does not lead to the key's group's leader), with
# --groups 1 and --groups 3 in turn, ROUNDS rounds interleaved; medians.
# Also, with one group and every client at the leader, a write's CPU at the
# leader (L) and at a follower (F), and the ideal gain N*L/(L+2F).
# No peers: a cluster of several groups does not replicate yet (docs/CLUSTER.md).
# Run from the repository root (root, cgroup v1 cpu controller):
#   bash docs/perf/groups51.sh
set -euo pipefail
ROUNDS=${ROUNDS:-3}
N=${N:-20000}          # SETs per node per run
CLIENTS=${CLIENTS:-64} # redis-benchmark clients, spread over the nodes
QUOTA_US=${QUOTA_US:-25000}
BIN=${BIN:-/tmp/replicator-groups51}
WRAP=$(cd "$(dirname "$0")/../../../shared/tools" 2>/dev/null && pwd)/node-cpu.sh
[ -x "$WRAP" ] || WRAP=$(pwd)/../shared/tools/node-cpu.sh
go build -o "$BIN" ./cmd/replicator
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rmdir /sys/fs/cgroup/cpu/rnode.* 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
. "$(dirname "$0")/lib.sh" # hz, ticks, median, us

# start G: a fresh cluster of three nodes with G groups; waits until its
# groups have leaders on as many nodes as they can.
start() {
  local g=$1 i j joins
  rm -rf "$tmp"/n*; pids=()
  for i in 1 2 3; do
    joins=""
    for j in 1 2 3; do [ $j = $i ] || joins="$joins --join 127.0.0.1:1780$j"; done
    REPLICATOR_BIN="$BIN" QUOTA_US=$QUOTA_US "$WRAP" serve --cluster-id a --node-id n$i --data "$tmp/n$i" \
      --listen 127.0.0.1:1761$i --resp-listen 127.0.0.1:1762$i --raft-listen 127.0.0.1:1770$i \
      --gossip-bind 127.0.0.1:1780$i $joins --bootstrap-expect 3 --groups "$g" --log-level warn >>"$tmp/n$i.log" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 300); do
    leaders=$(curl -s 127.0.0.1:17611/admin/cluster | python3 -c '
import json,sys
d=json.load(sys.stdin)
gs=d.get("groups") or [{"leader":d["leader"] and "x"}]
print(len({g["leader"] for g in gs if g["leader"]}))' 2>/dev/null || echo 0)
    [ "$leaders" = "$g" ] && break
    sleep 0.2
  done
  redis-cli -p 17621 set warm up >/dev/null
}
stop() { kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true; pids=(); rmdir /sys/fs/cgroup/cpu/rnode.* 2>/dev/null || true; }

# spread: 64 clients over the three nodes, N SETs each node; prints SETs/s
# and the three nodes' CPU per SET (us, each node's).
spread() {
  local t0 t1 i bp=() c0=() c1=()
  for i in 0 1 2; do c0+=("$(ticks "${pids[$i]}")"); done
  t0=$(date +%s.%N)
  for i in 1 2 3; do
    redis-benchmark -p 1762$i -t set -n "$N" -c $(( (CLIENTS + 3 - i) / 3 )) -r 1000000 -q >/dev/null &
    bp+=($!)
  done
  wait "${bp[@]}"
  t1=$(date +%s.%N)
  for i in 0 1 2; do c1+=("$(ticks "${pids[$i]}")"); done
  awk -v a="$t0" -v b="$t1" -v n=$((3 * N)) 'BEGIN {printf "%.0f", n/(b-a)}'
  for i in 0 1 2; do printf " %s" "$(us "${c0[$i]}" "${c1[$i]}" $((3 * N)))"; done
}

r1=() r3=() ls=() fs=()
for r in $(seq "$ROUNDS"); do
  start 1
  # L and F: every client at the leader.
  lead=$(curl -s 127.0.0.1:17611/admin/cluster | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["leader"])')
  li=$(curl -s 127.0.0.1:17611/admin/cluster | python3 -c 'import json,sys; d=json.load(sys.stdin); print([n["id"] for n in d["nodes"] if n["leader"]][0][1:])')
  fi_=$(( li % 3 + 1 ))
  lp=${pids[$((li - 1))]} fp=${pids[$((fi_ - 1))]}
  l0=$(ticks "$lp") f0=$(ticks "$fp")
  redis-benchmark -p 1762$li -t set -n $((3 * N)) -c "$CLIENTS" -r 1000000 -q >/dev/null
  l1=$(ticks "$lp") f1=$(ticks "$fp")
  ls+=("$(us "$l0" "$l1" $((3 * N)))") fs+=("$(us "$f0" "$f1" $((3 * N)))")
  read -r v c <<<"$(spread)"; r1+=("$v"); cpu1="$c"
  stop
  start 3
  read -r v c <<<"$(spread)"; r3+=("$v"); cpu3="$c"
  stop
  echo "round $r: G=1 ${r1[-1]} SETs/s (nodes' CPU per SET: $cpu1 us), G=3 ${r3[-1]} SETs/s ($cpu3 us); L ${ls[-1]} us, F ${fs[-1]} us (leader $lead)"
done
m1=$(printf '%s\n' "${r1[@]}" | median) m3=$(printf '%s\n' "${r3[@]}" | median)
L=$(printf '%s\n' "${ls[@]}" | median) F=$(printf '%s\n' "${fs[@]}" | median)
awk -v m1="$m1" -v m3="$m3" -v L="$L" -v F="$F" 'BEGIN {
  ideal = 3*L/(L+2*F); gain = m3/m1
  printf "medians: G=1 %d SETs/s, G=3 %d SETs/s: %.2fx; L %.1f us, F %.1f us per SET: ideal %.2fx; measured %.0f%% of it\n", m1, m3, gain, L, F, ideal, 100*gain/ideal }'
