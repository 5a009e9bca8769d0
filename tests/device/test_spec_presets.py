"""GPU presets: every card the issue lists exists, says where its numbers come from, and is found by the
product name a log or nvidia-smi prints."""

import pytest

from kvlab.device.spec import DEVICE_PRESETS, find_device_spec
from kvlab.units import MiB

REQUIRED = ["a10g", "l40s", "a800", "h800", "h20", "h100-pcie", "h100-nvl", "a40", "rtx3090", "rtx5090", "mi300x",
            "mi308x", "mi325x", "mi355x", "b200"]


@pytest.mark.parametrize("name", REQUIRED)
def test_required_presets_cite_a_source(name):
    spec = DEVICE_PRESETS[name]
    assert spec.source and spec.description and spec.names
    assert spec.capacity_bytes == spec.smi_mib * MiB
    assert spec.total_bytes > spec.non_pytorch_bytes


@pytest.mark.parametrize("printed,preset", [
    ("GPU 0,1,2,3: NVIDIA H100 80GB HBM3", "h100-80g"), ("NVIDIA A10G", "a10g"), ("NVIDIA A10", "a10"),
    ("GPU 0: NVIDIA A40-48Q", "a40"), ("NVIDIA L4", "l4"), ("NVIDIA L40S", "l40s"), ("NVIDIA H100 NVL", "h100-nvl"),
    ("NVIDIA H20", "h20"), ("NVIDIA H200", "h200"), ("AMD Instinct MI300X", "mi300x"),
    ("NVIDIA A100-SXM4-80GB", "a100-80g"), ("NVIDIA GeForce RTX 3090", "rtx3090"), ("NVIDIA B200", "b200"),
])
def test_find_by_printed_name(printed, preset):
    assert find_device_spec(printed).name == preset


def test_unknown_card_is_none_not_a_guess():
    assert find_device_spec("Tesla T4") is None
    assert find_device_spec("NVIDIA GeForce GTX 1080") is None


def test_smi_total_defaults_to_capacity():
    assert DEVICE_PRESETS["h100-80g"].smi_mib == 81_559
    assert DEVICE_PRESETS["a100-80g"].smi_mib == 81_920  # nvidia-smi, not torch's usable total
