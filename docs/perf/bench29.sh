#!/bin/bash
# Issue 29's cost: bidirectional (every key written on both sides, so every
# write of one side meets one of the other), old build (df9be4c, before the
# conflict log) against new (HEAD), interleaved, three rounds, one driver.
set -u
DRV=/tmp/rep-new
mkdir -p /tmp/bench29 && cd /tmp/bench29
for r in 1 2 3; do
  for b in old new; do
    $DRV bench --scenarios bidirectional --writes 400000 --json --server-binary /tmp/rep-$b > bidi-$b-$r.json 2> bidi-$b-$r.err
  done
done
echo done > DONE
