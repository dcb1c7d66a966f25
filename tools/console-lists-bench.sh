#!/bin/sh
# console-lists-bench.sh: the console's list pages on PostgreSQL at fleet size (issue 33): a
# private PostgreSQL 15 (temporary directory, Unix socket only, as `nobody` under root) filled
# by SQL with 10,000 devices (each push-registered and bound to a user), 1,000,000 indexed
# events on 5 AppKeys over 30 days in 20,000 batches, 100,000 push deliveries and 50,000 MA
# users; then one pylon-backend on it, and each page's latency (curl's time_total, 5 requests,
# median and max, after one warm-up request).
#
#   tools/console-lists-bench.sh [BIN_DIR]      (default .build/debug)
set -eu
BIN=${1:-.build/debug}
PG=/usr/lib/postgresql/15/bin
D=$(mktemp -d /tmp/pylon-lists-bench-XXXXXX)
as_pg() { if [ "$(id -u)" = 0 ]; then setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; else "$@"; fi; }
[ "$(id -u)" = 0 ] && chown nobody:nogroup "$D"
chmod 700 "$D"
as_pg $PG/initdb -D "$D/data" -U pylon -A trust -E UTF8 --locale=C >/dev/null
printf "listen_addresses = ''\nunix_socket_directories = '%s'\nshared_buffers = 128MB\n" "$D" >> "$D/data/postgresql.conf"
as_pg $PG/pg_ctl -D "$D/data" -l "$D/server.log" -w start >/dev/null
cleanup() { kill "$BACKEND" 2>/dev/null || true; as_pg $PG/pg_ctl -D "$D/data" -m immediate -w stop >/dev/null || true; rm -rf "$D"; }
BACKEND=
trap cleanup EXIT
as_pg $PG/psql -h "$D" -U pylon -d postgres -qc "CREATE DATABASE bench"
URL="postgresql://pylon@/bench?host=$D"
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$D/op.token"
chmod 600 "$D/op.token"
start_backend() {
  "$BIN/pylon-backend" --listen 127.0.0.1:0 --db "$URL" --operator-token-file "$D/op.token" --log-level warn > "$D/out" 2> "$D/err" &
  BACKEND=$!
  for _ in $(seq 100); do grep -q listening "$D/out" 2>/dev/null && break; sleep 0.1; done
  ADDR=$(sed -n 's/pylon-backend listening on //p' "$D/out")
}
start_backend   # creates the schema
kill "$BACKEND"; wait "$BACKEND" 2>/dev/null || true
NOW=$(($(date +%s) * 1000))
as_pg $PG/psql -h "$D" -U pylon -d bench -q <<SQL
INSERT INTO streams (name) SELECT 'ma.app' || g FROM generate_series(1, 5) g;
INSERT INTO devices (device_id, install_id, secret, created_at)
  SELECT lpad(to_hex(g), 16, '0'), 'inst-' || lpad(g::text, 5, '0'), repeat('a', 64), $NOW FROM generate_series(1, 10000) g;
INSERT INTO batches (key, stream, received_at, record_count, accepted)
  SELECT 'k' || g, 1 + g % 5, $NOW - g::bigint * 129600, 50, 50 FROM generate_series(1, 20000) g;
INSERT INTO events (stream, record_id, app_key, event, euid, time_ms, received_ms, install_id, data, js_seq)
  SELECT 1 + g % 5, 'r' || g, 'app' || (1 + g % 5), 'ev' || (g % 40), 'eu' || (g % 50000), $NOW - g::bigint * 2592,
         $NOW - g::bigint * 2592, 'inst-' || lpad((1 + g % 10000)::text, 5, '0'), NULL, NULL
  FROM generate_series(1, 1000000) g;
INSERT INTO push_devices (token, install_id, active, registered_at) SELECT 'pt' || g, 'inst-' || lpad(g::text, 5, '0'), 1, 0 FROM generate_series(1, 10000) g;
INSERT INTO push_bindings (token, user_id, bound_at) SELECT 'pt' || g, 'user-' || g, 0 FROM generate_series(1, 10000) g;
INSERT INTO push_deliveries (msg_id, token, published_at, puback_at, acked_at)
  SELECT 'm' || (g / 1000), 'pt' || (1 + g % 10000), $NOW - g::bigint * 25000, $NOW - g::bigint * 25000,
         CASE WHEN g % 2 = 0 THEN $NOW - g::bigint * 25000 END FROM generate_series(1, 100000) g;
INSERT INTO ma_users (app_key, euid, created_at) SELECT 'app' || (1 + g % 5), 'eu' || g, 0 FROM generate_series(1, 50000) g;
ANALYZE;
SQL
start_backend
for p in /v1/admin/dashboard "/v1/admin/devices?limit=50" "/v1/admin/devices?limit=500" "/v1/admin/devices?q=user-4242" \
    "/v1/admin/devices?q=inst-042" "/v1/admin/devices?appKey=app3&limit=50" /v1/admin/devices/inst-04242 /v1/admin/apps \
    /v1/admin/streams /v1/admin/audit /metrics; do
  curl -s -o /dev/null -H "Authorization: Bearer $(cat "$D/op.token")" "http://$ADDR$p"
  T=$(for _ in 1 2 3 4 5; do curl -s -o /dev/null -H "Authorization: Bearer $(cat "$D/op.token")" -w "%{time_total}\n" "http://$ADDR$p"; done | sort -n)
  printf "%-42s median %4.0f ms  max %4.0f ms\n" "$p" "$(echo "$T" | sed -n 3p | awk '{print $1 * 1000}')" "$(echo "$T" | tail -1 | awk '{print $1 * 1000}')"
done
