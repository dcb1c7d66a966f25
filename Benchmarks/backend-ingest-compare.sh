#!/usr/bin/env bash
# Ingest throughput of one release pylon-backend on SQLite (file, WAL, synchronous=NORMAL) and on
# PostgreSQL 15 (a local server on a Unix socket, default durability; then synchronous_commit=off),
# side by side in one run. Needs `swift build -c release --product pylon-backend` first.
# usage: Benchmarks/backend-ingest-compare.sh [SECONDS] [CONNECTIONS] [RECORDS]
set -euo pipefail
SECONDS_=${1:-10}; CONNS=${2:-4}; RECS=${3:-10}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$ROOT/.build/release/pylon-backend
PG=/usr/lib/postgresql/15/bin
D=$(mktemp -d /tmp/pylon-pgbench-XXXXXX)
AS=(); if [ "$(id -u)" = 0 ]; then chown nobody:nogroup "$D"; AS=(setpriv --reuid=nobody --regid=nogroup --clear-groups); fi
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; "${AS[@]}" $PG/pg_ctl -D "$D/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$D"; }
trap cleanup EXIT
"${AS[@]}" $PG/initdb -D "$D/data" -U pylon -A trust -E UTF8 --locale=C >/dev/null
"${AS[@]}" $PG/pg_ctl -D "$D/data" -l "$D/pg.log" -w -o "-c listen_addresses='' -k $D -p 5432" start >/dev/null
$PG/psql -q -h "$D" -U pylon -d postgres -c 'CREATE DATABASE bench' -c 'CREATE DATABASE bench_async'
umask 077; od -An -tx1 -N16 /dev/urandom | tr -d ' \n' > "$D/enrol"
run() { # name, --db value
  "$BIN" --listen 127.0.0.1:0 --db "$2" --enrol-secret-file "$D/enrol" --log-level warn > "$D/$1.out" 2>"$D/$1.err" & pids+=($!)
  for _ in $(seq 100); do grep -q listening "$D/$1.out" 2>/dev/null && break; sleep 0.05; done
  local port; port=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$D/$1.out")
  printf '%-28s ' "$1:"; python3 "$ROOT/Benchmarks/backend-ingest.py" "http://127.0.0.1:$port" "$D/enrol" "$SECONDS_" "$CONNS" "$RECS"
  kill "${pids[-1]}"
}
run sqlite "$D/backend.db"
run postgresql "postgresql://pylon@/bench?host=$D"
run postgresql-async-commit "postgresql://pylon@/bench_async?host=$D&options=-c%20synchronous_commit%3Doff"
