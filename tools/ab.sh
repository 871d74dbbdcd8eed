#!/usr/bin/env bash
# Interleaved A/B comparison of two builds of parleyd under the same
# parley-load run: the host is shared and noisy, so the two builds take
# turns (A B B A A B …), each run against a fresh server and database,
# and the medians are compared. Loopback only; bounded by RUNS.
#
# Environment:
#   A, B      commits (or anything git rev-parse takes); B defaults to the
#             working tree ("."), A to HEAD
#   RUNS      runs of each build (default 5)
#   LOAD      parley-load arguments after the scenario's address flags
#             (default "direct -rate 10000 -duration 10s -warmup 3s -pairs 200")
#   LOAD_A, LOAD_B
#             that side's arguments instead of LOAD: with A=B the same build
#             under two loads (e.g. mixed with and without -no-features)
#   ONECORE   1: the one-core budget (parleyd, Redis and the PostgreSQL
#             postmaster with its backends all on core 0); default: only
#             parleyd on core 0 (PostgreSQL and Redis float)
#   SERVER_ENV extra environment for parleyd (e.g. "PARLEY_COMMIT_LINGER=1ms")
#   SERVER_ENV_A, SERVER_ENV_B
#             that side's instead of SERVER_ENV: with A=B the same build
#             configured two ways (e.g. with and without notifications)
#   TRANSPORT_A, TRANSPORT_B
#             tcp (default) or ws: how that side's load connects (ws: to
#             the server's ws_listen with -transport ws); with A=B the
#             same build over both transports: A=HEAD B=HEAD TRANSPORT_B=ws
#   OUT       results directory (default a new /tmp/parley-ab.XXXXXX)
#   PGSS      1: reset pg_stat_statements before each run's load and write
#             its 20 costliest statements to OUT/SIDE_N.pgss afterwards
#             (the cluster needs the extension in the database of
#             PARLEY_TEST_POSTGRES_URL)
# The load tool always comes from the working tree and runs on core 1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
A=${A:-HEAD}
B=${B:-.}
RUNS=${RUNS:-5}
LOAD=${LOAD:-"direct -rate 10000 -duration 10s -warmup 3s -pairs 200"}
LOAD_A=${LOAD_A:-$LOAD}
LOAD_B=${LOAD_B:-$LOAD}
ONECORE=${ONECORE:-0}
SERVER_ENV=${SERVER_ENV:-}
SERVER_ENV_A=${SERVER_ENV_A:-$SERVER_ENV}
SERVER_ENV_B=${SERVER_ENV_B:-$SERVER_ENV}
TRANSPORT_A=${TRANSPORT_A:-tcp}
TRANSPORT_B=${TRANSPORT_B:-tcp}
OUT=${OUT:-$(mktemp -d /tmp/parley-ab.XXXXXX)}
mkdir -p "$OUT"
echo "results in $OUT"

build() { # build REV DIR: parleyd of REV ("." = the working tree) into DIR
  local rev=$1 dir=$2
  mkdir -p "$dir"
  if [ "$rev" = "." ]; then
    go build -o "$dir/parleyd" ./cmd/parleyd
    echo "working tree at $(git rev-parse --short HEAD)$(git diff --quiet || echo ' + changes')" > "$dir/rev"
    return
  fi
  local src
  src=$(mktemp -d /tmp/parley-ab-src.XXXXXX)
  git archive "$rev" | tar -x -C "$src"
  (cd "$src" && go build -o "$dir/parleyd" ./cmd/parleyd)
  rm -rf "$src"
  git rev-parse --short "$rev" > "$dir/rev"
}
build "$A" "$OUT/A"
build "$B" "$OUT/B"
go build -o "$OUT/parley-load" ./cmd/parley-load
echo "A = $(cat "$OUT/A/rev") over $TRANSPORT_A, B = $(cat "$OUT/B/rev") over $TRANSPORT_B, load: A $LOAD_A, B $LOAD_B, one-core: $ONECORE, server env: A $SERVER_ENV_A, B $SERVER_ENV_B" | tee "$OUT/what.txt"

. "$(dirname "$0")/benchenv.sh"
# The commit and PING probes run beside every run (docs/loadtest.md).
probes="-probe-postgres $base -probe-redis $redis_url"
pin_backends() { # pin_backends CPUS: the postmaster, its children and Redis
  [ -n "$pgpid" ] || return 0
  taskset -pc "$1" "$pgpid" > /dev/null
  for c in $(pgrep -P "$pgpid"); do taskset -pc "$1" "$c" > /dev/null 2>&1 || true; done
  [ -n "$rdpid" ] && taskset -pc "$1" "$rdpid" > /dev/null
  return 0
}
pid= db= prefix=
cleanup() {
  [ -n "$pid" ] && { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
  if [ -n "$db" ]; then
    for _ in $(seq 20); do psql -q "$base" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" 2>/dev/null && break; sleep 1; done
  fi
  [ -n "$prefix" ] && { rcli --scan --pattern "$prefix*" | xargs -r -n 1000 redis-cli -p "$redis_port" del > /dev/null || true; }
  pid= db= prefix=
}
trap 'cleanup; [ "$ONECORE" = 1 ] && pin_backends 0-$(($(nproc) - 1))' EXIT
[ "$ONECORE" = 1 ] && pin_backends 0

run() { # run SIDE N
  local side=$1 n=$2
  db="parley_ab_$(date +%s)_$RANDOM"
  psql -q "$base" -c "CREATE DATABASE $db"
  local dburl="${base%%\?*}"
  dburl="${dburl%/*}/$db?sslmode=disable"
  local port=$((20000 + RANDOM % 12000))
  local transport=$TRANSPORT_A load=$LOAD_A senv=$SERVER_ENV_A
  [ "$side" = B ] && transport=$TRANSPORT_B load=$LOAD_B senv=$SERVER_ENV_B
  local addr=(-addr "127.0.0.1:$port")
  [ "$transport" = ws ] && addr=(-transport ws -addr "127.0.0.1:$((port + 2))")
  prefix="ab$RANDOM:"
  # shellcheck disable=SC2086
  env PARLEY_POSTGRES_URL="$dburl" PARLEY_REDIS_URL="$redis_url" PARLEY_REDIS_PREFIX="$prefix" PARLEY_ADMIN_TOKEN=ab PARLEY_SEND_RATE=0 PARLEY_METRICS_LISTEN= \
    PARLEY_LISTEN=127.0.0.1:$port PARLEY_ADMIN_LISTEN=127.0.0.1:$((port + 1)) PARLEY_WS_LISTEN=127.0.0.1:$((port + 2)) $senv \
    taskset -c 0 "$OUT/$side/parleyd" > "$OUT/${side}_$n.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do grep -q "parleyd ready" "$OUT/${side}_$n.log" && break; sleep 0.1; done
  [ "${PGSS:-0}" = 1 ] && psql -q -At "$base" -c "SELECT pg_stat_statements_reset()" > /dev/null
  # shellcheck disable=SC2086
  taskset -c 1 "$OUT/parley-load" $load "${addr[@]}" -admin http://127.0.0.1:$((port + 1)) -token ab \
    -server-pid "$pid" -cpu "$cpu" $probes -json "$OUT/${side}_$n.json" > "$OUT/${side}_$n.txt" 2>&1 || true
  [ "${PGSS:-0}" = 1 ] && psql -q "$base" -c "SELECT round(total_exec_time) AS ms, calls, rows, round(total_exec_time * 1000 / greatest(calls, 1)) AS us_per_call,
      wal_bytes, left(regexp_replace(query, '\s+', ' ', 'g'), 160) AS query
    FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 20" > "$OUT/${side}_$n.pgss"
  cleanup
  if [ "$ONECORE" = 1 ]; then pin_backends 0; fi
  echo "$side run $n: $(tail -3 "$OUT/${side}_$n.txt" | head -1)"
}
for n in $(seq "$RUNS"); do
  if [ $((n % 2)) = 1 ]; then run A "$n"; run B "$n"; else run B "$n"; run A "$n"; fi
done
go run ./tools/benchmd -ab "$OUT" | tee "$OUT/summary.md"
