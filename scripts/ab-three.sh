#!/usr/bin/env bash
# usage: scripts/ab-three.sh NAME BIN MODE [VAR=value...] — 3 local nodes of BIN (fsync on, ports
# 1870x, env VAR=value), a 4-s warm-up, then `ticketd bench` (AB_BENCH_BIN, default BIN) at 16
# and 64 clients for 10 s each; prints cycles/s, acquire latency, node CPU per cycle and the leader's
# (node 1, by placement) entries per fsync. Interleave two binaries' runs to compare them. (The bench
# binary's variable is not TICKETD_*: serve reads every TICKETD_* variable as config and refuses unknown ones.)
set -u
name=$1; bin=$2; mode=$3; shift 3
bench=${AB_BENCH_BIN:-$bin}
url=nats://127.0.0.1:1870${AB_NODE:-1} # AB_NODE: the node the bench connects to (node 1 leads, by placement)
export TICKETD_PEER_SECRET=ab-three-peer-secret-0123456789
base=${TMPDIR:-/tmp}/ab-three-$name; rm -rf "$base"; mkdir -p "$base"
pids=()
for i in 1 2 3; do
  env "$@" "$bin" serve --id $i --data "$base/D$i" --nats-listen 127.0.0.1:1870$i --nats-cluster-listen 127.0.0.1:1873$i \
    --nats-routes 127.0.0.1:18731,127.0.0.1:18732,127.0.0.1:18733 --peer-listen 127.0.0.1:1871$i \
    --initial-cluster 1=127.0.0.1:18711,2=127.0.0.1:18712,3=127.0.0.1:18713 --initial-cluster-state new \
    --metrics-listen 127.0.0.1:1875$i --log-level warn > "$base/n$i.log" 2>&1 &
  pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null' EXIT
P=$(IFS=,; echo "${pids[*]}")
"$bench" bench --nats "$url" --clients 16 --mode "$mode" --duration 4s --cpu-pids none >/dev/null 2>&1 || sleep 3
fsyncs() { curl -s http://127.0.0.1:18751/metrics | awk '/^ticketd_fsync_entries_sum/{s=$2} /^ticketd_fsync_entries_count/{c=$2} END{print s+0, c+0}'; }
for c in 16 64; do
  read -r s0 c0 < <(fsyncs)
  out=$("$bench" bench --nats "$url" --clients $c --mode "$mode" --duration 10s --cpu-pids "$P" 2>&1)
  read -r s1 c1 < <(fsyncs)
  epf=$(awk -v a="$s0" -v b="$s1" -v x="$c0" -v y="$c1" 'BEGIN{ if (y>x) printf "%.2f", (b-a)/(y-x); else print "na"}')
  echo "$name $mode c=$c load=$(cut -d' ' -f1 /proc/loadavg) $(echo "$out" | grep -o '([0-9]* cycles/s)') $(echo "$out" | grep -o 'acquire ms: p50=[0-9.]* p90=[0-9.]* p99=[0-9.]*') $(echo "$out" | grep -o '= [0-9]* us/cycle') $(echo "$out" | grep -o 'errors=[0-9]*') leader_entries_per_fsync=$epf"
done
