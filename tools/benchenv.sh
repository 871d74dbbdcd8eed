# benchenv.sh, sourced by bench.sh and ab.sh: the PostgreSQL and Redis a
# benchmark uses, and their processes (for CPU accounting and pinning).
#   PARLEY_TEST_POSTGRES_URL  default postgres://parley:parley@127.0.0.1:5432/parley?sslmode=disable
#   PARLEY_TEST_REDIS_URL     default redis://127.0.0.1:6379/0
# Point them at a PostgreSQL cluster and a Redis of their own (say port 5433
# and 6380) when anything else uses the usual ones: pg_stat_wal counts the
# whole cluster's WAL, and the CPU figures count whole processes.
base=${PARLEY_TEST_POSTGRES_URL:-postgres://parley:parley@127.0.0.1:5432/parley?sslmode=disable}
redis_url=${PARLEY_TEST_REDIS_URL:-redis://127.0.0.1:6379/0}
pg_port=$(sed -E 's#^[^@]*@[^:/]*:?([0-9]*)/.*#\1#' <<< "$base"); pg_port=${pg_port:-5432}
redis_port=$(sed -E 's#^redis://([^@]*@)?[^:/]*:?([0-9]*).*#\2#' <<< "$redis_url"); redis_port=${redis_port:-6379}
# The postmaster of the cluster on pg_port (Debian: /var/run/postgresql/VERSION-CLUSTER.pid).
pgpid=$(pg_lsclusters -h 2>/dev/null | awk -v p="$pg_port" '$3 == p { print "/var/run/postgresql/" $1 "-" $2 ".pid" }' | xargs -r head -1 2>/dev/null || true)
rdpid=$(pgrep -f "redis-server .*:$redis_port\b" | head -1 || true)
cpu="redis=$rdpid"
[ -n "$pgpid" ] && cpu="postgres=$pgpid,$cpu"
rcli() { redis-cli -p "$redis_port" "$@"; }
