#!/bin/bash
# Old build (/tmp/rep-old) against new (/tmp/rep-new), interleaved, under one
# driver (the new binary): `replicator bench --scenarios S --writes 400000
# --json --server-binary OLD|NEW`, three rounds (ROUNDS="1 2 3 4 5" for
# five). Results in /tmp/$NAME. Usage: NAME=bench30 oldnew.sh scenario...
set -u
DIR=/tmp/${NAME:?NAME names the run}
mkdir -p "$DIR" && cd "$DIR"
for r in ${ROUNDS:-1 2 3}; do
  for s in "$@"; do
    for b in old new; do
      /tmp/rep-new bench --scenarios $s --writes 400000 --json --server-binary /tmp/rep-$b > $s-$b-$r.json 2> $s-$b-$r.err
    done
  done
done
echo done > DONE
