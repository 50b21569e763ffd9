#!/usr/bin/env bash
# Runs the three-node example cluster (README.md beside this file).
#
#   run.sh              start every member; Ctrl-C or SIGTERM stops them all
#   run.sh N            start member N alone (after it was stopped)
#   run.sh replace N    start a new node in place of member N, whose data was lost
#
# Run it from the repository root (task cluster does): the binary is
# $TICKETD_BIN (default bin/ticketd); data, secrets and each node's pid file
# go to ./ticketd-data.
#
# A member is started with --initial-cluster-state new only when no member
# has data yet (the cluster is new). A member without data in a cluster
# whose other members have data lost it: it is not started, since starting
# it empty would let it vote twice in a term; replace it (run.sh replace N),
# as docs/operations.md shows.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bin=${TICKETD_BIN:-bin/ticketd}
data=ticketd-data
members=(1 2 3)

say() { echo "run.sh: $*" >&2; }
die() { say "$*"; exit 1; }

[ -x "$bin" ] || die "$bin not found: build it first (task build, or go build -o bin/ticketd ./cmd/ticketd)"

# serve reads TICKETD_* variables as settings: not this script's own, and
# not secrets, which the nodes read from the files their config names.
unset TICKETD_BIN TICKETD_PEER_SECRET TICKETD_PEER_SECRET_FILE TICKETD_CONTROL_CREDENTIAL TICKETD_CONTROL_CREDENTIAL_FILE

# secret FILE: 32 random bytes in hex, created once, readable by the owner only.
secret() {
	local f="$data/$1"
	if [ ! -s "$f" ]; then
		(umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$f.tmp" && mv "$f.tmp" "$f")
		say "created $f (mode 0600)"
	fi
}
mkdir -p "$data"
chmod 700 "$data"
secret peer-secret
secret control-credential

has_data() { [ -d "$data/node$1/raft" ]; }
config() { echo "$here/node$1.yaml"; }
# control_urls [EXCEPT]: the control API of every member (but EXCEPT).
control_urls() {
	local urls="" j addr
	for j in "${members[@]}"; do
		[ "$j" = "${1:-}" ] && continue
		addr=$(sed -n 's/^control-listen: *//p' "$(config "$j")")
		urls="${urls:+$urls,}http://$addr"
	done
	echo "$urls"
}

pids=()
names=()
# start N [FLAGS...]: member N in the background, its pid in ticketd-data/nodeN.pid.
start() {
	local i=$1
	shift
	"$bin" serve --config "$(config "$i")" "$@" &
	pids+=("$!")
	names+=("$i")
	echo "$!" >"$data/node$i.pid"
}

stop_all() {
	trap - INT TERM
	local p
	for p in "${pids[@]}"; do
		[ -n "$p" ] && kill -TERM "$p" 2>/dev/null || true
	done
	for p in "${pids[@]}"; do
		[ -n "$p" ] && wait "$p" 2>/dev/null || true
	done
	exit 0
}
trap stop_all INT TERM

replacing=""
case "${1:-}" in
"")
	existing=""
	for i in "${members[@]}"; do
		has_data "$i" && existing=yes
	done
	for i in "${members[@]}"; do
		if has_data "$i"; then
			start "$i"
		elif [ -z "$existing" ]; then
			start "$i" --initial-cluster-state new
		else
			say "member $i has no data, but the others do: its data was lost. It is not started (empty, it could vote twice in a term); replace it: $0 replace $i"
		fi
	done
	;;
replace)
	n=${2:-}
	[ -n "$n" ] && [ -f "$(config "$n")" ] || die "usage: $0 replace N (N one of ${members[*]})"
	has_data "$n" && die "member $n has data in $data/node$n: it was not lost. Start it with $0 $n (or, if it is lost for good, remove $data/node$n first)"
	rm -rf "$data/node$n"
	# The new node joins through the others' control API as a learner and
	# takes over member n's addresses; the control state gives it a new id.
	start "$n" --initial-cluster= --join "$(control_urls "$n")" --replace "$n"
	replacing=$n
	;;
*)
	n=$1
	[ -f "$(config "$n")" ] || die "usage: $0 [N | replace N] (N one of ${members[*]})"
	has_data "$n" || die "member $n has no data in $data/node$n: replace it with $0 replace $n"
	start "$n"
	;;
esac
[ "${#pids[@]}" -gt 0 ] || die "no member started"

# Report each node's exit; return once none is left. The pause runs in the
# background so a signal is handled at once.
told=""
while :; do
	alive=0
	for k in "${!pids[@]}"; do
		p=${pids[$k]}
		[ -n "$p" ] || continue
		if kill -0 "$p" 2>/dev/null; then
			alive=$((alive + 1))
			continue
		fi
		status=0
		wait "$p" || status=$?
		say "node $data/node${names[$k]} exited with status $status"
		[ "$status" = 5 ] && say "it was removed from the cluster; start a new node in its place: $0 replace ${names[$k]}"
		pids[$k]=""
	done
	[ "$alive" -gt 0 ] || break
	if [ -n "$replacing" ] && [ -z "$told" ] && [ -s "$data/node$replacing/identity.json" ]; then
		id=$(sed -n 's/.*"node_id": *\([0-9]*\).*/\1/p' "$data/node$replacing/identity.json")
		inc=$(sed -n 's/.*"incarnation": *\([0-9]*\).*/\1/p' "$data/node$replacing/identity.json")
		say "the new node joined as node $id (incarnation $inc), a learner. Once it has caught up (LAG near 0 in: $bin status --watch), finish the replacement:"
		say "  TICKETD_CONTROL_CREDENTIAL_FILE=$data/control-credential $bin admin replace complete --control $(control_urls "$replacing") --old $replacing --new $id --incarnation $inc"
		told=yes
	fi
	sleep 1 &
	wait $! || true
done
