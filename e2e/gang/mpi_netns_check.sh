#!/usr/bin/env bash
# Runs e2e/gang/allreduce.py with Open MPI across two network namespaces joined by a veth
# pair, Open MPI starting its daemon in the second namespace through `tessera-rsh`
# (the agent's executable under that name) instead of ssh: the gang launcher of issue 42
# without Tessera. Needs root, iproute2, openmpi-bin and python3-mpi4py (Debian's, so
# /usr/bin/python3). Usage: e2e/gang/mpi_netns_check.sh [path/to/tessera-agent]
# Exit status 0 and rank 0's JSON line on stdout when the allreduce spanned both.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
agent=${1:-$here/../../target/debug/tessera-agent}
agent=$(readlink -f "$agent")
[ -x "$agent" ] || { echo "no agent executable at $agent (cargo build -p tessera-agent)" >&2; exit 2; }
python=/usr/bin/python3
"$python" -c 'import mpi4py' || { echo "$python lacks mpi4py (apt-get install python3-mpi4py)" >&2; exit 2; }

a=tgang-a-$$ b=tgang-b-$$
addr_a=198.19.254.1 addr_b=198.19.254.2
work=$(mktemp -d /tmp/tgang.XXXXXX)
chmod 755 "$work"
serve_pid=
cleanup() {
    [ -n "$serve_pid" ] && kill -TERM "$serve_pid" 2>/dev/null && sleep 0.5
    ip netns del "$a" 2>/dev/null || true
    ip netns del "$b" 2>/dev/null || true
    if [ -n "${TGANG_KEEP:-}" ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

. "$here/netns_pair.sh"
netns_pair "$a" "$b" "$addr_a" "$addr_b"

# What the agent sets up in every gang member (see docs/agent.md, "Gang jobs").
mkdir -p "$work/bin"
cp "$agent" "$work/bin/tessera-rsh"
cp "$here/allreduce.py" "$work/"
chmod -R a+rX "$work"
# TGANG_UID=N: serve and mpirun as that uid (a sandbox's team uid), not root.
runas=()
[ -n "${TGANG_UID:-}" ] && runas=(setpriv --reuid="$TGANG_UID" --regid="$TGANG_UID" --clear-groups env HOME=/tmp)
export TESSERA_GANG_SECRET=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
export TESSERA_GANG_RSH_PORT=2222
printf '%s slots=1\n%s slots=1\n' "$addr_a" "$addr_b" >"$work/hostfile"
export TESSERA_HOSTFILE=$work/hostfile

# Rank 1: the remote agent's server, the only process of members with rank > 0.
# Each member's own GPUs: the remote ranks must see the serving member's, not mpirun's.
CUDA_VISIBLE_DEVICES=GPU-member-1 ip netns exec "$b" "${runas[@]}" "$work/bin/tessera-rsh" serve 2>"$work/serve.log" &
serve_pid=$!
for _ in $(seq 100); do
    ip netns exec "$a" bash -c "exec 3<>/dev/tcp/$addr_b/$TESSERA_GANG_RSH_PORT" 2>/dev/null && break
    sleep 0.1
done

# Rank 0: mpirun. The MCA settings a member needs are exported as OMPI_MCA_* (mpirun
# passes them on to the remote orted's command line).
export OMPI_MCA_plm_rsh_agent=$work/bin/tessera-rsh
export OMPI_MCA_plm_rsh_no_tree_spawn=1
# No `orted --daemonize`: the daemon stays tessera-rsh serve's child (its process group is
# killed when mpirun's connection drops) and its output comes back through the connection.
export OMPI_MCA_orte_leave_session_attached=1
export OMPI_MCA_btl=self,vader,tcp
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_btl_tcp_if_include=eth0
export OMPI_MCA_oob_tcp_if_include=eth0
export OMPI_MCA_rmaps_base_oversubscribe=1
export CUDA_VISIBLE_DEVICES=GPU-member-0
# Root only (this check; sandbox members are not root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# TGANG_DROP="btl oob_tcp_if_include …": leave those OMPI_MCA_ settings out (to see which
# are needed).
for v in ${TGANG_DROP:-}; do unset "OMPI_MCA_$v"; done
set +e
ip netns exec "$a" "${runas[@]}" timeout 120 mpirun --hostfile "$TESSERA_HOSTFILE" -np 2 \
    "$python" "$work/allreduce.py" >"$work/out.json" 2>"$work/mpirun.log"
rc=$?
set -e
if [ $rc -ne 0 ]; then
    echo "mpirun failed ($rc)" >&2
    echo "--- mpirun stderr" >&2; cat "$work/mpirun.log" >&2
    echo "--- tessera-rsh serve stderr" >&2; cat "$work/serve.log" >&2
    exit $rc
fi
cat "$work/out.json"
"$python" - "$work/out.json" "$addr_a" "$addr_b" <<'PY'
import json, sys
out = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
ips = sorted(r["ip"] for r in out["ranks"])
assert out["world_size"] == 2 and out["sum"] == out["expected_sum"] == 30, out
assert ips == sorted(sys.argv[2:4]), ips
gpus = {r["rank"]: r["cuda_visible_devices"] for r in out["ranks"]}
assert gpus == {0: "GPU-member-0", 1: "GPU-member-1"}, gpus
print("ok: allreduce across both namespaces", file=sys.stderr)
PY
