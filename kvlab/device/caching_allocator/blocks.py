"""The allocator model's data: blocks, segments and the free-block pools.

Mirrors the structs of ``c10/cuda/CUDACachingAllocator.cpp``: ``Block`` (an address range, linked
to its neighbours by ``prev``/``next``), ``BlockPool`` (free blocks ordered best-fit, plus torch's
``unmapped`` set for expandable segments) and the segment a block belongs to (torch keeps no segment
object for a ``cudaMalloc``; its ``ExpandableSegment`` holds the mapped pages, which here is
:class:`Segment` with ``is_expandable=True``). Behaviour lives in
:mod:`kvlab.device.caching_allocator.allocator`; this module only holds and links.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator
from dataclasses import dataclass

from kvlab.errors import InvariantError


@dataclass(eq=False, repr=False, slots=True)
class Block:
    """A contiguous address range inside a segment (torch's ``Block``)."""

    addr: int
    size: int  # bytes, a multiple of 512
    requested_size: int  # what the caller asked for (0 while free)
    stream: int
    pool: str  # "small" | "large"
    allocated: bool
    segment: Segment
    mapped: bool = True  # False only for unmapped address space of an expandable segment
    prev: Block | None = None
    next: Block | None = None

    @property
    def end_addr(self) -> int:
        return self.addr + self.size

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else ("free" if self.mapped else "unmapped")
        return (
            f"Block(addr={self.addr:#x}, size={self.size}, requested_size={self.requested_size}, "
            f"stream={self.stream}, pool={self.pool!r}, {state})"
        )


@dataclass(eq=False, repr=False, slots=True)
class Segment:
    """One ``cudaMalloc`` (or one expandable segment's address range) and its blocks.

    ``size`` is the bytes backed by device memory: the cudaMalloc size, or the mapped pages of an
    expandable segment; ``memory_reserved() == sum(seg.size for seg in segments)``."""

    addr: int
    size: int
    pool: str
    stream: int
    is_expandable: bool = False
    address_space_bytes: int = 0  # virtual extent (== size unless expandable)
    page_bytes: int = 0  # expandable only: 2 MiB (small) / 20 MiB (large)
    head: Block | None = None

    @property
    def mapped_bytes(self) -> int:
        return self.size

    def iter_all_blocks(self) -> Iterator[Block]:
        """Every block in address order, unmapped address space included."""
        block = self.head
        while block is not None:
            yield block
            block = block.next

    @property
    def blocks(self) -> list[Block]:
        """Mapped blocks (allocated and free) in address order."""
        return [b for b in self.iter_all_blocks() if b.mapped]

    def __repr__(self) -> str:
        kind = "expandable" if self.is_expandable else "cudaMalloc"
        return f"Segment(addr={self.addr:#x}, size={self.size}, pool={self.pool!r}, stream={self.stream}, {kind})"


class BlockPool:
    """Free blocks of one pool (torch's ``BlockPool``): best-fit order per stream is a sorted
    ``(size, addr)`` list, unmapped expandable space a sorted address list."""

    __slots__ = ("name", "is_small", "blocks", "_keys", "unmapped", "_unmapped_addrs")

    def __init__(self, name: str) -> None:
        self.name = name
        self.is_small = name == "small"
        self.blocks: dict[int, Block] = {}  # addr -> free mapped block
        self._keys: dict[int, list[tuple[int, int]]] = {}  # stream -> sorted (size, addr)
        self.unmapped: dict[int, Block] = {}
        self._unmapped_addrs: dict[int, list[int]] = {}

    def insert(self, block: Block) -> None:
        insort(self._keys.setdefault(block.stream, []), (block.size, block.addr))
        self.blocks[block.addr] = block

    def erase(self, block: Block) -> None:
        keys = self._keys[block.stream]
        i = bisect_left(keys, (block.size, block.addr))
        if i >= len(keys) or keys[i] != (block.size, block.addr):
            raise InvariantError("a block taken from a pool must be in that pool's best-fit index", block=block,
                                 pool=self.name)
        del keys[i]
        del self.blocks[block.addr]

    def keys(self, stream: int) -> list[tuple[int, int]]:
        return self._keys.get(stream, [])

    def streams(self) -> list[int]:
        return sorted(self._keys)

    def insert_unmapped(self, block: Block) -> None:
        insort(self._unmapped_addrs.setdefault(block.stream, []), block.addr)
        self.unmapped[block.addr] = block

    def erase_unmapped(self, block: Block) -> None:
        addrs = self._unmapped_addrs[block.stream]
        i = bisect_left(addrs, block.addr)
        if i >= len(addrs) or addrs[i] != block.addr:
            raise InvariantError("a block taken from a pool's unmapped ranges must be listed there", block=block,
                                 pool=self.name)
        del addrs[i]
        del self.unmapped[block.addr]

    def unmapped_addrs(self, stream: int) -> list[int]:
        return self._unmapped_addrs.get(stream, [])


def link_before(new: Block, node: Block) -> None:
    """Insert ``new`` just before ``node`` in its segment's block list."""
    new.prev, new.next = node.prev, node
    if node.prev is not None:
        node.prev.next = new
    else:
        node.segment.head = new
    node.prev = new


def link_after(new: Block, node: Block) -> None:
    """Insert ``new`` just after ``node`` in its segment's block list."""
    new.prev, new.next = node, node.next
    if node.next is not None:
        node.next.prev = new
    node.next = new

