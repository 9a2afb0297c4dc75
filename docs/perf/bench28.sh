#!/bin/bash
# Interleaved: old build (6123e15, before issue 28) vs new (HEAD), three rounds.
set -u
OLD=/tmp/repl-old NEW=/tmp/repl-new DRV=/tmp/repl-new
cd /tmp/bench28
for r in 1 2 3; do
  for b in old new; do
    bin=/tmp/repl-$b
    $DRV bench --scenarios oneway --writes 1000000 --json --server-binary $bin > fixed-$b-$r.json 2> fixed-$b-$r.err
  done
  for v in old:none new:none new:zstd; do
    b=${v%%:*}; c=${v##*:}
    extra=""
    [ "$c" = zstd ] && extra="--peer-compression zstd"
    $DRV bench --scenarios oneway --writes 300000 --values json $extra --json --server-binary /tmp/repl-$b > json-$b-$c-$r.json 2> json-$b-$c-$r.err
  done
done
echo done > DONE
