#!/usr/bin/env bash
# Read-only hardware check for a node (or a lent machine) with an NVIDIA GPU.
#
# Prints what the NVML backend reads — each GPU's profile table, instances, health
# counters and whether its critical Xid events could be registered ("xid events:
# watching … / not supported … / registration failed: …") — and saves the JSON
# inventory with samples. It changes nothing on the GPU: no --manage-mig, no server,
# no MIG or compute-mode call; registering for NVML events is a subscription only.
#
# Usage (from the repository root): bash agent/scripts/hw-check.sh [OUT_DIR]
# OUT_DIR defaults to $OUT (the device runner's folder), else ./hw-check-out.
set -euo pipefail

out="${1:-${OUT:-./hw-check-out}}"
mkdir -p "$out"

if command -v nvidia-smi >/dev/null; then
    nvidia-smi -L | tee "$out/nvidia-smi-L.txt"
    # Read-only queries: the driver's own view to compare with the agent's.
    nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER >"$out/nvidia-smi-health.txt" 2>&1 || true
    nvidia-smi mig -lgip >"$out/nvidia-smi-lgip.txt" 2>&1 || true
fi

agent="${TESSERA_AGENT_BIN:-target/debug/tessera-agent}"
if [ ! -x "$agent" ]; then
    cargo build -p tessera-agent --bin tessera-agent
fi

echo "== tessera-agent inventory (summary: health and xid registration per GPU)"
RUST_LOG="${RUST_LOG:-tessera_agent=info}" "$agent" inventory 2>"$out/inventory.log" \
    | tee "$out/inventory.txt"
"$agent" inventory --json --samples >"$out/inventory.json" 2>>"$out/inventory.log"

echo "== xid watcher registration per GPU"
grep -E '^GPU |xid events:' "$out/inventory.txt" || true
echo "saved in $out"
