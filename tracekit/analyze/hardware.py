"""Peak dense FLOP/s per dtype and HBM bandwidth of the accelerators traces come from.

`device_peaks(name)` matches a `deviceProperties` name (case-insensitive substring, most specific first)
to a row of `DEVICES`. Figures are the vendors' data-sheet numbers WITHOUT structured sparsity (dense);
a dtype a device row lacks has no peak (no roofline for it: never guessed). Sources:
- NVIDIA A100: https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
- NVIDIA H100 SXM / PCIe / NVL: https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet
- NVIDIA H200: https://www.nvidia.com/en-us/data-center/h200/ (H100's compute, 4.8 TB/s HBM3e)
- NVIDIA GH200: https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/
- NVIDIA B200 / B300 (HGX, per GPU = the 8-GPU figure / 8; dense = sparse / 2):
  https://www.nvidia.com/en-us/data-center/hgx/
- NVIDIA GB200 / GB300 (NVL72 figure / 72): https://www.nvidia.com/en-us/data-center/gb200-nvl72/,
  https://www.nvidia.com/en-us/data-center/gb300-nvl72/
- NVIDIA V100: https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf
- NVIDIA L40S / L4 / A10: https://www.nvidia.com/en-us/data-center/l40s/, /l4/, /products/a10-gpu/
- AMD MI210 / MI250 / MI250X: https://www.amd.com/en/products/accelerators/instinct/mi200.html
- AMD MI300X / MI300A / MI325X: https://www.amd.com/en/products/accelerators/instinct/mi300.html
  (MI300X data sheet: amd-instinct-mi300x-data-sheet.pdf; MI325X: MI300X compute, 6 TB/s HBM3E)
- AMD MI350X / MI355X: https://www.amd.com/en/products/accelerators/instinct/mi350.html
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DevicePeaks:
    name: str
    """The device as the table names it."""
    match: tuple[str, ...]
    """Upper-case substrings of a deviceProperties name that select this row."""
    tflops: dict[str, float] = field(default_factory=dict)
    """Dense peak TFLOP/s per dtype: fp64, fp32, tf32, bf16, fp16, fp8, fp4 (matrix/tensor units)."""
    hbm_tbps: float | None = None
    """Peak memory bandwidth, TB/s (10^12 bytes/s)."""

    def peak_tflops(self, dtype: str | None) -> float | None:
        return self.tflops.get(dtype or "")


_H100 = {"fp64": 67.0, "fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}
_MI300X = {"fp64": 163.4, "fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9}

DEVICES: tuple[DevicePeaks, ...] = (
    DevicePeaks("NVIDIA GB300", ("GB300",), {"tf32": 1250.0, "bf16": 2500.0, "fp16": 2500.0, "fp8": 5000.0,
                                             "fp4": 15000.0}, 8.0),
    DevicePeaks("NVIDIA GB200", ("GB200",), {"fp64": 45.0, "tf32": 1250.0, "bf16": 2500.0, "fp16": 2500.0,
                                             "fp8": 5000.0, "fp4": 10000.0}, 8.0),
    DevicePeaks("NVIDIA B300", ("B300",), {"tf32": 1125.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0,
                                           "fp4": 13125.0}, 8.0),
    DevicePeaks("NVIDIA B200", ("B200",), {"fp64": 37.0, "tf32": 1125.0, "bf16": 2250.0, "fp16": 2250.0,
                                           "fp8": 4500.0, "fp4": 9000.0}, 8.0),
    DevicePeaks("NVIDIA GH200", ("GH200",), _H100, 4.0),
    DevicePeaks("NVIDIA H200", ("H200",), _H100, 4.8),
    DevicePeaks("NVIDIA H100 PCIe", ("H100 PCIE",), {"fp64": 51.0, "fp32": 51.0, "tf32": 378.0, "bf16": 756.5,
                                                     "fp16": 756.5, "fp8": 1513.0}, 2.0),
    DevicePeaks("NVIDIA H100 NVL", ("H100 NVL",), {"fp64": 60.0, "fp32": 60.0, "tf32": 417.5, "bf16": 835.5,
                                                   "fp16": 835.5, "fp8": 1670.5}, 3.9),
    DevicePeaks("NVIDIA H100 SXM", ("H100",), _H100, 3.35),
    DevicePeaks("NVIDIA A100 80GB PCIe", ("A100 80GB PCIE", "A100-PCIE-80GB"),
                {"fp64": 19.5, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}, 1.935),
    DevicePeaks("NVIDIA A100 80GB SXM", ("A100-SXM4-80GB", "A100-SXM-80GB", "A100 80GB"),
                {"fp64": 19.5, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}, 2.039),
    DevicePeaks("NVIDIA A100 40GB", ("A100",), {"fp64": 19.5, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0,
                                                "fp16": 312.0}, 1.555),
    DevicePeaks("NVIDIA L40S", ("L40S",), {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05,
                                           "fp8": 733.0}, 0.864),
    DevicePeaks("NVIDIA L40", ("NVIDIA L40",), {"fp32": 90.5, "tf32": 90.5, "bf16": 181.0, "fp16": 181.0,
                                                "fp8": 362.0}, 0.864),
    DevicePeaks("NVIDIA L4", ("NVIDIA L4",), {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0,
                                              "fp8": 242.5}, 0.3),
    DevicePeaks("NVIDIA A10", ("A10G", "NVIDIA A10"), {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
                0.6),
    DevicePeaks("NVIDIA V100 PCIe", ("V100-PCIE", "V100 PCIE"), {"fp64": 7.0, "fp32": 14.0, "fp16": 112.0}, 0.9),
    DevicePeaks("NVIDIA V100 SXM2", ("V100",), {"fp64": 7.8, "fp32": 15.7, "fp16": 125.0}, 0.9),
    DevicePeaks("AMD Instinct MI355X", ("MI355X",), {"fp64": 78.6, "fp32": 157.3, "bf16": 2516.6, "fp16": 2516.6,
                                                     "fp8": 5033.2, "fp4": 10066.3}, 8.0),
    DevicePeaks("AMD Instinct MI350X", ("MI350X",), {"fp64": 72.1, "fp32": 144.2, "bf16": 2306.9, "fp16": 2306.9,
                                                     "fp8": 4613.7, "fp4": 9227.5}, 8.0),
    DevicePeaks("AMD Instinct MI325X", ("MI325X",), _MI300X, 6.0),
    DevicePeaks("AMD Instinct MI300A", ("MI300A",), {"fp64": 122.6, "fp32": 122.6, "tf32": 490.3, "bf16": 980.6,
                                                     "fp16": 980.6, "fp8": 1961.2}, 5.3),
    DevicePeaks("AMD Instinct MI300X", ("MI300X", "MI300"), _MI300X, 5.3),
    DevicePeaks("AMD Instinct MI250X", ("MI250X",), {"fp64": 95.7, "fp32": 95.7, "bf16": 383.0, "fp16": 383.0},
                3.2),
    DevicePeaks("AMD Instinct MI250", ("MI250",), {"fp64": 90.5, "fp32": 90.5, "bf16": 362.1, "fp16": 362.1}, 3.2),
    DevicePeaks("AMD Instinct MI210", ("MI210",), {"fp64": 45.3, "fp32": 45.3, "bf16": 181.0, "fp16": 181.0}, 1.6),
)


def device_peaks(device_name: str | None) -> DevicePeaks | None:
    """The row of DEVICES a deviceProperties name matches (first match in table order), else None."""
    if not device_name:
        return None
    up = device_name.upper()
    for dev in DEVICES:
        if any(key in up for key in dev.match):
            return dev
    return None
