#!/usr/bin/env bash
# Runs e2e/gang/jax_allreduce.py as two JAX processes in two network namespaces joined by
# a veth pair (the `each` launcher of issue 42 without Tessera), with the variables the
# server sets. Needs root and iproute2. Usage:
#   e2e/gang/jax_netns_check.sh [path/to/python-with-jax]   (default: .venv-jax/bin/python)
# TGANG_UID=N runs both as that uid (as a sandbox's team uid).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=${1:-${TESSERA_TEST_JAX_PYTHON:-$here/../../.venv-jax/bin/python}}
a=tgjax-a-$$ b=tgjax-b-$$
addr_a=198.19.252.1 addr_b=198.19.252.2
work=$(mktemp -d /tmp/tgjax.XXXXXX)
chmod 755 "$work"
cleanup() {
    ip netns del "$a" 2>/dev/null || true
    ip netns del "$b" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
. "$here/netns_pair.sh"
netns_pair "$a" "$b" "$addr_a" "$addr_b"
runas=()
[ -n "${TGANG_UID:-}" ] && runas=(setpriv --reuid="$TGANG_UID" --regid="$TGANG_UID" --clear-groups env HOME=/tmp)
export JAX_COORDINATOR_ADDRESS=$addr_a:29500 JAX_NUM_PROCESSES=2
export MASTER_ADDR=$addr_a MASTER_PORT=29500 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1
pids=()
for i in 0 1; do
    ns=$a; [ $i = 1 ] && ns=$b
    JAX_PROCESS_ID=$i RANK=$i NODE_RANK=$i timeout 120 ip netns exec "$ns" "${runas[@]}" \
        env TESSERA_JAX_GLOO_BIND_IP=1 "$python" "$here/jax_allreduce.py" >"$work/out$i" 2>"$work/err$i" &
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
if [ $rc -ne 0 ]; then
    for i in 0 1; do echo "--- process $i stderr" >&2; tail -n 30 "$work/err$i" >&2; done
    exit $rc
fi
cat "$work/out0"
"$python" - "$work/out0" "$work/out1" "$addr_a" "$addr_b" <<'PY'
import json, sys
outs = [json.loads(open(p).read().strip().splitlines()[-1]) for p in sys.argv[1:3]]
for o in outs:
    assert o["process_count"] == 2 and o["sum"] == o["expected_sum"] == 30, o
    assert sorted(r["ip"] for r in o["ranks"]) == sorted(sys.argv[3:5]), o
print("ok: JAX collective across both namespaces", file=sys.stderr)
PY
