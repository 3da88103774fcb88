#!/usr/bin/env bash
# A throwaway PostgreSQL for the Spark sinks' tests: initdb + pg_ctl in DIR, 127.0.0.1 only.
#
#   scripts/pg-local.sh start DIR [PORT]   # prints the DSN: export LABKIT_PG_DSN=<it>
#   scripts/pg-local.sh stop DIR
#
# Needs the PostgreSQL server binaries (Debian/Ubuntu: apt-get install -y postgresql).
# PostgreSQL refuses to run as root, so as root the server runs as the `postgres` user.
set -euo pipefail
cmd=${1:?usage: pg-local.sh start|stop DIR [PORT]}
dir=${2:?usage: pg-local.sh start|stop DIR [PORT]}
port=${3:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}

bindir=$(pg_config --bindir 2>/dev/null || true)
[ -x "$bindir/initdb" ] || bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
if [ ! -x "$bindir/initdb" ]; then
  echo "PostgreSQL server binaries not found: apt-get install -y postgresql (or brew install postgresql)" >&2
  exit 2
fi
as_owner() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

case $cmd in
  start)
    mkdir -p "$dir"
    # The server's files live in a directory its user owns and can reach (as root, DIR's
    # parents may be private to root); DIR/pgdata records where.
    pgdata=$(as_owner mktemp -d "${TMPDIR:-/tmp}/labkit-pg.XXXXXX")
    echo "$pgdata" >"$dir/pgdata"
    as_owner "$bindir/initdb" -D "$pgdata/data" -U labkit --auth=trust >"$dir/initdb.log" 2>&1
    as_owner "$bindir/pg_ctl" -D "$pgdata/data" -l "$pgdata/server.log" -w start \
      -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories='$pgdata' -c fsync=off" >/dev/null
    echo "postgresql://labkit@127.0.0.1:$port/postgres"
    ;;
  stop)
    pgdata=$(cat "$dir/pgdata")
    as_owner "$bindir/pg_ctl" -D "$pgdata/data" -m fast -w stop >/dev/null
    rm -rf "$pgdata"
    ;;
  *) echo "unknown command $cmd: use start or stop" >&2; exit 2 ;;
esac
