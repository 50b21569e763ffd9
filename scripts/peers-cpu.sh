#!/usr/bin/env bash
# usage: scripts/peers-cpu.sh OUT — run beside ../shared/peers/run.sh: at each new RESULT line of
# /tmp/peers/results.txt, append the CPU time in clock ticks (utime+stime from /proc, getconf
# CLK_TCK per second) of every etcd, nats-server and ticketd process, as last read before the line
# appeared (the harness stops a system's processes right after its last line). The CPU per cycle of
# a row is the difference to the previous row of the same system divided by the row's ops (not for a
# system's first row, which includes its start-up). It forks only a subshell and sleep, four times a second,
# to stay out of the measurement. Stops after 15 minutes; stopped earlier, let it run a second past
# the harness's end, or the last row is not read.
set -u
out=$1; f=/tmp/peers/results.txt; last=-1; prev=""
ticks() {
  local e=0 n=0 t=0 s a
  for s in /proc/[0-9]*/stat; do
    { read -r -a a < "$s"; } 2>/dev/null || continue
    case ${a[1]} in
      "(etcd)") e=$((e + a[13] + a[14])) ;;
      "(nats-server)") n=$((n + a[13] + a[14])) ;;
      "(ticketd)") t=$((t + a[13] + a[14])) ;;
    esac
  done
  echo "etcd=$e nats=$n ticketd=$t"
}
end=$((SECONDS + 900))
while [ $SECONDS -lt $end ]; do
  cur=$(ticks)
  lines=()
  [ -r "$f" ] && mapfile -t lines < "$f"
  n=${#lines[@]}
  if [ "$n" != "$last" ]; then
    row=""
    ((n > 0)) && row=${lines[n-1]}
    echo "$n ${prev:-$cur} $row" >> "$out"
    last=$n
  fi
  prev=$cur
  sleep 0.25
done
