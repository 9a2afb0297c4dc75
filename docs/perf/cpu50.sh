#!/usr/bin/env bash
# Issue 50: CPU per durable replicated write at the writer (a) and at the
# receiver (b), for RESP SETs at -P 1 and -P 16 and HTTP single PUTs, beside
# Redis 7 (appendonly yes, appendfsync always), builds interleaved round by
# round. Run from the repository root:
#   BUILDS="old=/tmp/rep-old new=/tmp/rep-new" bash docs/perf/cpu50.sh
#   ROUNDS=3 N=100000 HTTP=1 PG=1 ...  (PG=1 adds the PostgreSQL anchor's
#   single-row figure at 64 clients and replicator bench's puts@64 beside it)
# Each round and build starts a fresh pair and a fresh Redis; a's RESP door
# takes redis-benchmark -t set -c 64 -d 100 -r 1000000 -n N; b's CPU is read
# after b holds every write (its applied count stops moving). Medians at the end.
set -euo pipefail
ROUNDS=${ROUNDS:-3}
N=${N:-100000}
BUILDS=${BUILDS:-new=/tmp/rep-new}
tmp=$(mktemp -d)
apid= bpid= rpid=
cleanup() { kill $apid $bpid $rpid 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
. "$(dirname "$0")/lib.sh"  # hz, ticks, median, us

start() {
  rm -rf "$tmp/a" "$tmp/b" "$tmp/redis"; mkdir -p "$tmp/redis"
  "$1" serve --cluster-id a --data "$tmp/a" --listen 127.0.0.1:17501 --resp-listen 127.0.0.1:17579 \
    --peer b=http://127.0.0.1:17502 --peer-secret b=s --log-level warn >>"$tmp/a.log" 2>&1 & apid=$!
  "$1" serve --cluster-id b --data "$tmp/b" --listen 127.0.0.1:17502 \
    --peer a=http://127.0.0.1:17501 --peer-secret a=s --log-level warn >>"$tmp/b.log" 2>&1 & bpid=$!
  redis-server --port 17580 --appendonly yes --appendfsync always --save '' --dir "$tmp/redis" --daemonize no \
    --logfile "$tmp/redis.log" & rpid=$!
  for port in 17579 17580; do
    for _ in $(seq 100); do redis-cli -p $port ping >/dev/null 2>&1 && break; sleep 0.1; done
  done
}
stop() { kill $apid $bpid $rpid; wait $apid $bpid $rpid 2>/dev/null || true; apid= bpid= rpid=; }
# settled PID: wait until the process's CPU stops moving (b has applied
# everything a shipped), at most 20 s.
settled() {
  local prev=-1 cur
  for _ in $(seq 200); do
    cur=$(ticks "$1"); [ "$cur" = "$prev" ] && return; prev=$cur; sleep 0.1
  done
}
bench() { # PORT P: requests/s
  redis-benchmark -p "$1" -t set -n "$N" -c 64 -P "$2" -r 1000000 -d 100 -q 2>/dev/null | tr '\r' '\n' | grep -i '^set:' | tail -1 | awk '{print $2}'
}

declare -A res
for r in $(seq "$ROUNDS"); do
  for build in $BUILDS; do
    name=${build%%=*} bin=${build#*=}
    start "$bin"
    for P in 1 16; do
      settled $bpid
      a0=$(ticks $apid) b0=$(ticks $bpid)
      rps=$(bench 17579 $P)
      a1=$(ticks $apid); settled $bpid; b1=$(ticks $bpid)
      res["$name resp P$P a"]+="$(us $a0 $a1 $N) "; res["$name resp P$P b"]+="$(us $b0 $b1 $N) "; res["$name resp P$P rps"]+="$rps "
      r0=$(ticks $rpid); rrps=$(bench 17580 $P); r1=$(ticks $rpid)
      res["redis P$P cpu"]+="$(us $r0 $r1 $N) "; res["redis P$P rps"]+="$rrps "
      echo "round $r $name -P $P: resp $rps/s a $(us $a0 $a1 $N) b $(us $b0 $b1 $N) us; redis $rrps/s $(us $r0 $r1 $N) us" >&2
    done
    stop
    if [ "${HTTP:-1}" = 1 ]; then
      out=$("$bin" bench --scenarios puts --steady-for 10s 2>&1 | grep -o 'server CPU per acknowledged write [0-9.]* us at a (b: [0-9.]* us' || true)
      ha=$(echo "$out" | awk '{print $6}') hb=$(echo "$out" | awk '{print $11}')
      res["$name http a"]+="$ha " res["$name http b"]+="$hb "
      echo "round $r $name HTTP PUT: a $ha b $hb us" >&2
    fi
  done
done

echo
echo "medians of $ROUNDS rounds; server CPU us per write (a: writer, b: receiver), requests/s"
printf "%-22s" ""; for build in $BUILDS; do printf "%28s" "${build%%=*} (a / b, req/s)"; done; printf "%22s\n" "Redis 7 (us, req/s)"
for P in 1 16; do
  printf "%-22s" "RESP SET -P $P"
  for build in $BUILDS; do n=${build%%=*}
    printf "%28s" "$(echo ${res["$n resp P$P a"]} | tr ' ' '\n' | median) / $(echo ${res["$n resp P$P b"]} | tr ' ' '\n' | median), $(echo ${res["$n resp P$P rps"]} | tr ' ' '\n' | median)"
  done
  printf "%22s\n" "$(echo ${res["redis P$P cpu"]} | tr ' ' '\n' | median), $(echo ${res["redis P$P rps"]} | tr ' ' '\n' | median)"
done
if [ "${HTTP:-1}" = 1 ]; then
  printf "%-22s" "HTTP PUT (puts@64)"
  for build in $BUILDS; do n=${build%%=*}
    printf "%28s" "$(echo ${res["$n http a"]} | tr ' ' '\n' | median) / $(echo ${res["$n http b"]} | tr ' ' '\n' | median)"
  done
  echo
fi
if [ "${PG:-0}" = 1 ]; then
  echo
  echo "PostgreSQL 15 single-row INSERTs, 64 clients, 8 s (../shared/anchors/pg_logical.sh ONLY=a3):"
  ONLY=a3 A3_CLIENTS=64 A3_SECS=8 bash ../shared/anchors/pg_logical.sh 2>/dev/null | grep '^RESULT' || true
fi
