# field NAME: the last value of NAME=value in the input, NAME whole ("launches" is not the tail of
# "host_launches"); test/bench.sh prints its rows with it, test/gpu_counts.sh checks it on the count line.
field() { sed -n "s/.*\(^\|[^A-Za-z_]\)$1=\([0-9.]*\).*/\2/p" | tail -n 1; }
