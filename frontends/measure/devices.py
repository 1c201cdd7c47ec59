"""Known devices for offline planning: peak dense FLOP/s per precision, bandwidth, memory.

Users plan on a laptop for a GPU they rent later, so the roofline cost model needs the target's
numbers without the target. Every figure comes from the vendor's datasheet or architecture
whitepaper (named in ``source``); tensor-core figures are *dense*: NVIDIA's headline numbers for
Ampere and later include 2:4 structured sparsity, and those are halved here. Memory is the
datasheet's "GB" read as 10^9 bytes (the project's budget convention), which is at or below the
capacity the device reports, so a default budget of ``memory_bytes`` is not optimistic about
capacity (the CUDA context and other processes still take their share).

Precisions follow what PyTorch runs: ``fp32`` is fp32 matmul without TF32 (PyTorch's default),
``tf32`` fp32 matmul with ``allow_tf32``, ``fp16``/``bf16`` tensor-core matmul with fp32
accumulation (what cuBLAS uses for PyTorch), ``fp64`` the FP64 tensor-core rate where the GPU has
one. Where a precision has no hardware path (TF32 before Ampere, bf16 on Volta/Turing) the next
slower path's rate is used and the ``notes`` say so. This module imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

TERA = 1e12
GIGA = 1e9

PRECISIONS = ("fp64", "fp32", "tf32", "fp16", "bf16")


@dataclass(frozen=True, kw_only=True)
class DeviceSpec:
    """One device's roofline: what a FLOP at each precision and a byte of memory traffic cost."""

    name: str
    """Key in `DEVICES` (what ``--device`` takes)."""
    product: str
    """The product the numbers are for (form factor matters: SXM and PCIe differ)."""
    fp64: float
    """Peak dense FLOP/s in float64."""
    fp32: float
    """Peak dense FLOP/s in float32 without TF32 (CUDA cores)."""
    tf32: float
    """Peak dense FLOP/s of float32 matmul on TF32 tensor cores."""
    fp16: float
    """Peak dense FLOP/s in float16 (tensor cores, fp32 accumulation)."""
    bf16: float
    """Peak dense FLOP/s in bfloat16 (tensor cores, fp32 accumulation)."""
    bandwidth: float
    """Peak memory bandwidth, bytes/s."""
    memory_bytes: int
    """Device memory, bytes (datasheet GB as 10^9)."""
    source: str
    """Where the numbers come from."""
    notes: str = ""
    """Figures that are derived rather than printed in the source."""

    def peak(self, precision: str) -> float:
        """Peak dense FLOP/s for one of `PRECISIONS`."""
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
        return float(getattr(self, precision))


def _spec(name: str, product: str, *, fp64: float, fp32: float, tf32: float, fp16: float,
          bf16: float, bandwidth_gbs: float, memory_gb: float, source: str, notes: str = "") -> DeviceSpec:
    """A spec from datasheet units: TFLOP/s, GB/s and GB."""
    return DeviceSpec(
        name=name, product=product, fp64=fp64 * TERA, fp32=fp32 * TERA, tf32=tf32 * TERA,
        fp16=fp16 * TERA, bf16=bf16 * TERA, bandwidth=bandwidth_gbs * GIGA,
        memory_bytes=int(memory_gb * GIGA), source=source, notes=notes,
    )


_HOPPER_NOTE = "TF32/FP16/BF16 are the datasheet's sparsity figures (989 / 1,979 TFLOPS) halved"

DEVICES: dict[str, DeviceSpec] = {
    spec.name: spec
    for spec in (
        _spec("h100", "NVIDIA H100 SXM5 80GB", fp64=67, fp32=67, tf32=494.5, fp16=989.5, bf16=989.5,
              bandwidth_gbs=3350, memory_gb=80,
              source="NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column", notes=_HOPPER_NOTE),
        _spec("h200", "NVIDIA H200 SXM 141GB", fp64=67, fp32=67, tf32=494.5, fp16=989.5, bf16=989.5,
              bandwidth_gbs=4800, memory_gb=141,
              source="NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column", notes=_HOPPER_NOTE),
        _spec("a100-80gb", "NVIDIA A100 SXM4 80GB", fp64=19.5, fp32=19.5, tf32=156, fp16=312, bf16=312,
              bandwidth_gbs=2039, memory_gb=80,
              source="NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM column"),
        _spec("a100-40gb", "NVIDIA A100 SXM4 40GB", fp64=19.5, fp32=19.5, tf32=156, fp16=312, bf16=312,
              bandwidth_gbs=1555, memory_gb=40,
              source="NVIDIA A100 Tensor Core GPU datasheet, A100 40GB SXM column"),
        _spec("l4", "NVIDIA L4 24GB", fp64=30.3 / 64, fp32=30.3, tf32=60, fp16=121, bf16=121,
              bandwidth_gbs=300, memory_gb=24,
              source="NVIDIA L4 Tensor Core GPU datasheet",
              notes="TF32/FP16/BF16 are the datasheet's sparsity figures (120 / 242) halved; FP64 is "
                    "not in the datasheet: 1/64 of FP32, the compute-capability-8.9 rate in the CUDA "
                    "C++ Programming Guide's throughput table"),
        _spec("rtx4090", "NVIDIA GeForce RTX 4090 24GB", fp64=82.6 / 64, fp32=82.6, tf32=82.6,
              fp16=165.2, bf16=165.2, bandwidth_gbs=1008, memory_gb=24,
              source="NVIDIA Ada GPU Architecture whitepaper, Appendix A (GeForce RTX 4090)",
              notes="FP16/BF16 with FP32 accumulate (GeForce runs it at half the FP16-accumulate "
                    "rate of 330 TFLOPS); FP64 is 1/64 of FP32 (compute capability 8.9)"),
        _spec("v100", "NVIDIA V100 SXM2 32GB", fp64=7.8, fp32=15.7, tf32=15.7, fp16=125, bf16=15.7,
              bandwidth_gbs=900, memory_gb=32,
              source="NVIDIA V100 Tensor Core GPU datasheet, V100 SXM2 column",
              notes="no TF32 or BF16 hardware: fp32 rate used for both"),
        _spec("t4", "NVIDIA T4 16GB", fp64=8.1 / 32, fp32=8.1, tf32=8.1, fp16=65, bf16=8.1,
              bandwidth_gbs=320, memory_gb=16,
              source="NVIDIA T4 Tensor Core GPU datasheet (mixed-precision FP16/FP32: 65 TFLOPS)",
              notes="no TF32 or BF16 hardware: fp32 rate used for both; FP64 is 1/32 of FP32 "
                    "(compute capability 7.5, CUDA C++ Programming Guide)"),
        _spec("cpu-nominal", "nominal CPU", fp64=0.5, fp32=1.0, tf32=1.0, fp16=1.0, bf16=1.0,
              bandwidth_gbs=100, memory_gb=64,
              source="nominal (no datasheet): the 'flops' cost model's 1 TFLOP/s and 100 GB/s",
              notes="a placeholder for planning CPU runs; use the 'profile' cost model for real times"),
    )
}


_PRODUCT_KEYS: tuple[tuple[str, str], ...] = (
    ("H200", "h200"), ("H100", "h100"), ("A100", "a100"), ("L40", ""), ("L4", "l4"),
    ("4090", "rtx4090"), ("V100", "v100"), ("T4", "t4"),
)
"""Substring of the name CUDA reports -> key in `DEVICES` ("" : a GPU not in the table, such as
an L40 that "L4" would otherwise match); the first match wins."""


def device_of_product(product: str, memory_bytes: int) -> DeviceSpec | None:
    """The spec of a GPU from the name and memory CUDA reports (``torch.cuda.get_device_name``,
    ``total_memory``), or None when it is not in `DEVICES`. An A100 is the 80 GB one above 50 GB."""
    for key, name in _PRODUCT_KEYS:
        if key in product.upper():
            if name == "a100":
                name = "a100-80gb" if memory_bytes > 50 * GIGA else "a100-40gb"
            return DEVICES.get(name)
    return None


def get_device(name: str) -> DeviceSpec:
    """The spec for ``name`` (case-insensitive); ValueError listing the known names otherwise."""
    spec = DEVICES.get(name.strip().lower())
    if spec is None:
        raise ValueError(f"unknown device {name!r}: known devices are {', '.join(sorted(DEVICES))}")
    return spec
