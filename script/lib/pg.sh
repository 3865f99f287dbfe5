# Private PostgreSQL clusters for script/test and script/server, from the system's binaries.
#
# Source this file, then:
#   pg_cluster_start DIR   initialise DIR/data on first use, start it on a free loopback port,
#                          and set PG_PORT and PG_ADMIN_URL (superuser "herald", trust auth)
#   pg_cluster_stop DIR    stop it (fast shutdown); harmless if it is not running
#   pg_psql ARGS...        psql against the started cluster as "herald"
#
# PostgreSQL refuses to run as root, so when we are root its tools run as an unprivileged user
# ($HERALD_PG_USER, else "postgres", created with useradd if missing) through runuser.

PG_SUPERUSER=herald

# Prints the newest PostgreSQL bin dir, installing the server from apt if there is none.
pg_bin_dir() {
  if [[ -n "${HERALD_PG_BIN:-}" ]]; then
    echo "$HERALD_PG_BIN"
    return
  fi
  local dir
  dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [[ -z "$dir" || ! -x "$dir/initdb" ]]; then
    if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null; then
      echo "pg: no PostgreSQL found; installing it with apt-get" >&2
      DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
      dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    else
      echo "pg: no PostgreSQL server binaries found (install postgresql or set HERALD_PG_BIN)" >&2
      return 1
    fi
  fi
  echo "$dir"
}

# The user the server runs as: empty when we are not root.
pg_run_user() {
  if [[ $EUID -ne 0 ]]; then
    return
  fi
  local user="${HERALD_PG_USER:-postgres}"
  if ! id -u "$user" >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin "$user"
  fi
  echo "$user"
}

# Runs a PostgreSQL tool as the server's user.
pg_as_user() {
  local user
  user=$(pg_run_user)
  if [[ -n "$user" ]]; then
    runuser -u "$user" -- "$@"
  else
    "$@"
  fi
}

# Creates DIR owned by the server's user, mode 0700 (initdb insists).
pg_owned_dir() {
  local dir="$1" user
  mkdir -p "$dir"
  chmod 0700 "$dir"
  user=$(pg_run_user)
  if [[ -n "$user" ]]; then
    chown "$user:" "$dir"
    # The user must be able to reach DIR through its parents (a root-only home would stop it).
    if ! runuser -u "$user" -- test -x "$dir"; then
      echo "pg: user $user cannot reach $dir; use a folder outside root-only directories" >&2
      return 1
    fi
  fi
}

# A TCP port free on 127.0.0.1 a moment ago.
pg_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

pg_cluster_start() {
  local dir="$1" bin
  bin=$(pg_bin_dir)
  PG_BIN="$bin"
  mkdir -p "$dir"
  if [[ ! -f "$dir/data/PG_VERSION" ]]; then
    rm -rf "$dir/data"
    pg_owned_dir "$dir/data"
    pg_as_user "$bin/initdb" -D "$dir/data" -U "$PG_SUPERUSER" --auth=trust \
      --encoding=UTF8 --no-sync >"$dir/initdb.log" 2>&1 || {
      cat "$dir/initdb.log" >&2
      return 1
    }
  fi
  pg_owned_dir "$dir/run"

  # Already running (script/server reuses its cluster)? Take its port.
  if pg_as_user "$bin/pg_ctl" status -D "$dir/data" >/dev/null 2>&1 && [[ -f "$dir/port" ]]; then
    PG_PORT=$(cat "$dir/port")
  else
    local attempt
    for attempt in 1 2 3; do
      PG_PORT=$(pg_free_port)
      # fsync/synchronous_commit/full_page_writes off: a throwaway cluster needs no durability.
      if pg_as_user "$bin/pg_ctl" start -w -t 60 -D "$dir/data" -l "$dir/run/postgres.log" \
        -o "-p $PG_PORT -k $dir/run -c listen_addresses=127.0.0.1 -c fsync=off \
            -c synchronous_commit=off -c full_page_writes=off -c max_connections=500" \
        >/dev/null; then
        break
      fi
      if [[ $attempt -eq 3 ]]; then
        tail -n 20 "$dir/run/postgres.log" >&2 || true
        return 1
      fi
    done
    echo "$PG_PORT" >"$dir/port"
  fi
  PG_ADMIN_URL="postgres://$PG_SUPERUSER@127.0.0.1:$PG_PORT/postgres"
  export PG_PORT PG_ADMIN_URL PG_BIN
}

pg_cluster_stop() {
  local dir="$1" bin
  [[ -d "$dir/data" ]] || return 0
  bin=$(pg_bin_dir)
  pg_as_user "$bin/pg_ctl" stop -D "$dir/data" -m fast -w >/dev/null 2>&1 || true
}

pg_psql() {
  "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U "$PG_SUPERUSER" "$@"
}
