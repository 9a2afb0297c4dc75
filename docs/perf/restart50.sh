#!/usr/bin/env bash
# Issue 50: restart time after a crash with a 1,000,000-write backlog. For
# each build: a node alone whose only peer is down takes N SETs through its
# RESP door (-P 16, random keys of a million), is killed with SIGKILL, and
# is started again; printed: the seconds until it answers PING and until a
# SET is acknowledged (the write path ready: its raft log replayed, its
# stream's backlog loaded). Run from the repository root:
#   BUILDS="old=/tmp/rep-old new=/tmp/rep-new" bash docs/perf/restart50.sh
set -euo pipefail
N=${N:-1000000}
BUILDS=${BUILDS:-new=/tmp/rep-new}
tmp=$(mktemp -d)
apid=
cleanup() { [ -n "$apid" ] && kill -9 $apid 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
now() { date +%s.%N; }
for build in $BUILDS; do
  name=${build%%=*} bin=${build#*=}
  rm -rf "$tmp/a"
  start() {
    "$bin" serve --cluster-id a --data "$tmp/a" --listen 127.0.0.1:17701 --resp-listen 127.0.0.1:17779 \
      --peer b=http://127.0.0.1:17702 --peer-secret b=s --log-level warn >>"$tmp/a.log" 2>&1 & apid=$!
  }
  start
  for _ in $(seq 100); do redis-cli -p 17779 ping >/dev/null 2>&1 && break; sleep 0.1; done
  redis-benchmark -p 17779 -t set -n "$N" -c 64 -P 16 -r 1000000 -d 100 -q >/dev/null 2>&1
  kill -9 $apid; wait $apid 2>/dev/null || true
  t0=$(now); start
  until redis-cli -p 17779 ping 2>/dev/null | grep -q PONG; do sleep 0.01; done
  t1=$(now)
  until redis-cli -p 17779 set restart:probe x 2>/dev/null | grep -q OK; do sleep 0.01; done
  t2=$(now)
  echo "$name: PING after $(echo "$t1 - $t0" | bc) s, SET acknowledged after $(echo "$t2 - $t0" | bc) s ($(du -sh "$tmp/a" | cut -f1) on disk)"
  kill $apid; wait $apid 2>/dev/null || true; apid=
done
