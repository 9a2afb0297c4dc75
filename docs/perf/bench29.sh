#!/bin/bash
# Issue 29's cost: bidirectional (every key written on both sides, so every
# write of one side meets one of the other) and one-way (fresh keys), old
# build (df9be4c, before the conflict log) against new (HEAD), interleaved,
# three rounds (ROUNDS="1 2 3 4 5" for five), one driver. Usage: bench29.sh [scenario...]
set -u
DRV=/tmp/rep-new
SCEN=${*:-bidirectional oneway}
mkdir -p /tmp/bench29 && cd /tmp/bench29
for r in ${ROUNDS:-1 2 3}; do
  for s in $SCEN; do
    for b in old new; do
      $DRV bench --scenarios $s --writes 400000 --json --server-binary /tmp/rep-$b > $s-$b-$r.json 2> $s-$b-$r.err
    done
  done
done
echo done > DONE
