"""How tensors travel between the two processes of an evaluation: memfds, never ``pickle``.

Two transports (``EvalConfig.output_transport``):

- **memfd** (``pack_tensors`` / ``unpack_tensors``): a new memfd per message, sealed against every
  change before it is sent, so the receiver maps exactly what was written. The CPU default, and how the
  reference process shares timing input sets with the candidate's on CPU.
- **channel** (``OutputChannel`` in the candidate's process, ``OutputMapping`` in the reference process):
  the candidate's outputs go into one memfd that both processes map once and register as page-locked
  host memory (``cudaHostRegister``), so each message costs two DMA copies (device to host there, host
  to device here) instead of page faults and staged copies through pageable memory. The CUDA default.
  The memfd is sealed against shrinking and growing (a mapping here can never lose its pages, so no
  ``SIGBUS``) but not against writes: the reference process copies every tensor into its own device
  memory the moment the message arrives and reads the mapping for nothing else. What the candidate
  writes there is only ever its own outputs; this process writes nothing there, so nothing of the
  reference reaches it. A larger message replaces the memfd (the new one travels with that message).

``transport(cfg, tools)`` resolves ``"auto"``. Both check every entry of the metadata (dtype, shape,
size, offsets inside the transport) before reading.
Loaded by path beside ``_harness.py`` (standard library and torch only).
"""

from __future__ import annotations

import fcntl
import math
import mmap
import os
import stat
import warnings

from _autoprofiler_harness import ProtocolError

ALIGN = 64  # byte alignment of each tensor inside a transport memfd
SEALS = ("F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_WRITE", "F_SEAL_SEAL")  # memfd: sealed against all change
CHANNEL_SEALS = ("F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_SEAL")  # channel: the size is fixed, not the bytes
CHANNEL_MIN_BYTES = 64 * 2**20  # the smallest channel (most tasks' outputs then fit the first one)
CHANNEL_GROWTH = 1.25  # a channel that must grow grows at least this much, so regrowth stays rare
HOST_REGISTER_READ_ONLY = 0x08  # cudaHostRegisterReadOnly: the reference process maps the channel read-only


def transport(cfg: dict, tools) -> str:
    """The output transport of an evaluation: ``EvalConfig.output_transport``, ``"auto"`` resolved
    (``"channel"`` on CUDA, ``"memfd"`` on CPU)."""
    name = cfg.get("output_transport", "auto")
    if name == "auto":
        return "channel" if tools.is_cuda else "memfd"
    return name


# --------------------------------------------------------------------------------------------------
# Layout and checks (both transports)
# --------------------------------------------------------------------------------------------------
def layout(tools, values: list) -> tuple[list[dict], list[tuple[int, object]], int]:
    """Where each of ``values`` goes: ``(metas, [(offset, tensor)], total bytes)``. Tensors are raw
    bytes at 64-byte-aligned offsets; plain values travel in the metadata; anything else by type and
    repr only."""
    metas, blobs, offset = [], [], 0
    for value in values:
        if isinstance(value, tools.Tensor):
            t = tools.plain(value).contiguous()
            nbytes = t.numel() * t.element_size()
            dtype = str(t.dtype).replace("torch.", "")
            meta = {"kind": "tensor", "dtype": dtype, "shape": list(t.shape), "device": t.device.type}
            metas.append(dict(meta, offset=offset, nbytes=nbytes))
            blobs.append((offset, t))
            offset += -(-nbytes // ALIGN) * ALIGN
        elif value is None or isinstance(value, (bool, int, float, str)):
            metas.append({"kind": "value", "value": value})
        else:
            metas.append({"kind": "object", "type": type(value).__name__, "repr": repr(value)[:200]})
    return metas, blobs, offset


def write(tools, buf, blobs: list) -> None:
    """Copy each ``(offset, tensor)`` into the byte tensor ``buf`` (a CUDA tensor straight from the
    device)."""
    torch = tools.torch
    with tools.no_torch_function():
        for off, t in blobs:
            n = t.numel() * t.element_size()
            if n:
                buf[off : off + n].copy_(t.reshape(-1).view(torch.uint8))


def check_specs(torch, metas: list, size: int) -> list[dict]:
    """``metas`` checked against a transport of ``size`` bytes; tensor entries get their torch dtype.
    Raises ``ProtocolError`` for anything malformed or outside the transport."""
    if not isinstance(metas, list):
        raise ProtocolError("malformed tensor metadata")
    end, specs = 0, []
    for meta in metas:
        if not isinstance(meta, dict):
            raise ProtocolError("malformed tensor metadata")
        if meta.get("kind") != "tensor":
            specs.append(meta)
            continue
        dtype = getattr(torch, str(meta.get("dtype")), None)
        shape, offset, nbytes = meta.get("shape"), meta.get("offset"), meta.get("nbytes")
        if not isinstance(dtype, torch.dtype) or not isinstance(shape, list):
            raise ProtocolError(f"bad tensor metadata {str(meta)[:120]}")
        if not all(type(d) is int and d >= 0 for d in shape + [offset, nbytes]):
            raise ProtocolError(f"bad tensor metadata {str(meta)[:120]}")
        if nbytes != math.prod(shape) * torch.empty((), dtype=dtype).element_size():
            raise ProtocolError(f"tensor metadata with inconsistent sizes {str(meta)[:120]}")
        if offset % ALIGN or offset < end or offset + nbytes > size:
            raise ProtocolError("tensor offsets outside the transport")
        end = offset + nbytes
        specs.append(dict(meta, dtype=dtype))
    return specs


def read_values(tools, specs: list[dict], buf, copy: bool = True) -> list:
    """The values ``specs`` describe, tensors read from the byte tensor ``buf``: copied onto
    ``tools.device`` (``copy``) or views of ``buf``."""
    torch = tools.torch
    values = []
    for spec in specs:
        if spec.get("kind") == "tensor":
            n = spec["nbytes"]
            raw = buf[spec["offset"] : spec["offset"] + n] if n else torch.empty(0, dtype=torch.uint8)
            t = raw.view(spec["dtype"]).reshape(spec["shape"])
            values.append(tools.to(t, tools.device, copy=True) if copy else t)
        elif spec.get("kind") == "value":
            values.append(spec.get("value"))
        else:
            values.append(Opaque(str(spec.get("type")), str(spec.get("repr"))))
    return values


class Opaque:
    """A non-tensor, non-JSON output of the candidate, known by type name and repr only."""

    def __init__(self, type_name: str, text: str):
        self.type_name, self.text = type_name, text

    def __repr__(self) -> str:
        return self.text

    def __eq__(self, other) -> bool:
        return isinstance(other, Opaque) and (self.type_name, self.text) == (other.type_name, other.text)


def _seal_bits(names=SEALS) -> int:
    bits = 0
    for name in names:
        bits |= getattr(fcntl, name)
    return bits


def _check_memfd(fd: int, names) -> int:
    """The size of the memfd ``fd`` after checking it is a regular file with at least the seals
    ``names``."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise ProtocolError("a tensor transport that is not a memfd")
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError as exc:
        raise ProtocolError(f"a tensor transport without seals ({exc})") from exc
    if seals & _seal_bits(names) != _seal_bits(names):
        raise ProtocolError("an unsealed tensor transport")
    return info.st_size


# --------------------------------------------------------------------------------------------------
# memfd: a new, fully sealed memfd per message
# --------------------------------------------------------------------------------------------------
def pack_tensors(tools, values: list) -> tuple[list[dict], int]:
    """Write ``values`` into a new sealed memfd: ``(metas, fd)``. Sealed against writes and size
    changes, so the receiving process maps it without the sender changing or truncating it underneath."""
    torch = tools.torch
    metas, blobs, size = layout(tools, values)
    fd = os.memfd_create("autoprofiler-tensors", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        if size:
            mm = mmap.mmap(fd, size)
            buf = torch.frombuffer(mm, dtype=torch.uint8)
            write(tools, buf, blobs)
            del buf
            mm.close()
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _seal_bits())
    except BaseException:
        os.close(fd)
        raise
    return metas, fd


def unpack_tensors(tools, metas: list[dict], fd: int, copy: bool = True) -> list:
    """Read what ``pack_tensors`` wrote, checking the memfd (sealed, exact size) and every entry.

    Tensors land on ``tools.device``; with ``copy=False`` (CPU) they are views of a private mapping of
    the memfd instead: pages shared with every other process that maps it until one writes to them.
    Raises ``ProtocolError`` for anything malformed. Closes ``fd``.
    """
    torch = tools.torch
    try:
        size = _check_memfd(fd, SEALS)
        specs = check_specs(torch, metas, size)
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_COPY) if size else None
        buf = torch.frombuffer(mm, dtype=torch.uint8) if mm is not None else None
        if not copy:  # the tensors keep the mapping alive
            return read_values(tools, specs, buf, copy=False)
        try:
            return read_values(tools, specs, buf)
        finally:
            del buf
            if mm is not None:
                try:
                    mm.close()
                except BufferError:  # a view still alive (an exception's traceback): closed when freed
                    pass
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------------
# channel: one reused memfd, page-locked in both processes on CUDA
# --------------------------------------------------------------------------------------------------
class OutputChannel:
    """The candidate's side of the channel transport: one memfd, mapped and page-locked once, that each
    message's outputs are copied into (device to host at DMA speed)."""

    def __init__(self, tools):
        self.tools = tools
        self.fd: int | None = None
        self.mm = None
        self.buf = None
        self.size = 0
        self.pinned = False

    def pack(self, values: list) -> tuple[list[dict], tuple[int, ...]]:
        """``(metas, fds)``: ``fds`` holds a new memfd (a duplicate the caller closes after sending)
        when the outputs did not fit the current one, else nothing."""
        metas, blobs, need = layout(self.tools, values)
        fds: tuple[int, ...] = ()
        if need > self.size:
            self.replace(max(need, int(self.size * CHANNEL_GROWTH), CHANNEL_MIN_BYTES))
            fds = (os.dup(self.fd),)
        write(self.tools, self.buf, blobs)
        self.tools.sync()  # every byte is in host memory before the message says so
        return metas, fds

    def replace(self, size: int) -> None:
        self.close()
        torch = self.tools.torch
        size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        fd = os.memfd_create("autoprofiler-outputs", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _seal_bits(CHANNEL_SEALS))
            # populated up front: page-locking faulted-in pages is far cheaper than faulting them later
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        except BaseException:
            os.close(fd)
            raise
        self.fd, self.mm, self.size = fd, mm, size
        self.buf = torch.frombuffer(mm, dtype=torch.uint8)
        self.pinned = host_register(self.tools, self.buf, read_only=False)

    def close(self) -> None:
        if self.buf is not None and self.pinned:
            host_unregister(self.tools, self.buf)
        self.buf, self.pinned = None, False
        if self.mm is not None:
            self.mm.close()
            self.mm = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.size = 0


class OutputMapping:
    """The reference process's side of the channel transport: the candidate's current channel, mapped
    read-only and page-locked; each message's tensors are copied out of it into this process's own
    device memory at once."""

    def __init__(self, tools):
        self.tools = tools
        self.mm = None
        self.buf = None
        self.size = 0
        self.pinned = False

    def open(self, fd: int, limit: int) -> None:
        """Map the channel memfd ``fd`` (it replaces the one before). Closes ``fd``. A channel larger
        than ``limit`` bytes is refused before it is mapped: page-locking it would take that much host
        memory, whatever the outputs in it."""
        try:
            size = _check_memfd(fd, CHANNEL_SEALS)
            if size <= 0:
                raise ProtocolError("an empty output channel")
            if size > limit:
                raise ProtocolError(f"an output channel of {size} bytes, more than its outputs need")
            self.close()
            self.mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self.size = size
        with warnings.catch_warnings():  # read-only by design: nothing here writes to it
            warnings.simplefilter("ignore", UserWarning)
            self.buf = self.tools.torch.frombuffer(self.mm, dtype=self.tools.torch.uint8)
        self.pinned = host_register(self.tools, self.buf, read_only=True)

    def read(self, metas: list) -> list:
        """The tensors and values ``metas`` describes, tensors copied onto ``tools.device`` (a
        ``ProtocolError`` for an entry outside the channel)."""
        listed = metas if isinstance(metas, list) else []
        if self.buf is None and any(isinstance(m, dict) and m.get("nbytes") for m in listed):
            raise ProtocolError("outputs in an output channel that was never sent")
        specs = check_specs(self.tools.torch, metas, self.size)
        values = read_values(self.tools, specs, self.buf)
        self.tools.sync()
        return values

    def close(self) -> None:
        if self.buf is not None and self.pinned:
            host_unregister(self.tools, self.buf)
        self.buf, self.pinned = None, False
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:  # a view still alive (an exception's traceback): closed when freed
                pass
            self.mm = None
        self.size = 0


def host_register(tools, buf, read_only: bool) -> bool:
    """Page-lock the host memory under the byte tensor ``buf`` for DMA (CUDA only). False where it
    cannot be (no CUDA, the driver refuses): the copies then go through pageable memory, slower."""
    if not tools.is_cuda:
        return False
    cudart = tools.torch.cuda.cudart()
    flags = HOST_REGISTER_READ_ONLY if read_only else 0
    err = cudart.cudaHostRegister(buf.data_ptr(), buf.numel(), flags)
    if int(getattr(err, "value", err)) == 0:  # a cudaError enum (its value) or a plain int
        return True
    _clear_cuda_error(tools)
    return False


def host_unregister(tools, buf) -> None:
    err = tools.torch.cuda.cudart().cudaHostUnregister(buf.data_ptr())
    if int(getattr(err, "value", err)) != 0:
        _clear_cuda_error(tools)


def _clear_cuda_error(tools) -> None:
    """A failed runtime call leaves its error for ``cudaGetLastError``, where torch's next kernel-launch
    check would report it as that kernel's. A trivial launch reads it away here (torch raises it once)."""
    try:
        tools.torch.zeros(1, device=tools.device).add_(1)
    except RuntimeError:
        pass
