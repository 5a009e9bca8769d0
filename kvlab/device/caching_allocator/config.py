"""``PYTORCH_CUDA_ALLOC_CONF`` for the allocator model: the options it implements, parsed as torch does.

Mirrors ``c10/core/AllocatorConfig.cpp``: ``AcceleratorAllocatorConfig::parseArgs`` walks the
``key:value`` items (its ``ConfigTokenizer`` keeps ``[...]`` lists whole, as ``_split_conf`` does
here), with ``parseMaxSplitSize`` (``max_split_size_mb``, at least ``kLargeBuffer`` = 20),
``parseRoundUpPower2Divisions`` (one power of two; the per-interval ``[...]`` list is refused) and
``expandable_segments`` (True/False). ``backend`` and the CUDA-only keys (``release_lock_on_cudamalloc``,
``pinned_use_cuda_host_register``, ``pinned_num_register_threads``) come from
``c10/cuda/CUDAAllocatorConfig.cpp::CUDAAllocatorConfig::parseArgs``.

Where kvlab differs on purpose: a key torch knows but the model does not implement raises
``ValueError`` rather than being taken silently, and the config is a frozen dataclass fixed for the
allocator's lifetime (torch keeps one process-wide instance that ``_set_allocator_settings`` may
change at run time).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.device.caching_allocator.sizes import LARGE_BUFFER_BYTES, UNLIMITED_SPLIT_SIZE, is_power_of_two
from kvlab.units import MiB

# PYTORCH_CUDA_ALLOC_CONF keys that do not change what this model computes.
_IGNORED_CONF_KEYS = frozenset(
    {
        "release_lock_on_cudamalloc",
        "pinned_use_cuda_host_register",
        "pinned_num_register_threads",
        "pinned_use_background_threads",
    }
)
# Keys torch understands but the model does not implement: refuse them rather than mislead.
_UNMODELLED_CONF_KEYS = frozenset(
    {"garbage_collection_threshold", "max_non_split_rounding_mb", "per_process_memory_fraction"}
)


def _split_conf(conf: str) -> list[str]:
    """Split on commas that are not inside ``[...]`` (torch's list syntax)."""
    items, depth, current = [], 0, []
    for ch in conf:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    items.append("".join(current))
    return [item.strip() for item in items if item.strip()]


def _conf_int(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF {key}:{value}: expected an integer") from None


def _conf_bool(key: str, value: str) -> bool:
    if value in ("True", "true"):
        return True
    if value in ("False", "false"):
        return False
    raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF {key}:{value}: expected True or False")


@dataclass(frozen=True)
class AllocatorConfig:
    """The ``PYTORCH_CUDA_ALLOC_CONF`` options the model implements (torch defaults)."""

    max_split_size_bytes: int | None = None  # None = unlimited: any cached block may be split
    expandable_segments: bool = False
    roundup_power2_divisions: int | None = None  # None (or 0, 1) = plain 512 B rounding

    def __post_init__(self) -> None:
        msplit = self.max_split_size_bytes
        if msplit is not None:
            # torch takes max_split_size_mb >= 20 (kLargeBuffer) in whole MiB; the model relies on
            # that (an oversize cached block is then always a whole segment).
            if not isinstance(msplit, int) or msplit < LARGE_BUFFER_BYTES or msplit % MiB:
                raise ValueError(
                    f"max_split_size_bytes={msplit!r}: must be a whole number of MiB >= 20 MiB "
                    "(torch's max_split_size_mb >= 20), or None for unlimited"
                )
        divisions = self.roundup_power2_divisions
        if divisions is not None and (
            not isinstance(divisions, int) or not (divisions == 0 or is_power_of_two(divisions))
        ):
            raise ValueError(f"roundup_power2_divisions={divisions!r}: must be a power of 2 (or 0 / None)")
        if not isinstance(self.expandable_segments, bool):
            raise ValueError(f"expandable_segments={self.expandable_segments!r}: must be a bool")

    @property
    def effective_max_split_size_bytes(self) -> int:
        return UNLIMITED_SPLIT_SIZE if self.max_split_size_bytes is None else self.max_split_size_bytes

    @classmethod
    def from_env(cls, conf: str) -> AllocatorConfig:
        """Parse a ``PYTORCH_CUDA_ALLOC_CONF`` string, e.g.
        ``"expandable_segments:True,max_split_size_mb:128"``. Mirrors
        ``c10/core/AllocatorConfig.cpp::parseArgs`` for the keys the model implements; an unknown
        key, an unmodelled key or a bad value raises ``ValueError`` naming both."""
        kwargs: dict[str, object] = {}
        for item in _split_conf(conf or ""):
            key, sep, value = (part.strip() for part in item.partition(":"))
            if not sep or not value:
                raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF item {item!r}: expected key:value")
            if key == "max_split_size_mb":
                mb = _conf_int(key, value)
                if mb < LARGE_BUFFER_BYTES // MiB:
                    raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF {key}:{value}: too small, must be >= 20")
                kwargs["max_split_size_bytes"] = mb * MiB
            elif key == "expandable_segments":
                kwargs["expandable_segments"] = _conf_bool(key, value)
            elif key == "roundup_power2_divisions":
                if value.startswith("["):
                    raise ValueError(
                        f"PYTORCH_CUDA_ALLOC_CONF {key}:{value}: per-interval divisions are not modelled; "
                        "give one power of 2"
                    )
                divisions = _conf_int(key, value)
                if not is_power_of_two(divisions):
                    raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF {key}:{value}: divisions must be a power of 2")
                kwargs["roundup_power2_divisions"] = divisions
            elif key == "backend":
                if value != "native":
                    raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF {key}:{value}: only the native allocator is modelled")
            elif key in _IGNORED_CONF_KEYS:
                continue
            elif key in _UNMODELLED_CONF_KEYS:
                raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF {key}:{value}: torch option not modelled by kvlab")
            else:
                raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF {key}:{value}: unknown key")
        return cls(**kwargs)  # type: ignore[arg-type]

    def to_env(self) -> str:
        """The ``PYTORCH_CUDA_ALLOC_CONF`` string that :meth:`from_env` turns back into this config."""
        parts = []
        if self.max_split_size_bytes is not None:
            parts.append(f"max_split_size_mb:{self.max_split_size_bytes // MiB}")
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        if self.roundup_power2_divisions:
            parts.append(f"roundup_power2_divisions:{self.roundup_power2_divisions}")
        return ",".join(parts)

