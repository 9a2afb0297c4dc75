#!/bin/bash
# Issue 30's cost: one-way writes (fresh keys, batched) and bidirectional,
# the build before the kept hashes (main at 2746f4a: /tmp/rep-old) against
# this one (/tmp/rep-new). Usage: bench30.sh [scenario...]
NAME=bench30 exec bash "$(dirname "$0")/oldnew.sh" ${*:-oneway bidirectional}
