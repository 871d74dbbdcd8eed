#!/usr/bin/env bash
# redis-cluster.sh: start or stop a local 6-node Redis Cluster (3 masters,
# each with one replica) for development and `make test-cluster`.
#
#   tools/redis-cluster.sh start [BASE_PORT]   prints the seeds on stdout:
#                                              127.0.0.1:7101,…,127.0.0.1:7106
#   tools/redis-cluster.sh stop [BASE_PORT]
#
# The nodes listen on 127.0.0.1, ports BASE_PORT … BASE_PORT+5 (default 7101,
# or PARLEY_CLUSTER_PORT; the cluster bus uses port+10000, so keep the base
# below 55530), keep no data on disk, and write their files and logs under
# /tmp/parley-redis-cluster-BASE_PORT. `start` is idempotent: a healthy
# cluster on those ports is reused. Every wait is bounded by
# PARLEY_WAIT_SECONDS (30). Point parleyd at the cluster with
# PARLEY_REDIS_CLUSTER=<the seeds>.
set -euo pipefail

WAIT_SECONDS=${PARLEY_WAIT_SECONDS:-30}
cmd=${1:-}
base=${2:-${PARLEY_CLUSTER_PORT:-7101}}
dir=/tmp/parley-redis-cluster-$base
ports=()
for i in 0 1 2 3 4 5; do ports+=($((base + i))); done
addrs=()
for p in "${ports[@]}"; do addrs+=("127.0.0.1:$p"); done
seeds=$(
	IFS=,
	echo "${addrs[*]}"
)

say() { printf 'redis-cluster: %s\n' "$*" >&2; }
die() {
	say "error: $*"
	exit 1
}

cli() { timeout 5 redis-cli -h 127.0.0.1 "$@" 2>/dev/null; }

# healthy: every node says cluster_state:ok and knows six nodes, three of
# them replicas whose link to their master is up.
healthy() {
	local p info nodes
	for p in "${ports[@]}"; do
		info=$(cli -p "$p" cluster info) || return 1
		[[ $info == *cluster_state:ok* && $info == *cluster_known_nodes:6* ]] || return 1
		nodes=$(cli -p "$p" cluster nodes) || return 1
		[[ $(grep -c ' slave ' <<<"$(sed 's/,/ /g' <<<"$nodes")") -eq 3 ]] || return 1
		[[ $nodes != *fail* ]] || return 1
		if [[ $(cli -p "$p" info replication) == *role:slave* ]]; then
			[[ $(cli -p "$p" info replication) == *master_link_status:up* ]] || return 1
		fi
	done
}

wait_for() {
	local what=$1
	shift
	local deadline=$((SECONDS + WAIT_SECONDS))
	until "$@"; do
		((SECONDS < deadline)) || die "$what not reached after ${WAIT_SECONDS}s; logs in $dir"
		sleep 0.2
	done
}

all_ping() {
	local p
	for p in "${ports[@]}"; do
		[[ $(cli -p "$p" ping) == PONG ]] || return 1
	done
}

stop() {
	local f pid
	shopt -s nullglob
	for f in "$dir"/redis-*.pid; do
		pid=$(cat "$f" 2>/dev/null || true)
		[[ -n $pid ]] && kill "$pid" 2>/dev/null || true
	done
	for f in "$dir"/redis-*.pid; do
		pid=$(cat "$f" 2>/dev/null || true)
		for _ in $(seq 50); do
			[[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		[[ -n $pid ]] && kill -9 "$pid" 2>/dev/null || true
	done
	rm -rf "$dir"
}

start() {
	command -v redis-server >/dev/null || die "redis-server is not installed (\`make services\` installs it)"
	command -v redis-cli >/dev/null || die "redis-cli is not installed (Debian package redis-tools)"
	((base + 5 < 55536)) || die "base port $base too high: the cluster bus needs port+10000"
	if healthy; then
		say "reusing the healthy cluster on ports ${ports[0]}-${ports[5]}"
		echo "$seeds"
		return
	fi
	stop # leftovers of ours
	local p
	for p in "${ports[@]}"; do
		if [[ $(cli -p "$p" ping) == PONG ]]; then
			die "port $p answers PING but is not part of a healthy cluster of ours; choose another BASE_PORT"
		fi
	done
	mkdir -p "$dir"
	for p in "${ports[@]}"; do
		redis-server --port "$p" --bind 127.0.0.1 \
			--cluster-enabled yes --cluster-config-file "$dir/nodes-$p.conf" \
			--cluster-node-timeout 2000 \
			--dir "$dir" --dbfilename "dump-$p.rdb" --save '' --appendonly no \
			--repl-diskless-sync-delay 0 --repl-ping-replica-period 1 \
			--daemonize yes --logfile "$dir/redis-$p.log" --pidfile "$dir/redis-$p.pid" ||
			die "could not start redis-server on port $p; see $dir/redis-$p.log"
	done
	wait_for "PING on every node" all_ping
	if ! timeout "$WAIT_SECONDS" redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1; then
		tail -n 20 "$dir/create.log" >&2
		die "redis-cli --cluster create failed"
	fi
	wait_for "a healthy cluster" healthy
	say "started a Redis Cluster on 127.0.0.1 ports ${ports[0]}-${ports[5]} (files in $dir)"
	echo "$seeds"
}

case $cmd in
start) start ;;
stop)
	stop
	say "stopped the cluster on ports ${ports[0]}-${ports[5]}"
	;;
*)
	echo "usage: $0 start|stop [BASE_PORT]" >&2
	exit 2
	;;
esac
