#!/usr/bin/env bash
# First and repeat page loads through a throttled network (docs/benchmarks.md §12): starts
# one server on a fresh SQLite file with the built UI bundle, then runs
# e2e/bench/pageload.mjs (headless Chromium, CDP throttling).
#
#   cargo xtask build --release && bash bench/pageload.sh [path/to/tessera]
#   env: MBIT (10), LATENCY_MS (40), RUNS (5), SITE_ROOT (target/site)
set -euo pipefail
BIN=${1:-target/release/tessera}
SITE_ROOT=${SITE_ROOT:-target/site}
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
DIR=$(mktemp -d)
PW=pageload-bench-password-1
BASE=http://127.0.0.1:$PORT
TESSERA_ADMIN_PASSWORD=$PW RUST_LOG=error "$BIN" serve --no-sim --bind 127.0.0.1:$PORT \
  --database-url "sqlite://$DIR/t.db?mode=rwc" --site-root "$SITE_ROOT" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; rm -rf "$DIR"' EXIT
until curl -sf "$BASE/readyz" >/dev/null; do sleep 0.2; done
ls -l "$SITE_ROOT"/pkg | awk 'NR>1{print "   ", $5, $9}'
(cd e2e && TESSERA_URL=$BASE TESSERA_ADMIN_PASSWORD=$PW node bench/pageload.mjs)
