#!/usr/bin/env bash
# The standard benchmark suite behind `make bench`: reference ceilings
# (Redis INCR, PostgreSQL inserts), the codec, and durable 1:1 sends with
# parley-load at a few rates, RUNS times each; then BENCHMARKS.md.
# Bounded: about (rates × RUNS × (16 s + WARMUP)) + 1 minute. Loopback only.
#
# Environment: RATES (default "5000 10000 20000"), RUNS (default 3),
# WARMUP (default 3s: each run first sends at its rate this long, left out
# of its figures), OUT (default BENCHMARKS.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
RATES=${RATES:-"5000 10000 20000"}
RUNS=${RUNS:-3}
WARMUP=${WARMUP:-3s}
OUT=${OUT:-BENCHMARKS.md}
res=$(mktemp -d /tmp/parley-bench.XXXXXX)
bin=$res/bin
mkdir -p "$bin"
echo "results in $res"

go build -o "$bin/parleyd" ./cmd/parleyd
go build -o "$bin/parley-load" ./cmd/parley-load

{
  echo "cores: $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "memory: $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "$(go version)"
  echo "PostgreSQL: $(psql --version | awk '{print $3}'), Redis: $(redis-server --version | awk '{print $3}' | cut -d= -f2)"
  echo "kernel: $(uname -r)"
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD)"
} > "$res/machine.txt"

echo "== reference ceilings"
redis-benchmark -t incr -n 200000 -q > "$res/redis_incr_p1.txt" 2>&1
redis-benchmark -t incr -n 1000000 -P 16 -q > "$res/redis_incr_p16.txt" 2>&1
redis-cli del counter:__rand_int__ > /dev/null
go test -run '^$' -bench InsertCeiling -benchtime 2s -count 3 ./store/ > "$res/pg_insert.txt" 2>&1

echo "== codec"
go test -run '^$' -bench . -benchtime 1s -count 3 ./wire/ > "$res/codec.txt" 2>&1

echo "== parley-load direct"
# A fresh database for the server, so runs do not slow down as earlier
# runs' rows pile up; dropped at the end.
base=${PARLEY_TEST_POSTGRES_URL:-postgres://parley:parley@127.0.0.1:5432/parley?sslmode=disable}
db="parley_bench_$(date +%s)"
psql -q "$base" -c "CREATE DATABASE $db"
dburl="${base%%\?*}"
dburl="${dburl%/*}/$db?sslmode=disable"
port=$((20000 + RANDOM % 12000))
admin=$((port + 1))
prefix="bench$RANDOM:"
PARLEY_POSTGRES_URL=$dburl PARLEY_REDIS_PREFIX=$prefix PARLEY_ADMIN_TOKEN=bench PARLEY_SEND_RATE=0 PARLEY_METRICS_LISTEN= \
  PARLEY_LISTEN=127.0.0.1:$port PARLEY_ADMIN_LISTEN=127.0.0.1:$admin \
  taskset -c 0 "$bin/parleyd" > "$res/parleyd.log" 2>&1 &
pid=$!
# An autovacuum worker still in the database makes the drop fail (only a
# superuser may end it): try for a while.
drop_db() {
  for _ in $(seq 20); do
    psql -q "$base" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" 2>/dev/null && return 0
    sleep 1
  done
  echo "could not drop database $db" >&2
}
# parleyd's keys (under its own prefix) go too.
drop_keys() {
  redis-cli --scan --pattern "$prefix*" | xargs -r -n 1000 redis-cli del > /dev/null || true
}
trap 'kill $pid 2>/dev/null || true; sleep 1; drop_db; drop_keys' EXIT
for _ in $(seq 100); do
  grep -q "parleyd ready" "$res/parleyd.log" && break
  sleep 0.1
done
pgpid=$(head -1 /var/run/postgresql/*-main.pid 2>/dev/null || true)
rdpid=$(pgrep -o redis-server || true)
cpu="redis=$rdpid"
[ -n "$pgpid" ] && cpu="postgres=$pgpid,$cpu"
cmd="taskset -c 1 parley-load direct -addr 127.0.0.1:$port -admin http://127.0.0.1:$admin -token bench -rate RATE -duration 10s -warmup $WARMUP -pairs 200 -server-pid PARLEYD_PID -cpu $cpu -json FILE"
{
  echo "PARLEY_POSTGRES_URL=<a fresh database> PARLEY_SEND_RATE=0 taskset -c 0 parleyd   # per-device rate limit off; default config otherwise"
  echo "$cmd"
} > "$res/commands.txt"
for rate in $RATES; do
  for run in $(seq "$RUNS"); do
    echo "-- rate $rate run $run"
    taskset -c 1 "$bin/parley-load" direct -addr 127.0.0.1:$port -admin http://127.0.0.1:$admin -token bench \
      -rate "$rate" -duration 10s -warmup "$WARMUP" -pairs 200 -server-pid $pid -cpu "$cpu" -live lines \
      -json "$res/direct_${rate}_${run}.json" > "$res/direct_${rate}_${run}.txt" 2>&1 || true
    tail -3 "$res/direct_${rate}_${run}.txt" | head -1
  done
done
kill $pid
wait $pid 2>/dev/null || true
drop_db
drop_keys
trap - EXIT

cp tools/bench-extra.md "$res/extra.md"
go run ./tools/benchmd -dir "$res" > "$OUT"
echo "wrote $OUT"
