#!/bin/bash
# Issue 30's cost: one-way writes (fresh keys, batched) and bidirectional,
# the build before the kept hashes (main at 2746f4a: /tmp/rep-old) against
# this one (/tmp/rep-new), interleaved, three rounds (ROUNDS="1 2 3 4 5"
# for five), one driver. Usage: bench30.sh [scenario...]
set -u
DRV=/tmp/rep-new
SCEN=${*:-oneway bidirectional}
mkdir -p /tmp/bench30 && cd /tmp/bench30
for r in ${ROUNDS:-1 2 3}; do
  for s in $SCEN; do
    for b in old new; do
      $DRV bench --scenarios $s --writes 400000 --json --server-binary /tmp/rep-$b > $s-$b-$r.json 2> $s-$b-$r.err
    done
  done
done
echo done > DONE
