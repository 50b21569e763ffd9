#!/usr/bin/env bash
# usage: scripts/bench-cluster.sh N — start N local nodes on 127.0.0.1 (fsync on), run
# `ticketd bench` for 10s through node 1, print fsyncs and entries per fsync of every node.
# Build first: go build -o bin/ticketd ./cmd/ticketd
set -eu
N=$1; B=${TICKETD_BIN:-bin/ticketd}; base=$((15000+N*100))
members=""; routes=""
for i in $(seq 1 $N); do members="$members${members:+,}$i=127.0.0.1:$((base+10+i))"; routes="$routes${routes:+,}127.0.0.1:$((base+30+i))"; done
export TICKETD_PEER_SECRET=bench-secret-0123456789
for i in $(seq 1 $N); do rm -rf ${TMPDIR:-/tmp}/ticketd-bench-$N-$i
  $B serve --id $i --data ${TMPDIR:-/tmp}/ticketd-bench-$N-$i --nats-listen 127.0.0.1:$((base+i)) --nats-cluster-listen 127.0.0.1:$((base+30+i)) --nats-routes $routes \
   --peer-listen 127.0.0.1:$((base+10+i)) --initial-cluster $members --initial-cluster-state new --metrics-listen 127.0.0.1:$((base+50+i)) --log-level warn > ${TMPDIR:-/tmp}/ticketd-bench-$N-$i.log 2>&1 &
done
trap 'kill $(jobs -p) 2>/dev/null' EXIT
for t in $(seq 1 100); do $B status --nats nats://127.0.0.1:$((base+1)) --timeout 1s 2>/dev/null | grep -q '"leader":[1-9]' && break; sleep 0.1; done
sleep 1
$B bench --nats nats://127.0.0.1:$((base+1)) --clients 16 --keys 1000 --duration 10s
for i in $(seq 1 $N); do curl -s 127.0.0.1:$((base+50+i))/metrics | awk -v n=$i '/^ticketd_fsync_entries_(sum|count)/{v[$1]=$2} /^ticketd_is_leader /{l=$2} END{printf "node %d leader=%s fsyncs=%d entries/fsync=%.1f\n", n, l, v["ticketd_fsync_entries_count"], v["ticketd_fsync_entries_sum"]/(v["ticketd_fsync_entries_count"]+1e-9)}'; done
