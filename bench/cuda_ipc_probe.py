"""Can the evaluator's reference process read a CUDA output of the candidate's process without a trip
through host memory? A probe for the H200 (issue 13: on CUDA the outputs travel through a memfd today,
and a 12.5 GB output took ~14 s per correctness trial there).

    python3 bench/cuda_ipc_probe.py --gib 1 --out /tmp/out/cuda_ipc_probe.json

A child process (dropped to uid 65534 when run as root, as the evaluator's candidate process is)
allocates a tensor on the GPU, fills it from a seed, and exports it two ways: CUDA IPC
(``UntypedStorage._share_cuda_``: a device-memory handle) and the evaluator's own memfd transport
(``pack_tensors``: device to host into a sealed memfd). The parent opens each, copies the tensor into
its own device memory, checks the bytes (an exact checksum against the child's) and times each step.
Prints one table; writes JSON. Needs torch with CUDA; nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "autoprofiler" / "evaluation"))


def child(conn_fd: int, numel: int, drop: bool) -> None:
    import socket

    if drop and os.geteuid() == 0:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
    import _harness as harness
    import torch

    sock = socket.socket(fileno=conn_fd)
    tools = harness.Tools(torch, "cuda")
    torch.manual_seed(0)
    t = torch.randn(numel, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    storage = t.untyped_storage()
    shared = storage._share_cuda_()
    ipc_export_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    metas, fd = harness.pack_tensors(tools, [t])
    pack_s = time.perf_counter() - t0
    fields = []
    for x in shared:
        fields.append({"bytes": x.hex()} if isinstance(x, bytes) else x)
    msg = {
        "uid": os.geteuid(),
        "pid": os.getpid(),
        "checksum": tools.checksum([t]),
        "ipc": fields,
        "offset": t.storage_offset(),
        "ipc_export_s": ipc_export_s,
        "pack_s": pack_s,
        "metas": metas,
    }
    socket.send_fds(sock, [json.dumps(msg).encode()], [fd])
    sock.recv(1)  # keep the tensor alive until the parent is done
    os._exit(0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=1.0, help="size of the fp32 tensor")
    p.add_argument("--no-drop", action="store_true", help="keep the child's uid (root)")
    p.add_argument("--out", default="", help="JSON path")
    args = p.parse_args(argv)
    import multiprocessing as mp
    import socket

    import _harness as harness
    import torch

    numel = int(args.gib * 2**30 // 4)
    parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ctx = mp.get_context("spawn")
    proc = ctx.Process(target=child, args=(child_sock.detach(), numel, not args.no_drop))
    proc.start()
    msg_bytes, fds, _, _ = socket.recv_fds(parent_sock, 1 << 20, 1)
    msg = json.loads(msg_bytes)
    tools = harness.Tools(torch, "cuda")
    torch.cuda.init()
    result = {"gib": args.gib, "child_uid": msg["uid"], "pack_s": msg["pack_s"]}
    result["ipc_export_s"] = msg["ipc_export_s"]
    t0 = time.perf_counter()
    values = harness.unpack_tensors(tools, msg["metas"], fds[0])
    torch.cuda.synchronize()
    result["memfd_unpack_s"] = time.perf_counter() - t0
    result["memfd_ok"] = tools.checksum(values) == msg["checksum"]
    del values
    try:
        t0 = time.perf_counter()
        raw = [bytes.fromhex(x["bytes"]) if isinstance(x, dict) else x for x in msg["ipc"]]
        storage = torch.UntypedStorage._new_shared_cuda(*raw)
        view = torch.empty(0, dtype=torch.float32, device="cuda").set_(storage, msg["offset"], (numel,), (1,))
        mine = view.clone()
        torch.cuda.synchronize()
        result["ipc_open_copy_s"] = time.perf_counter() - t0
        result["ipc_ok"] = tools.checksum([mine]) == msg["checksum"]
        del view, storage, mine
    except Exception as exc:  # the point of the probe: does it work at all here
        result["ipc_error"] = f"{type(exc).__name__}: {exc}"[:500]
    parent_sock.send(b"x")
    proc.join(30)
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
