"""A multi-node job's command that proves its rendezvous: rank 0 listens on MASTER_ADDR:MASTER_PORT, rank 1
connects from its own address (its entry in PIPELINES_PEERS); each sends its RANK and reads the other's.
Exits 0 only if each saw the other (rank 0 also checks the connection came from its peer's address).

``HANDSHAKE_FAIL=RETRY:RANK`` makes that attempt's task of that rank exit 1 at once (a fault to recover from).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

rank, retry = int(os.environ["RANK"]), os.environ["GPU_JOB_RETRY"]
master = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
peers = os.environ["PIPELINES_PEERS"].split(",")
if os.environ.get("HANDSHAKE_FAIL") == f"{retry}:{rank}":
    sys.exit(1)
deadline = time.monotonic() + 20.0
if rank == 0:
    with socket.create_server(master) as server:
        server.settimeout(20.0)
        conn, (address, _) = server.accept()
else:
    while True:
        try:
            conn = socket.create_connection(master, timeout=1.0, source_address=(peers[rank], 0))
            break
        except OSError:
            if time.monotonic() > deadline:
                sys.exit(f"rank {rank}: no rank 0 at {master}")
            time.sleep(0.05)
    address = master[0]
with conn:
    conn.sendall(f"{rank}\n".encode())
    other = conn.makefile().readline().strip()
expected_address = peers[1] if rank == 0 else peers[0]
print(
    json.dumps(
        {
            "rank": rank,
            "saw_rank": other,
            "peer_address": address,
            "retry": retry,
            **{k: os.environ[k] for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "PIPELINES_PEERS")},
        }
    )
)
sys.exit(0 if other == str(1 - rank) and address == expected_address else 1)
