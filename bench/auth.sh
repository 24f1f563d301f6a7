#!/usr/bin/env bash
# What a token check costs: requests/s of /healthz, of /api/v1/me and /api/v1/allocations
# with an API token, and of a session-cookie page, in the same run against one release
# server on a fresh SQLite file (docs/benchmarks.md §11).
#
#   bash bench/auth.sh [path/to/tessera]   (default target/release/tessera; needs wrk, curl)
set -euo pipefail
BIN=${1:-target/release/tessera}
DUR=${DUR:-10s}
CONN=${CONN:-16}
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
DIR=$(mktemp -d)
PW=auth-bench-password-1
BASE=http://127.0.0.1:$PORT
TESSERA_ADMIN_PASSWORD=$PW RUST_LOG=error "$BIN" serve --no-sim --bind 127.0.0.1:$PORT \
  --database-url "sqlite://$DIR/t.db?mode=rwc" --site-root /nonexistent &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; rm -rf "$DIR"' EXIT
until curl -sf "$BASE/readyz" >/dev/null; do sleep 0.2; done
JAR=$DIR/cookies
curl -sf -c "$JAR" -H "origin: $BASE" -d "username=admin&password=$PW" "$BASE/fn/login" >/dev/null
TOKEN=$(curl -sf -b "$JAR" -H "origin: $BASE" -H 'content-type: application/json' \
  -d '{"name":"bench"}' "$BASE/api/v1/tokens" | python3 -c 'import json,sys; print(json.load(sys.stdin)["secret"])')
COOKIE=$(awk '$6=="tessera_session"{print $6"="$7}' "$JAR")
rate() { wrk -t2 -c"$CONN" -d"$DUR" "$@" | awk '/Requests\/sec/{print $2}'; }
H=$(rate "$BASE/healthz")
ME=$(rate -H "Authorization: Bearer $TOKEN" "$BASE/api/v1/me")
AL=$(rate -H "Authorization: Bearer $TOKEN" "$BASE/api/v1/allocations")
PAGE=$(rate -H "Cookie: $COOKIE" "$BASE/allocations")
printf '| route | requests/s | × /healthz |\n|---|---:|---:|\n'
for row in "/healthz $H" "/api/v1/me (token) $ME" "/api/v1/allocations (token) $AL" "/allocations (session page) $PAGE"; do
  set -- $row
  v=${!#}
  name=${row% *}
  printf '| %s | %.0f | %.2f |\n' "$name" "$v" "$(python3 -c "print($v/$H)")"
done
