"""A documented step-time model, so the simulator can report time and throughput.

Serving steps are memory- or compute-bound in simple ways: a prefill step costs a fixed launch
overhead plus a time per token computed (attention over the prefix is ignored: prefix tokens
that hit the cache cost nothing, which is the point of caching); a decode step costs a fixed
overhead plus a little per running request. Defaults are the order of an 8B model on one H100
(~20k prefill tokens/s, ~12 ms per decode step at small batch). Only ratios between the two
eviction modes are meant to be read from it, not absolute latencies.

HiCache (the host tier) adds copies between host and device memory, priced by bytes over the host link:
a copy of ``n`` tokens takes ``n * kv_bytes_per_token / bandwidth`` seconds (the cache controller times it on
its own channel per direction, FIFO, :mod:`kvlab.mem_cache.hicache.cache_controller`). How they overlap compute is
SGLang's (0.5.16):

- **load-back** (host -> device, at admission): SGLang starts the copies when the prefill batch is formed and
  each layer's attention waits only for its own layer's copy (``LayerDoneCounter``), so the load runs under the
  prefill's compute. kvlab models a prefill step as ``max(compute, load)``: the step ends when both the
  compute and every load issued in it are done (no per-layer granularity: a load longer than the compute
  shows in full, a shorter one is hidden in full);
- **write-through** (device -> host backups, at insert): on a separate stream, never waited for by compute.
  It costs no step time; it costs *locks*: a node stays locked (unevictable) until its copy lands, and the
  copies queue FIFO, so a backlog keeps nodes locked longer;
- **write-back** (device -> host at eviction): the eviction waits for its copies (``writing_check(
  write_back=True)``); that wait adds to the step (``step = stall + compute``, and the load term above).

Bandwidth is the host link's practical rate for pinned copies, per GPU preset
(:func:`host_link_bytes_per_s`, :attr:`kvlab.device.spec.DeviceSpec.host_link_bytes_per_s`, each with its source);
the default is an H100's (PCIe Gen5 x16). Bytes per token default to Llama-3-8B's bf16 KV (32 layers x 8 KV heads x
128 dims x K and V x 2 bytes = 131,072 B; ``kvlab.model`` computes any model's as ``cell_size_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_KV_BYTES_PER_TOKEN = 131_072  # Llama-3-8B, bf16: 32 layers * 8 KV heads * 128 dims * 2 (K, V) * 2 bytes
DEFAULT_HOST_LINK_BYTES_PER_S = 55e9  # H100/H200 on PCIe Gen5 x16 (64 GB/s raw), ~55 GB/s pinned cudaMemcpy


@dataclass(frozen=True)
class CostModel:
    prefill_step_s: float = 0.004
    prefill_token_s: float = 1 / 20_000
    decode_step_s: float = 0.012
    decode_req_s: float = 0.00005
    kv_bytes_per_token: int = DEFAULT_KV_BYTES_PER_TOKEN  # prices host<->device copies and sizes --hicache-size
    host_to_device_bytes_per_s: float = DEFAULT_HOST_LINK_BYTES_PER_S  # load-back
    device_to_host_bytes_per_s: float = DEFAULT_HOST_LINK_BYTES_PER_S  # write-through / write-back

    def __post_init__(self) -> None:
        if isinstance(self.kv_bytes_per_token, bool) or not isinstance(self.kv_bytes_per_token, int) \
                or self.kv_bytes_per_token < 1:
            raise ValueError(f"kv_bytes_per_token must be a positive int, got {self.kv_bytes_per_token!r}")
        for name in ("host_to_device_bytes_per_s", "device_to_host_bytes_per_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")

    def prefill_time_s(self, tokens_computed: int) -> float:
        return self.prefill_step_s + tokens_computed * self.prefill_token_s

    def decode_time_s(self, batch_size: int) -> float:
        return self.decode_step_s + batch_size * self.decode_req_s

    @staticmethod
    def overlapped_step_s(compute_s: float, stall_s: float, load_s: float) -> float:
        """A step's time with HiCache: ``stall_s`` (write-back waits before the compute) then the compute, and
        ``load_s`` (from the step's start to the end of its last load-back) under it: the larger of the two."""
        return max(stall_s + compute_s, load_s)

    @classmethod
    def for_gpu(cls, gpu: str, kv_bytes_per_token: int = DEFAULT_KV_BYTES_PER_TOKEN, **fields) -> CostModel:
        """The default step costs with the host link of GPU preset ``gpu`` (both directions) and the model's KV
        bytes per token."""
        bw = host_link_bytes_per_s(gpu)
        return cls(kv_bytes_per_token=kv_bytes_per_token, host_to_device_bytes_per_s=bw,
                   device_to_host_bytes_per_s=bw, **fields)


def host_link_bytes_per_s(gpu: str) -> float:
    """The host<->device bandwidth kvlab assumes for GPU preset ``gpu`` (``kvlab.device.spec``), with its source
    there; raises ``ValueError`` naming the preset when none is known."""
    from kvlab.device.spec import get_device_spec

    spec = get_device_spec(gpu)
    if spec.host_link_bytes_per_s is None:
        raise ValueError(f"GPU preset {gpu!r} has no host link bandwidth; pass host_to_device_bytes_per_s / "
                         "device_to_host_bytes_per_s to CostModel")
    return spec.host_link_bytes_per_s
