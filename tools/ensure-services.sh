#!/usr/bin/env bash
# ensure-services.sh: make sure the PostgreSQL and Redis that Parley (and its
# tests) use are installed, running and set up on this Debian machine.
#
#   PostgreSQL: postgres://parley:parley@127.0.0.1:5432/parley?sslmode=disable
#               (role parley, password parley, LOGIN CREATEDB; database parley)
#   Redis:      redis://127.0.0.1:6379/0 (no persistence, logs to /tmp)
#
# Idempotent, and quick when everything is already up. Prints one line per
# thing it did, then "services ready: postgres=... redis=...".
#
# It uses Debian's packaged cluster (pg_lsclusters) and creates the role with
# `runuser -u postgres -- psql` over the local socket (peer auth). Nothing is
# added to pg_hba.conf: Debian's default already allows password (scram)
# logins over TCP on 127.0.0.1, which is what the parley role uses.
#
# Environment:
#   PARLEY_POSTGRES_URL or PARLEY_TEST_POSTGRES_URL set: you bring your own
#       PostgreSQL; the script does not install, start or configure it.
#   PARLEY_REDIS_URL or PARLEY_TEST_REDIS_URL set: same for Redis.
#   PARLEY_WAIT_SECONDS: how long to wait for a server to come up (30).
set -euo pipefail

PG_ROLE=parley
PG_PASSWORD=parley
PG_DB=parley
REDIS_PORT=6379
WAIT_SECONDS=${PARLEY_WAIT_SECONDS:-30}

say() { printf 'ensure-services: %s\n' "$*"; }
die() { printf 'ensure-services: error: %s\n' "$*" >&2; exit 1; }

# Privileged steps go through sudo unless we are root.
SUDO=()
if [[ $EUID -ne 0 ]]; then
	command -v sudo >/dev/null 2>&1 || die "not root and sudo is not installed; run this script as root"
	SUDO=(sudo)
fi

# mask_url prints a URL with its password masked.
mask_url() { sed -E 's#(://[^:/@]*):[^@/]*@#\1:***@#' <<<"$1"; }

APT_UPDATED=0
APT_LOG=$(mktemp /tmp/parley-apt.XXXXXX.log)
trap 'rm -f "$APT_LOG"' EXIT
apt_install() {
	local pkgs=("$@")
	if [[ $APT_UPDATED -eq 0 ]]; then
		if ! "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$APT_LOG" 2>&1; then
			tail -n 30 "$APT_LOG" >&2
			die "apt-get update failed"
		fi
		APT_UPDATED=1
	fi
	if ! "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
		-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
		"${pkgs[@]}" >>"$APT_LOG" 2>&1; then
		tail -n 30 "$APT_LOG" >&2
		die "apt-get install ${pkgs[*]} failed"
	fi
	say "installed ${pkgs[*]} (apt)"
}

# as_postgres runs a command as the postgres OS user from a directory it can read.
as_postgres() { (cd / && "${SUDO[@]}" runuser -u postgres -- "$@"); }

# ---------------------------------------------------------------- PostgreSQL

ensure_postgres() {
	local bins=(/usr/lib/postgresql/*/bin/postgres)
	if [[ ! -x ${bins[0]} ]] || ! command -v pg_lsclusters >/dev/null 2>&1; then
		apt_install postgresql
	fi

	# Pick the cluster: the one on port 5432 if any, else the newest.
	# pg_lsclusters -h: "15 main 5432 down postgres /var/lib/... /var/log/..."
	local line ver name port status
	line=$(pg_lsclusters -h 2>/dev/null | awk '$3 == 5432' | sort -k1,1V | tail -n 1)
	[[ -n $line ]] || line=$(pg_lsclusters -h 2>/dev/null | sort -k1,1V | tail -n 1)
	if [[ -z $line ]]; then
		ver=$(basename "$(dirname "$(dirname "$(printf '%s\n' /usr/lib/postgresql/*/bin/postgres | sort -V | tail -n 1)")")")
		"${SUDO[@]}" pg_createcluster "$ver" main >/dev/null
		say "created postgresql cluster $ver/main"
		line=$(pg_lsclusters -h | awk -v v="$ver" '$1 == v && $2 == "main"')
	fi
	read -r ver name port status _ <<<"$line"

	if [[ $status != online* ]]; then
		"${SUDO[@]}" pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" start ||
			die "could not start postgresql $ver/$name; see /var/log/postgresql/postgresql-$ver-$name.log"
		say "started postgresql $ver/$name on port $port"
	fi

	local deadline=$((SECONDS + WAIT_SECONDS))
	until pg_isready -q -h 127.0.0.1 -p "$port" -t 1 && pg_isready -q -p "$port" -t 1; do
		((SECONDS < deadline)) || die "postgresql $ver/$name on port $port not accepting connections after ${WAIT_SECONDS}s"
		sleep 0.2
	done

	local psql=(psql -X -q -v ON_ERROR_STOP=1 -p "$port" -d postgres)
	local state role_ok db_ok
	state=$(as_postgres "${psql[@]}" -At -F ' ' -c "
		SELECT coalesce((SELECT CASE WHEN rolcanlogin AND rolcreatedb THEN 'ok' ELSE 'attrs' END
		                 FROM pg_roles WHERE rolname = '$PG_ROLE'), 'missing'),
		       EXISTS (SELECT 1 FROM pg_database WHERE datname = '$PG_DB')")
	read -r role_ok db_ok <<<"$state"
	case $role_ok in
	missing)
		as_postgres "${psql[@]}" -c "CREATE ROLE $PG_ROLE LOGIN CREATEDB PASSWORD '$PG_PASSWORD'"
		say "created postgresql role $PG_ROLE (LOGIN CREATEDB, password $PG_PASSWORD)"
		;;
	attrs)
		as_postgres "${psql[@]}" -c "ALTER ROLE $PG_ROLE LOGIN CREATEDB"
		say "granted LOGIN CREATEDB to postgresql role $PG_ROLE"
		;;
	esac
	if [[ $db_ok != t ]]; then
		as_postgres "${psql[@]}" -c "CREATE DATABASE $PG_DB OWNER $PG_ROLE"
		say "created postgresql database $PG_DB"
	fi

	# Check the URL the server and the tests use: password login over TCP.
	PG_URL="postgres://$PG_ROLE:$PG_PASSWORD@127.0.0.1:$port/$PG_DB?sslmode=disable"
	local tcp=(env PGPASSWORD="$PG_PASSWORD" PGCONNECT_TIMEOUT=5 psql -X -q -At -w
		-h 127.0.0.1 -p "$port" -U "$PG_ROLE" -d "$PG_DB" -c 'SELECT 1')
	if ! "${tcp[@]}" >/dev/null 2>&1; then
		# The role existed with another password: reset it to the documented one.
		as_postgres "${psql[@]}" -c "ALTER ROLE $PG_ROLE PASSWORD '$PG_PASSWORD'"
		say "reset password of postgresql role $PG_ROLE to '$PG_PASSWORD'"
		if ! "${tcp[@]}" >/dev/null; then
			die "cannot log in as $PG_ROLE over TCP on 127.0.0.1:$port; check the host lines of $(as_postgres "${psql[@]}" -At -c 'SHOW hba_file') (Debian's default allows scram-sha-256 from 127.0.0.1)"
		fi
	fi
}

# --------------------------------------------------------------------- Redis

redis_ping() {
	if command -v redis-cli >/dev/null 2>&1; then
		[[ $(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null) == PONG ]]
	else
		# No redis-cli: speak RESP over bash's /dev/tcp.
		(
			exec 3<>"/dev/tcp/127.0.0.1/$REDIS_PORT" || exit 1
			printf 'PING\r\n' >&3
			IFS= read -r -t 2 reply <&3 && [[ $reply == +PONG* ]]
		) 2>/dev/null
	fi
}

ensure_redis() {
	if ! command -v redis-server >/dev/null 2>&1 && [[ ! -x /usr/bin/redis-server ]]; then
		apt_install redis-server
	fi
	local server
	server=$(command -v redis-server || echo /usr/bin/redis-server)
	if redis_ping; then
		REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
		return
	fi
	local log=/tmp/parley-redis-$REDIS_PORT.log
	"$server" --port "$REDIS_PORT" --bind 127.0.0.1 --daemonize yes \
		--save '' --appendonly no --dir /tmp \
		--logfile "$log" --pidfile "/tmp/parley-redis-$REDIS_PORT.pid" ||
		die "could not start redis-server on port $REDIS_PORT; see $log"
	local deadline=$((SECONDS + WAIT_SECONDS))
	until redis_ping; do
		if ((SECONDS >= deadline)); then
			tail -n 20 "$log" >&2 || true
			die "redis-server on port $REDIS_PORT not answering PING after ${WAIT_SECONDS}s (is the port taken by something else?)"
		fi
		sleep 0.1
	done
	say "started redis-server on 127.0.0.1:$REDIS_PORT (log $log)"
	REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
}

# ---------------------------------------------------------------------- main

PG_URL=
REDIS_URL=
user_pg=${PARLEY_POSTGRES_URL:-${PARLEY_TEST_POSTGRES_URL:-}}
user_redis=${PARLEY_REDIS_URL:-${PARLEY_TEST_REDIS_URL:-}}

if [[ -n $user_pg ]]; then
	PG_URL="$(mask_url "$user_pg") (yours, not managed)"
else
	ensure_postgres
fi
if [[ -n $user_redis ]]; then
	REDIS_URL="$(mask_url "$user_redis") (yours, not managed)"
else
	ensure_redis
fi

echo "services ready: postgres=$PG_URL redis=$REDIS_URL"
