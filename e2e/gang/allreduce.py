"""An MPI gang job: rank 0 runs `mpirun --hostfile $TESSERA_HOSTFILE python3 allreduce.py`
and Open MPI starts the other ranks on the other members through `tessera-rsh`.

Every rank contributes (rank + 1) * 10 to an allreduce (the sum must be
10 * n * (n + 1) / 2) and gathers to rank 0 where it ran: its own address (the source
address of a UDP socket "connected" toward rank 0's, no packet sent), its uid and the
CUDA_VISIBLE_DEVICES it sees. Rank 0 prints one JSON line; exit status 1 if the sum is
wrong.
"""

import json
import os
import socket
import sys

from mpi4py import MPI


def own_ip(toward):
    """The source address of a UDP socket "connected" toward `toward` (nothing is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((toward, 9))
        return s.getsockname()[0]


def main():
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    size = comm.Get_size()
    # Rank 0's address, as a peer would reach it: its UDP source toward a public
    # address works without a route only when one exists, so rank 0 asks toward each
    # hostfile address instead and the others toward rank 0's.
    root_ip = None
    if rank == 0:
        hostfile = os.environ.get("TESSERA_HOSTFILE")
        first = "127.0.0.1"
        if hostfile and os.path.exists(hostfile):
            with open(hostfile) as f:
                addrs = [ln.split()[0] for ln in f if ln.strip() and not ln.startswith("#")]
            if addrs:
                first = addrs[0]
        root_ip = own_ip(first)
    root_ip = comm.bcast(root_ip, root=0)
    me = {
        "rank": rank,
        "ip": own_ip(root_ip) if rank else root_ip,
        "uid": os.getuid(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "hostname": socket.gethostname(),
    }
    total = comm.allreduce((rank + 1) * 10, op=MPI.SUM)
    everyone = comm.gather(me, root=0)
    expected = 10 * size * (size + 1) // 2
    if rank == 0:
        print(
            json.dumps(
                {
                    "sum": total,
                    "expected_sum": expected,
                    "world_size": size,
                    "ranks": everyone,
                    "mpi": MPI.Get_library_version().splitlines()[0].strip().rstrip("\x00"),
                },
                sort_keys=True,
            ),
            flush=True,
        )
    return 0 if total == expected else 1


if __name__ == "__main__":
    sys.exit(main())
