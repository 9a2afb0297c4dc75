#!/usr/bin/env bash
# Issue 31: server CPU per SET and throughput through the RESP door, beside
# Redis 7 with appendonly yes / appendfsync always (durable per write), and
# beside the HTTP single-PUT figure of the same run (replicator bench
# --scenarios puts). PING (ping_mbulk) is the connection alone: a round trip
# with no work behind it. Run from the repository root:
#   bash docs/perf/resp31.sh            # 3 rounds, medians printed
#   A_ARGS='--cache-size 32MiB' ...     # extra flags for a
#   TESTS='ping_mbulk set get setex' ... # setex: SET key value EX 3600 (issue 48)
# Needs redis-server and redis-benchmark (Debian: redis-server, redis-tools).
set -euo pipefail
ROUNDS=${ROUNDS:-3}
TESTS=${TESTS:-ping_mbulk set get}
N=${N:-100000}
BIN=${BIN:-/tmp/replicator-resp31}
go build -o "$BIN" ./cmd/replicator
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
apid= bpid= rpid=
trap cleanup EXIT
. "$(dirname "$0")/lib.sh"  # hz, ticks, median, us

# Each round starts a fresh pair and a fresh Redis: the same data, the
# same compaction debt (none) for every round.
startall() {
  rm -rf "$tmp/a" "$tmp/b" "$tmp/redis"; mkdir -p "$tmp/redis"
  "$BIN" serve --cluster-id a --data "$tmp/a" --listen 127.0.0.1:17401 --resp-listen 127.0.0.1:17379 ${A_ARGS:-} \
    --peer b=http://127.0.0.1:17402 --peer-secret b=s --log-level warn >>"$tmp/a.log" 2>&1 & apid=$!
  "$BIN" serve --cluster-id b --data "$tmp/b" --listen 127.0.0.1:17402 \
    --peer a=http://127.0.0.1:17401 --peer-secret a=s --log-level warn >>"$tmp/b.log" 2>&1 & bpid=$!
  redis-server --port 17380 --appendonly yes --appendfsync always --save '' --dir "$tmp/redis" --daemonize no \
    --logfile "$tmp/redis.log" & rpid=$!
  pids=($apid $bpid $rpid)
  for port in 17379 17380; do
    for _ in $(seq 50); do redis-cli -p $port ping >/dev/null 2>&1 && break; sleep 0.1; done
  done
}
stopall() { kill $apid $bpid $rpid; wait $apid $bpid $rpid 2>/dev/null || true; }

# run NAME PID PORT P TEST: prints "<requests/s> <server CPU us per request>"
run() {
  local c0 c1 out rps
  c0=$(ticks "$2")
  if [ "$5" = setex ]; then
    # A SET with an expiry: redis-benchmark's custom command, a 100-byte value.
    out=$(redis-benchmark -p "$3" -n "$N" -c 64 -P "$4" -r 1000000 -q SET key:__rand_int__ "$(printf '%0100d' 0)" EX 3600 2>/dev/null |
      tr '\r' '\n' | grep -i "requests per second" | tail -1 | sed 's/^.*EX 3600: /setex: /')
  else
    out=$(redis-benchmark -p "$3" -t "$5" -n "$N" -c 64 -P "$4" -r 1000000 -d 100 -q 2>/dev/null | tr '\r' '\n' | grep -i "^$5:" | tail -1)
  fi
  c1=$(ticks "$2")
  rps=$(echo "$out" | awk '{print $2}')
  echo "$rps $(awk -v a="$c0" -v b="$c1" -v hz="$hz" -v n="$N" 'BEGIN {printf "%.1f", (b-a)/hz*1e6/n}')"
}

declare -A res
for r in $(seq "$ROUNDS"); do
  startall
  for P in 1 16; do
    for t in $TESTS; do
      for who in resp redis; do
        if [ $who = resp ]; then out=$(run resp $apid 17379 $P $t); else out=$(run redis $rpid 17380 $P $t); fi
        echo "round $r: $who -P $P $t: $out" >&2
        res["$who P$P $t rps"]+="${out% *} "
        res["$who P$P $t cpu"]+="${out#* } "
      done
    done
  done
  # b's CPU replicating a's SETs (-P 16), per SET
  b0=$(ticks $bpid); redis-benchmark -p 17379 -t set -n "$N" -c 64 -P 16 -r 1000000 -d 100 -q >/dev/null 2>&1; b1=$(ticks $bpid)
  res["b per SET cpu"]+="$(awk -v a="$b0" -v b="$b1" -v hz="$hz" -v n="$N" 'BEGIN {printf "%.1f", (b-a)/hz*1e6/n}') "
  stopall
done
# The HTTP single-PUT figure of the same run (its own pair of clusters).
http=""
for r in $(seq "${HTTP_ROUNDS:-$ROUNDS}"); do
  http+="$("$BIN" bench --scenarios puts --steady-for 10s 2>&1 | grep -o 'server CPU per acknowledged write [0-9.]* us at a' | grep -o '[0-9.]*' | head -1) "
done

echo
echo "medians of $ROUNDS rounds, $N requests each, redis-benchmark -c 64 -d 100 -r 1000000:"
printf "%-28s %12s %14s\n" "" "requests/s" "server CPU us"
for P in 1 16; do
  for t in $TESTS; do
    for who in resp redis; do
      printf "%-28s %12s %14s\n" "$who -P $P $t" "$(echo ${res["$who P$P $t rps"]} | tr ' ' '\n' | median)" "$(echo ${res["$who P$P $t cpu"]} | tr ' ' '\n' | median)"
    done
  done
done
echo "peer b, CPU per SET replicated (-P 16): $(echo ${res["b per SET cpu"]} | tr ' ' '\n' | median) us"
echo "HTTP single PUT (replicator bench --scenarios puts, 64 clients, fresh pair each): $(echo $http | tr ' ' '\n' | median) us (runs: $http)"

# Replication lag at 5,000 writes/s, RESP SETs against HTTP PUTs, as
# multiples of the floor replicator bench measures (3 runs each; LAG=0
# skips them).
[ "${LAG:-1}" = 0 ] && exit 0
for r in $(seq "$ROUNDS"); do
  for via in "" "--resp"; do
    "$BIN" bench --scenarios steady --rates 5000 $via 2>&1 | grep -E "^steady" | sed "s/^/round $r: /"
  done
done
