"""A JAX gang member: joins the gang's JAX distributed runtime and sums a value
across the processes (CPU collectives over gloo). Every member runs it (launcher
`each`); the server sets JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
JAX_PROCESS_ID. Prints one JSON line per process; process 0's line carries
"role": "coordinator".

The result proves every process joined: each contributes (process_id + 1) * 10 and
its own address; the sum must be 10 * n * (n + 1) / 2 and the gathered addresses come
from each process.

Gloo is set up as JAX does by default: it advertises the address the host name
resolves to. In a Tessera gang member that works as is: the member's host name is
`rank-<N>` and its /etc/hosts (read-only, written by the agent) maps it to the member's
own gang address. Where the host name resolves to something the peers cannot reach
(127.0.0.1 in a bare network namespace, e.g. e2e/gang/jax_netns_check.sh),
TESSERA_JAX_GLOO_BIND_IP=1 re-registers JAX's CPU backend with gloo bound to this
process's own address instead (JAX internals, checked with JAX 0.10.2).
"""

import json
import os
import socket
import sys

import jax

# Cross-process collectives on CPU need an implementation (the default is none).
jax.config.update("jax_cpu_collectives_implementation", "gloo")

import jax.numpy as jnp  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402


def own_ip(toward):
    """The address this process's packets toward `toward` leave from (no packet is sent)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((toward, 9))
        return s.getsockname()[0]
    finally:
        s.close()


def bind_gloo_to(ip):
    """Only with TESSERA_JAX_GLOO_BIND_IP=1 (opt-in; the default is JAX's own setup).
    Gloo (JAX's CPU collectives) advertises the address its host name resolves to,
    which outside a Tessera gang member (a bare network namespace) is often 127.0.0.1
    (or nothing): the peers then cannot connect ("Connection refused,
    remote=[127.0.0.1]"). Make the CPU backend with gloo on this process's own address
    instead. Uses JAX internals (checked with JAX 0.10.2)."""
    if os.environ.get("TESSERA_JAX_GLOO_BIND_IP") != "1":
        return
    try:
        from jax._src import distributed, xla_bridge
        from jax._src.lib import _jax

        def cpu_client():
            return xla_bridge.make_cpu_client(
                collectives=_jax.make_gloo_tcp_collectives(
                    distributed_client=distributed.global_state.client, hostname=ip
                )
            )

        xla_bridge.register_backend_factory("cpu", cpu_client, priority=0, fail_quietly=False)
    except Exception as e:  # another JAX: its default, and say so
        print(f"jax_allreduce: cannot bind gloo to {ip} ({e!r}); using JAX's default",
              file=sys.stderr)


def main():
    coordinator = os.environ["JAX_COORDINATOR_ADDRESS"]
    n = int(os.environ["JAX_NUM_PROCESSES"])
    pid = int(os.environ["JAX_PROCESS_ID"])
    jax.distributed.initialize(
        coordinator_address=coordinator,
        num_processes=n,
        process_id=pid,
        initialization_timeout=int(os.environ.get("JAX_INIT_TIMEOUT", "120")),
    )
    ip = own_ip(coordinator.rsplit(":", 1)[0])
    bind_gloo_to(ip)
    octets = [int(x) for x in ip.split(".")]
    mine = jnp.array([(pid + 1) * 10, *octets, os.getuid(), pid], dtype=jnp.int32)
    # process_allgather: a real cross-process collective; every process gets all rows.
    rows = multihost_utils.process_allgather(mine)
    total = int(rows[:, 0].sum())
    out = {
        "role": "coordinator" if pid == 0 else "member",
        "process_id": pid,
        "process_count": jax.process_count(),
        "num_processes": n,
        "sum": total,
        "expected_sum": 10 * n * (n + 1) // 2,
        "ranks": [
            {
                "process_id": int(r[6]),
                "ip": ".".join(str(int(x)) for x in r[1:5]),
                "uid": int(r[5]),
            }
            for r in rows
        ],
        "jax_version": jax.__version__,
        "backend": jax.default_backend(),
    }
    print(json.dumps(out, sort_keys=True), flush=True)
    jax.distributed.shutdown()
    return 0 if total == out["expected_sum"] and jax.process_count() == n else 1


if __name__ == "__main__":
    sys.exit(main())
