#!/usr/bin/env bash
# The idempotency gateway in front of json-server, a server that creates a
# record for every POST (it is not idempotent by design), with one command:
#
#   bash examples/gateway/run.sh
#
# json-server on 127.0.0.1:$UPSTREAM_PORT (default 8080, its data in
# .data/gateway-example/db.json), the gateway on $PORT (default 3000) in front
# of it, on $DATABASE_URL or the embedded PostgreSQL as `npm start` uses.
# Ctrl-C (or SIGTERM) stops both: the gateway drains first.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PWD/node_modules/.bin:$PATH"
upstream_port="${UPSTREAM_PORT:-8080}"
data="${GATEWAY_EXAMPLE_DATA:-.data/gateway-example}"
mkdir -p "$data"
[ -f "$data/db.json" ] || echo '{"items": []}' > "$data/db.json"

bun node_modules/json-server/lib/cli/bin.js "$data/db.json" --host 127.0.0.1 --port "$upstream_port" --quiet &
upstream=$!
gateway=
stop() {
  trap - INT TERM EXIT
  [ -n "$gateway" ] && kill -TERM "$gateway" 2>/dev/null && wait "$gateway" 2>/dev/null
  kill -TERM "$upstream" 2>/dev/null
  wait "$upstream" 2>/dev/null || true
}
trap stop INT TERM EXIT
# The gateway's first request must find json-server listening, or it is a 502.
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$upstream_port") 2>/dev/null; }
for _ in $(seq 1 300); do
  listening && break
  kill -0 "$upstream" 2>/dev/null || { echo "json-server exited before listening on $upstream_port (its data: $data/db.json)" >&2; exit 1; }
  sleep 0.1
done
listening || { echo "json-server is not listening on $upstream_port after 30 s" >&2; exit 1; }
echo "json-server    http://127.0.0.1:$upstream_port (POST /items makes a record every time)"

UPSTREAM_URL="http://127.0.0.1:$upstream_port" bun src/gateway/main.ts &
gateway=$!
wait "$gateway" || true
gateway=
