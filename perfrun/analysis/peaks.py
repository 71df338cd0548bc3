"""Peak dense TFLOP/s per GPU model and dtype: the denominator of MFU.

NVIDIA's datasheets quote Tensor Core figures "with sparsity" (2:4
structured sparsity, twice the dense rate), marked with an asterisk; a
training step's matmuls are dense, so every Tensor Core figure here is the
datasheet's sparse figure halved. `fp32` is the plain CUDA-core rate, `tf32`
the Tensor Core rate for float32 matmuls when TF32 is allowed.

The name is matched as torch (`torch.cuda.get_device_name`) and NVML
report it: "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100 PCIe", "NVIDIA H100
NVL", "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe",
"Tesla V100-SXM2-16GB", "NVIDIA L40S". A model not in the table has no MFU
unless `--peak-tflops` gives its peak.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class GpuPeaks:
    """One GPU model's peak dense TFLOP/s by dtype key, and where the
    figures come from."""

    model: str
    tflops: dict[str, float]
    source: str
    note: str = ""


_H100 = "https://www.nvidia.com/en-us/data-center/h100/"
_H200 = "https://www.nvidia.com/en-us/data-center/h200/"
_GH200 = "https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/"
_A100 = "https://www.nvidia.com/en-us/data-center/a100/"
_A10 = "https://www.nvidia.com/en-us/data-center/products/a10-gpu/"
_L4 = "https://www.nvidia.com/en-us/data-center/l4/"
_L40 = "https://www.nvidia.com/en-us/data-center/l40/"
_L40S = "https://www.nvidia.com/en-us/data-center/l40s/"
_V100 = "https://www.nvidia.com/en-us/data-center/v100/"
_B200 = "https://www.nvidia.com/en-us/data-center/hgx/"
_A10G = "https://aws.amazon.com/ec2/instance-types/g5/"

#: The table. Keys: fp32, tf32, bf16, fp16, fp8 (a dtype the model lacks is
#: absent: no bf16 or tf32 on V100, no fp8 before Ada/Hopper).
PEAKS: dict[str, GpuPeaks] = {
    "H100 SXM": GpuPeaks("H100 SXM", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4,
                                      "fp16": 989.4, "fp8": 1978.9}, _H100),
    "H100 PCIe": GpuPeaks("H100 PCIe", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.0,
                                        "fp16": 756.0, "fp8": 1513.0}, _H100),
    "H100 NVL": GpuPeaks("H100 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5,
                                      "fp16": 835.5, "fp8": 1670.5}, _H100),
    "H200 SXM": GpuPeaks("H200 SXM", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4,
                                      "fp16": 989.4, "fp8": 1978.9}, _H200),
    "H200 NVL": GpuPeaks("H200 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5,
                                      "fp16": 835.5, "fp8": 1670.5}, _H200),
    "GH200": GpuPeaks("GH200", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4,
                                "fp16": 989.4, "fp8": 1978.9}, _GH200),
    # The same peaks for SXM4 and PCIe, 40 and 80 GB (a PCIe card holds
    # them for less long under its lower power limit).
    "A100": GpuPeaks("A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
                     _A100),
    "A10": GpuPeaks("A10", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}, _A10),
    "A10G": GpuPeaks("A10G", {"fp32": 31.2, "tf32": 35.0, "bf16": 70.0, "fp16": 70.0}, _A10G,
                     note="no NVIDIA datasheet (an AWS part): approximate; "
                          "--peak-tflops to set it"),
    "L4": GpuPeaks("L4", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0,
                          "fp8": 242.5}, _L4),
    "L40": GpuPeaks("L40", {"fp32": 90.5, "tf32": 90.5, "bf16": 181.0, "fp16": 181.0,
                            "fp8": 362.0}, _L40),
    "L40S": GpuPeaks("L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 366.5, "fp16": 366.5,
                              "fp8": 733.0}, _L40S),
    "V100 SXM2": GpuPeaks("V100 SXM2", {"fp32": 15.7, "fp16": 125.0}, _V100),
    "V100 PCIe": GpuPeaks("V100 PCIe", {"fp32": 14.0, "fp16": 112.0}, _V100),
    "V100S PCIe": GpuPeaks("V100S PCIe", {"fp32": 16.4, "fp16": 130.0}, _V100),
    # HGX B200's eight-GPU figures divided by eight (72 PFLOP/s FP8 with
    # sparsity: 4.5 dense a GPU); the 1000 W part, as HGX and DGX ship it.
    "B200": GpuPeaks("B200", {"fp32": 75.0, "tf32": 1125.0, "bf16": 2250.0, "fp16": 2250.0,
                              "fp8": 4500.0}, _B200),
}

#: Name patterns, most specific first ("GH200" before "H200", "H100 NVL"
#: and "H100 PCIe" before the bare "H100", which is the SXM part: NVML
#: calls it "NVIDIA H100 80GB HBM3"). Matched case-insensitively.
_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\bGH200\b", "GH200"),
    (r"\bH200\b.*\bNVL\b", "H200 NVL"),
    (r"\bH200\b", "H200 SXM"),
    (r"\bH100\b.*\bNVL\b", "H100 NVL"),
    (r"\bH100\b.*\bPCIe\b", "H100 PCIe"),
    (r"\bH100\b", "H100 SXM"),
    (r"\bA100\b", "A100"),
    (r"\bA10G\b", "A10G"),
    (r"\bA10\b", "A10"),
    (r"\bL40S\b", "L40S"),
    (r"\bL40\b", "L40"),
    (r"\bL4\b", "L4"),
    (r"\bV100S\b", "V100S PCIe"),
    (r"\bV100\b.*\bPCIe\b", "V100 PCIe"),
    (r"\bV100\b", "V100 SXM2"),
    (r"\bB200\b", "B200"),
)


def match_gpu(name: Optional[str]) -> Optional[GpuPeaks]:
    """The table's entry for a device name, or None."""
    if not name:
        return None
    for pattern, key in _PATTERNS:
        if re.search(pattern, name, re.IGNORECASE):
            return PEAKS[key]
    return None


def dtype_key(dtype: Optional[str], tf32: Optional[bool] = None) -> Optional[str]:
    """The table's key for the dtype a step ran in (torch's name, as the
    rank records it: "bfloat16", "float32"...)."""
    if not dtype:
        return None
    name = dtype.replace("torch.", "")
    if name == "float32":
        return "tf32" if tf32 else "fp32"
    if name == "bfloat16":
        return "bf16"
    if name == "float16":
        return "fp16"
    if name.startswith("float8"):
        return "fp8"
    return None


@dataclass(frozen=True)
class Peak:
    """The peak one GPU is held to: FLOP/s, and where the figure came from."""

    flops: float
    source: str
    model: Optional[str] = None
    dtype: Optional[str] = None


def peak_for(name: Optional[str], dtype: Optional[str], tf32: Optional[bool] = None,
             override_tflops: Optional[float] = None) -> tuple[Optional[Peak], Optional[str]]:
    """(the peak, None), or (None, why there is none). `override_tflops`
    (--peak-tflops) wins over the table."""
    key = dtype_key(dtype, tf32)
    if override_tflops is not None:
        return Peak(override_tflops * 1e12, "--peak-tflops", None, key), None
    gpu = match_gpu(name)
    if gpu is None:
        return None, f"no peak known for {name or 'this GPU'} (--peak-tflops X to give it)"
    if key is None:
        return None, f"no peak for dtype {dtype or 'unknown'} (--peak-tflops X to give it)"
    tflops = gpu.tflops.get(key)
    if tflops is None:
        return None, f"the {gpu.model} has no {key} peak (--peak-tflops X to give it)"
    return Peak(tflops * 1e12, gpu.source, gpu.model, key), None
