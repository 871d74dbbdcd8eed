#!/usr/bin/env bash
# The standard benchmark suite behind `make bench`: reference ceilings
# (Redis INCR, PostgreSQL inserts), the codec, and parley-load: durable 1:1
# sends at a few rates, with many conversations, on the one-core budget,
# and the realistic mix; RUNS times each, with the commit and PING probes
# beside every run; then BENCHMARKS.md. Bounded: about 10 minutes with the
# defaults. Loopback only.
#
# Environment: RATES (direct, default "5000 10000 20000"), PAIRS (the
# many-conversations rows at 5,000/s, default "1000 5000"), ONECORE_RATES
# (default "10000 16000"), MIXED_RATES (default "2000 5000"), RUNS
# (default 3), WARMUP (default 3s: each run first sends at its rate this
# long, left out of its figures), SECTIONS (default "direct pairs onecore
# mixed"), OUT (default BENCHMARKS.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
RATES=${RATES:-"5000 10000 20000"}
PAIRS=${PAIRS:-"1000 5000"}
ONECORE_RATES=${ONECORE_RATES:-"10000 16000"}
MIXED_RATES=${MIXED_RATES:-"2000 5000"}
RUNS=${RUNS:-3}
WARMUP=${WARMUP:-3s}
SECTIONS=${SECTIONS:-"direct pairs onecore mixed"}
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

. "$(dirname "$0")/benchenv.sh"

echo "== reference ceilings"
redis-benchmark -p "$redis_port" -t incr -n 200000 -q > "$res/redis_incr_p1.txt" 2>&1
redis-benchmark -p "$redis_port" -t incr -n 1000000 -P 16 -q > "$res/redis_incr_p16.txt" 2>&1
rcli del counter:__rand_int__ > /dev/null
go test -run '^$' -bench InsertCeiling -benchtime 2s -count 3 ./store/ > "$res/pg_insert.txt" 2>&1

echo "== codec"
go test -run '^$' -bench . -benchtime 1s -count 3 ./wire/ > "$res/codec.txt" 2>&1

probes="-probe-postgres $base -probe-redis $redis_url"

# pin CPUS: PostgreSQL (the postmaster and its children; later backends
# inherit its mask) and Redis on CPUS.
pin() {
  [ -n "$pgpid" ] && taskset -pc "$1" "$pgpid" > /dev/null
  [ -n "$pgpid" ] && for c in $(pgrep -P "$pgpid"); do taskset -pc "$1" "$c" > /dev/null 2>&1 || true; done
  [ -n "$rdpid" ] && taskset -pc "$1" "$rdpid" > /dev/null
  return 0
}

# A fresh database and Redis prefix for each server, so runs do not slow
# down as earlier runs' rows pile up; dropped when it stops.
pid= db= prefix= port= admin=
serve() { # serve NAME: start parleyd on core 0
  db="parley_bench_$(date +%s)_$RANDOM"
  psql -q "$base" -c "CREATE DATABASE $db"
  local dburl="${base%%\?*}"
  dburl="${dburl%/*}/$db?sslmode=disable"
  port=$((20000 + RANDOM % 12000))
  admin=$((port + 1))
  prefix="bench$RANDOM:"
  PARLEY_POSTGRES_URL=$dburl PARLEY_REDIS_URL=$redis_url PARLEY_REDIS_PREFIX=$prefix PARLEY_ADMIN_TOKEN=bench PARLEY_SEND_RATE=0 PARLEY_METRICS_LISTEN= \
    PARLEY_LISTEN=127.0.0.1:$port PARLEY_ADMIN_LISTEN=127.0.0.1:$admin \
    taskset -c 0 "$bin/parleyd" > "$res/parleyd_$1.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    grep -q "parleyd ready" "$res/parleyd_$1.log" && break
    sleep 0.1
  done
}
# An autovacuum worker still in the database makes the drop fail (only a
# superuser may end it): try for a while.
unserve() {
  [ -n "$pid" ] || return 0
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  for _ in $(seq 20); do
    psql -q "$base" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" 2>/dev/null && break
    sleep 1
  done
  rcli --scan --pattern "$prefix*" | xargs -r -n 1000 redis-cli -p "$redis_port" del > /dev/null || true
  pid=
}
trap 'unserve; pin 0-$(($(nproc) - 1))' EXIT
# load NAME ARGS…: one parley-load run against the running server.
load() {
  local name=$1
  shift
  echo "-- $name"
  # shellcheck disable=SC2086
  taskset -c 1 "$bin/parley-load" "$@" -addr 127.0.0.1:$port -admin http://127.0.0.1:$admin -token bench \
    -server-pid $pid -cpu "$cpu" $probes -live lines -json "$res/$name.json" > "$res/$name.txt" 2>&1 || true
  grep -E "^(sent |send_ok_ms|pg_commit_ms|wal )" "$res/$name.txt" || tail -3 "$res/$name.txt"
}

# each NAME KEYS ARGS…: for each key of KEYS, a fresh server and RUNS
# runs of parley-load ARGS, "{}" in them replaced by the key.
each() {
  local name=$1 keys=$2
  shift 2
  for key in $keys; do
    serve "${name}_$key"
    for run in $(seq "$RUNS"); do
      load "${name}_${key}_${run}" "${@//\{\}/$key}"
    done
    unserve
  done
}

common="-body-size 100 -cpu postgres=PGPID,redis=RPID -server-pid PARLEYD_PID -probe-postgres URL -probe-redis URL -json FILE"
{
  echo "PARLEY_POSTGRES_URL=<a fresh database> PARLEY_SEND_RATE=0 taskset -c 0 parleyd   # per-device rate limit off; default config otherwise"
} > "$res/commands.txt"

for section in $SECTIONS; do
  case $section in
  direct)
    echo "== parley-load direct"
    serve direct
    for rate in $RATES; do
      for run in $(seq "$RUNS"); do
        load "direct_${rate}_${run}" direct -rate "$rate" -duration 10s -warmup "$WARMUP" -pairs 200
      done
    done
    unserve
    echo "taskset -c 1 parley-load direct -rate RATE -duration 10s -warmup $WARMUP -pairs 200 $common   # one server, all rates" >> "$res/commands.txt"
    ;;
  pairs)
    echo "== parley-load direct, many conversations"
    each pairs "$PAIRS" direct -rate 5000 -duration 10s -pairs {}
    echo "taskset -c 1 parley-load direct -rate 5000 -duration 10s -pairs PAIRS $common   # a fresh server per pair count" >> "$res/commands.txt"
    ;;
  onecore)
    echo "== parley-load direct, one-core budget"
    pin 0
    each onecore "$ONECORE_RATES" direct -rate {} -duration 10s -warmup "$WARMUP" -pairs 200
    pin "0-$(($(nproc) - 1))"
    echo "taskset -pc 0 POSTMASTER (and its children), taskset -pc 0 REDIS; taskset -c 1 parley-load direct -rate RATE -duration 10s -warmup $WARMUP -pairs 200 $common   # a fresh server per rate" >> "$res/commands.txt"
    ;;
  mixed)
    echo "== parley-load mixed"
    each mixed "$MIXED_RATES" mixed -rate {} -duration 20s -warmup "$WARMUP"
    echo "taskset -c 1 parley-load mixed -rate RATE -duration 20s -warmup $WARMUP $common   # a fresh server per rate" >> "$res/commands.txt"
    ;;
  esac
done
trap - EXIT
pin "0-$(($(nproc) - 1))"

cp tools/bench-extra.md "$res/extra.md"
go run ./tools/benchmd -dir "$res" > "$OUT"
echo "wrote $OUT"
