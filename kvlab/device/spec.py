"""DeviceSpec presets: how much memory a GPU has and how much of it never reaches PyTorch.

Capacities are what ``torch.cuda.mem_get_info()`` reports as *total* on each card (the driver
keeps a little of the marketing size for itself). ``context_bytes`` is the CUDA context plus
cuBLAS/NCCL workspaces a serving process creates before any weight is loaded; it is the main
"non-PyTorch memory" in torch's OOM message. ``other_process_bytes`` models memory held by other
processes on the same card (another server, a notebook kernel).

``smi_total_mib`` is what ``nvidia-smi --query-gpu=memory.total`` (or ``rocm-smi`` on AMD) reports:
SGLang's ``get_nvgpu_memory_capacity`` reads it to pick its default ``mem_fraction_static``, so a
version's default is computed from this number. Each preset names where its numbers come from
(``source``); a number that was not seen on a real card says so ("assumed", "datasheet").
``names`` are the product strings a log or ``nvidia-smi`` prints, matched by :func:`find_device_spec`.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from kvlab.units import GB, GiB, MiB


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    capacity_bytes: int  # physical memory the driver reports as total
    context_bytes: int = 512 * MiB  # CUDA context + library workspaces (non-PyTorch memory)
    other_process_bytes: int = 0
    cap_bytes: int | None = None  # a visible-memory cap (the PR ran H200s capped to 80 GB)
    description: str = ""
    smi_total_mib: int | None = None  # nvidia-smi / rocm-smi memory.total; None = capacity_bytes in MiB
    names: tuple[str, ...] = ()  # product names as nvidia-smi / torch print them (word-bounded match)
    source: str = ""  # where capacity and smi total come from
    # host<->device copy bandwidth (bytes/s, one direction, pinned host memory) that HiCache's transfers are priced
    # at (kvlab.sched.cost); None where kvlab assumes none. host_link_source says where the figure comes from.
    host_link_bytes_per_s: float | None = None
    host_link_source: str = ""

    def __post_init__(self) -> None:
        for field in ("capacity_bytes", "context_bytes", "other_process_bytes"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"DeviceSpec {self.name!r}: {field} must be a non-negative int, got {value!r}")
        if self.capacity_bytes == 0:
            raise ValueError(f"DeviceSpec {self.name!r}: capacity_bytes must be positive")
        if self.cap_bytes is not None and not 0 < self.cap_bytes <= self.capacity_bytes:
            raise ValueError(
                f"DeviceSpec {self.name!r}: cap_bytes={self.cap_bytes} must be in (0, capacity_bytes={self.capacity_bytes}]"
            )
        if self.context_bytes + self.other_process_bytes >= self.total_bytes:
            raise ValueError(
                f"DeviceSpec {self.name!r}: context_bytes + other_process_bytes "
                f"({self.context_bytes + self.other_process_bytes}) leave no memory of total {self.total_bytes}"
            )

    @property
    def total_bytes(self) -> int:
        """What ``mem_get_info`` reports as total: the cap when one is set."""
        return self.cap_bytes if self.cap_bytes is not None else self.capacity_bytes

    @property
    def smi_mib(self) -> int:
        """memory.total as nvidia-smi / rocm-smi print it, in MiB (what SGLang's defaults read)."""
        return self.smi_total_mib if self.smi_total_mib is not None else self.capacity_bytes // MiB

    @property
    def non_pytorch_bytes(self) -> int:
        return self.context_bytes + self.other_process_bytes

    def replace(self, **changes) -> DeviceSpec:
        return dataclasses.replace(self, **changes)


def _card(name: str, smi_mib: int, description: str, names: tuple[str, ...], source: str, **extra) -> DeviceSpec:
    """A preset whose capacity is its nvidia-smi / rocm-smi total."""
    small = smi_mib * MiB < 30 * GiB
    extra.setdefault("context_bytes", 384 * MiB if small else 512 * MiB)
    return DeviceSpec(name, smi_mib * MiB, description=description, smi_total_mib=smi_mib, names=names,
                      source=source, **extra)


DEVICE_PRESETS: dict[str, DeviceSpec] = {
    spec.name: spec
    for spec in (
        # ---- kvlab's original presets (capacities as the finding-1 experiments use them) ----
        DeviceSpec("h200", 143_771 * MiB, description="NVIDIA H200 141 GB HBM3e", names=("H200",),
                   source="nvidia-smi memory.total 143771 MiB on an H200 SXM"),
        DeviceSpec("h100-80g", 81_559 * MiB, description="NVIDIA H100 80 GB HBM3 (SXM)",
                   names=("H100 80GB HBM3", "H100-SXM", "H100 SXM"),
                   source="nvidia-smi 81559MiB: NVIDIA/nccl#1264, modal-labs/modal-client#2797"),
        DeviceSpec("a100-80g", 81_050 * MiB, description="NVIDIA A100 80 GB", smi_total_mib=81_920,
                   names=("A100-SXM4-80GB", "A100 80GB", "A100-PCIE-80GB"),
                   source="nvidia-smi 81920MiB: modal-labs/modal-client#2797; capacity = torch's usable total"),
        DeviceSpec("a100-40g", 40_370 * MiB, context_bytes=448 * MiB, description="NVIDIA A100 40 GB",
                   smi_total_mib=40_960, names=("A100-SXM4-40GB", "A100-PCIE-40GB", "A100 40GB"),
                   source="nvidia-smi 40960MiB: modal-labs/modal-client#2797; capacity = torch's usable total"),
        DeviceSpec("l4", 22_491 * MiB, context_bytes=384 * MiB, description="NVIDIA L4 24 GB", smi_total_mib=23_034,
                   names=("L4",), source="nvidia-smi 23034MiB: modal-labs/modal-client#2797; "
                                         "capacity = torch's usable total"),
        DeviceSpec("rtx4090", 24_564 * MiB, context_bytes=384 * MiB, description="NVIDIA GeForce RTX 4090 24 GB",
                   names=("RTX 4090",), source="nvidia-smi 24564MiB: RLinf/RLinf#255"),
        DeviceSpec(
            "h200-80gb-cap",
            143_771 * MiB,
            cap_bytes=80 * GB,
            description="H200 capped to 80 GB visible memory, as in the KV-budget PR",
        ),
        # ---- published specs; "nvidia-smi N MiB" = a real card's memory.total seen in the cited thread ----
        _card("a10g", 23_028, "NVIDIA A10G 24 GB GDDR6 (AWS g5)", ("A10G",),
              "nvidia-smi 23028MiB: NVIDIA/DCGM#232"),
        _card("a10", 23_028, "NVIDIA A10 24 GB GDDR6", ("A10",), "nvidia-smi 23028MiB: modal-labs/modal-client#2797"),
        _card("l40s", 46_068, "NVIDIA L40S 48 GB GDDR6", ("L40S",),
              "nvidia-smi 46068 MiB: akash-network/provider-configs#99, modal-labs/modal-client#2797"),
        _card("a40", 46_068, "NVIDIA A40 48 GB GDDR6", ("A40",),
              "assumed: the 48 GB GDDR6 ECC board total of the L40S (46068 MiB); no A40 reading seen"),
        _card("a800", 81_920, "NVIDIA A800 80 GB (China variant of the A100 80 GB)",
              ("A800-SXM4-80GB", "A800 80GB", "A800"),
              "nvidia-smi 81920MiB: dexmal/dexbotic#41 (SXM4), vllm-project/vllm#41519 (PCIe)"),
        _card("h800", 81_559, "NVIDIA H800 80 GB HBM3 (China variant of the H100 SXM)", ("H800",),
              "assumed equal to the H100 SXM (same 80 GB HBM3 stack: ai-dynamo/aiconfigurator#968)"),
        _card("h20", 97_871, "NVIDIA H20 96 GB HBM3", ("H20",), "nvidia-smi 97871MiB: NVIDIA/nvtrust#128"),
        _card("h100-pcie", 81_559, "NVIDIA H100 PCIe 80 GB HBM2e", ("H100 PCIe",),
              "assumed equal to the H100 SXM's 81559 MiB (80 GB datasheet capacity)"),
        _card("h100-nvl", 95_830, "NVIDIA H100 NVL 94 GB HBM3", ("H100 NVL",),
              "inferred: CUDA-visible total 99,961,274,368 B (95,330 MiB, fastfetch-cli/fastfetch#1658) and "
              "nvidia-smi reading ~0.5% above CUDA on H100 (81559 vs 81090 MiB); SGLang 0.5.10's default "
              "0.86 in the willxxy/sglang-play log needs >= 95,658 MiB"),
        _card("rtx3090", 24_576, "NVIDIA GeForce RTX 3090 24 GB GDDR6X", ("RTX 3090",),
              "nvidia-smi 24576MiB: noonghunna/club-3090#1128"),
        _card("rtx5090", 32_607, "NVIDIA GeForce RTX 5090 32 GB GDDR7", ("RTX 5090",),
              "nvidia-smi 32607MiB: noonghunna/club-3090#617"),
        _card("b200", 183_359, "NVIDIA B200 180 GB HBM3e", ("B200",), "nvidia-smi 183359MiB: NVIDIA/TensorRT-LLM#10278"),
        _card("mi300x", 196_592, "AMD Instinct MI300X 192 GB HBM3", ("MI300X",),
              "rocm-smi VRAM Total 206,141,652,992 B = 196,592 MiB: ROCm/legacy-rocm-build#4750"),
        _card("mi308x", 196_592, "AMD Instinct MI308X 192 GB HBM3", ("MI308X",),
              "assumed equal to the MI300X (same 192 GB HBM3 per the datasheet)"),
        _card("mi325x", 262_144, "AMD Instinct MI325X 256 GB HBM3E", ("MI325X",),
              "datasheet 256 GB HBM3E taken as 256 GiB; a real card reports slightly less"),
        _card("mi355x", 294_912, "AMD Instinct MI355X 288 GB HBM3E", ("MI355X",),
              "datasheet 288 GB HBM3E taken as 288 GiB; a real card reports slightly less"),
    )
}


# Host links: a practical rate for large pinned cudaMemcpy copies, about 85 % of the link's raw rate (PCIe
# encoding and protocol overhead); the raw rates are the PCIe specification's (x16: Gen3 15.75, Gen4 31.5,
# Gen5 63 GB/s per direction). They are assumptions from the link generation each card's datasheet names, not
# measurements on that card: only ratios between runs are meant to be read from the simulator's clock.
_GEN5 = (55e9, "assumed: PCIe Gen5 x16 (datasheet), 63 GB/s raw, ~55 GB/s pinned copies")
_GEN4 = (25e9, "assumed: PCIe Gen4 x16 (datasheet), 31.5 GB/s raw, ~25 GB/s pinned copies")
_HOST_LINKS = {
    **dict.fromkeys(("h200", "h200-80gb-cap", "h100-80g", "h100-pcie", "h100-nvl", "h800", "h20", "b200",
                     "rtx5090", "mi300x", "mi308x", "mi325x", "mi355x"), _GEN5),
    **dict.fromkeys(("a100-80g", "a100-40g", "a800", "a10g", "a10", "l4", "l40s", "a40", "rtx3090", "rtx4090"),
                    _GEN4),
}
DEVICE_PRESETS = {name: spec.replace(host_link_bytes_per_s=_HOST_LINKS[name][0], host_link_source=_HOST_LINKS[name][1])
                  if name in _HOST_LINKS else spec for name, spec in DEVICE_PRESETS.items()}


def find_device_spec(product_name: str) -> DeviceSpec | None:
    """The preset whose product name appears in ``product_name`` (word-bounded, longest name wins):
    ``"NVIDIA H100 80GB HBM3"`` -> h100-80g, ``"NVIDIA A10G"`` -> a10g (not a10), ``"L40S"`` -> l40s."""
    best, best_len = None, 0
    for spec in DEVICE_PRESETS.values():
        for name in spec.names:
            pattern = r"(?<![A-Za-z0-9])" + re.escape(name).replace(r"\ ", r"[ _-]?") + r"(?![A-Za-z0-9])"
            if len(name) > best_len and re.search(pattern, product_name, re.IGNORECASE):
                best, best_len = spec, len(name)
    return best


def get_device_spec(name: str) -> DeviceSpec:
    try:
        return DEVICE_PRESETS[name]
    except KeyError:
        raise ValueError(
            f"unknown device preset {name!r}; choose one of: {', '.join(sorted(DEVICE_PRESETS))}"
        ) from None
