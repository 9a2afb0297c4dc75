#!/bin/bash
# Issue 29's cost: bidirectional (every key written on both sides, so every
# write of one side meets one of the other) and one-way (fresh keys), old
# build (df9be4c, before the conflict log) against new. Usage: bench29.sh [scenario...]
NAME=bench29 exec bash "$(dirname "$0")/oldnew.sh" ${*:-bidirectional oneway}
