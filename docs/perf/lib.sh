# Shared by the scripts of docs/perf (sourced): a process's CPU and medians.
hz=$(getconf CLK_TCK)
# ticks PID: the process's user+system CPU, in clock ticks.
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
# median: the median of the numbers on stdin, one a line ("-" of none).
median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) print "-"; else print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
# us T0 T1 N: microseconds of CPU per item between two ticks readings.
us() { awk -v a="$1" -v b="$2" -v hz="$hz" -v n="$3" 'BEGIN {printf "%.1f", (b-a)/hz*1e6/n}'; }
