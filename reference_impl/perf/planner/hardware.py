"""GPUs and clusters: peak, memory, links, and each GPU's layer-time model.

Peaks and memory bandwidths from the vendors' data sheets (dense BF16 tensor-core figures);
links per GPU and direction as NCCL's bus bandwidth reaches them (about 80% of nominal); the
inter-node figure each GPU's share of its node's NICs. ``GPU_VARIANTS`` are the memory and
bandwidth variants of each type; ``Cluster.usable_bytes`` leaves out what lives outside the
caching allocator (:func:`outside_allocator_bytes`). The figures: docs/library.md, 'The
planner's model, term by term'.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from reference_impl.perf.planner.cluster_compute import ClusterTerms, terms_of
from reference_impl.perf.planner.layer_efficiency import H100_TABLE, LayerEfficiency
from reference_impl.perf.planner.model_spec import positive

GiB = 2 ** 30
GB = 10 ** 9

# Dense peak TFLOP/s by device name, as torch.cuda.get_device_name gives it (first match wins,
# so the specific names come first): NVIDIA's data sheets, sparsity's 2x removed; bf16 tensor
# cores, and plain fp32 (no TF32: PyTorch's default for matmuls).
DATASHEET_PEAK_TFLOPS = (
    ("H100 PCIE", {"bf16": 756.0, "fp32": 51.0}),
    ("H100 NVL", {"bf16": 835.0, "fp32": 60.0}),
    ("H100", {"bf16": 989.0, "fp32": 67.0}),  # SXM
    ("H200 NVL", {"bf16": 835.0, "fp32": 60.0}),
    ("H200", {"bf16": 989.0, "fp32": 67.0}),  # SXM
    ("A100", {"bf16": 312.0, "fp32": 19.5}),
)


def peak_tflops(device_name: str, dtype: str = "bf16") -> float | None:
    """The data sheet's dense peak for a GPU of this name and dtype; None when the name is not
    in the table."""
    name = device_name.upper()
    return next((peaks[dtype] for key, peaks in DATASHEET_PEAK_TFLOPS if key in name), None)


# H100: the five numbers fitted to data/h100_layer_efficiency.json by layer_efficiency.fit
# (tests/library/planner/test_planner_efficiency.py refits the table and checks these).
H100_LAYER = LayerEfficiency(
    device="H100 SXM", peak_flops=989e12, memory_bandwidth=3.35e12, e_gemm=0.6830,
    gemm_fixed_flops=6.595e10, e_attention=0.4643, elementwise_s=2.514e-11,
    launch_floor_s=2.05e-3, source=f"fitted to {H100_TABLE.name} (measured on one H100)")

# A100: no calibration table was measured here. The H100's shape model moved to the A100's peak
# and memory bandwidth, with ONE number fitted: the GEMM ceiling e_gemm, to the ten rows of
# Narayanan et al. 2021, Table 1 (validation.fit_a100_ceiling; the test refits it).
A100_E_GEMM = 0.660
A100_LAYER = H100_LAYER.for_device(
    "A100 SXM", 312e12, 2.04e12, A100_E_GEMM,
    "H100 shape model; ceiling fitted to Narayanan et al. 2021, Table 1")

# H200: the H100's die with more and faster memory; until `calibrate` measures it, the H100's
# numbers with the elementwise term scaled to its bandwidth.
H200_LAYER = H100_LAYER.for_device("H200", 989e12, 4.8e12, H100_LAYER.e_gemm,
                                   "H100 table, scaled to H200 memory bandwidth")


@dataclass(frozen=True)
class GPU:
    """A GPU part: its name (the type first: "H100 80GB"), memory, layer-time model, and for
    the variants the board power and the data sheet the figures come from."""
    name: str
    memory_gib: float
    layer: LayerEfficiency
    power_w: float = 0.0
    source: str = ""

    @property
    def peak_tflops(self) -> float:
        return self.layer.peak_flops / 1e12


GPUS = {
    "a100": GPU("A100 80GB", 80.0, A100_LAYER),
    "h100": GPU("H100 80GB", 80.0, H100_LAYER),
    "h200": GPU("H200 141GB", 141.0, H200_LAYER),
}
H100_DATASHEET = "NVIDIA H100 Tensor Core GPU data sheet"
A100_DATASHEET = "NVIDIA A100 Tensor Core GPU data sheet"
H200_DATASHEET = "NVIDIA H200 Tensor Core GPU data sheet"
TORCHTITAN_H100 = "torchtitan benchmarks/llama3_h100_202412_torchtitan.md (Hardware)"


def variant(base: GPU, name: str, memory_gib: float, bandwidth_tbs: float, power_w: float,
            source: str, peak_tflops: float | None = None) -> GPU:
    """``base``'s layer-time model moved to another part's bandwidth (and peak, when the data
    sheet gives another), with the same GEMM ceiling: what the variant is priced with."""
    peak = (peak_tflops or base.peak_tflops) * 1e12
    layer = base.layer.for_device(name, peak, bandwidth_tbs * 1e12, base.layer.e_gemm,
                                  f"{base.layer.device} model at {source}'s figures")
    return GPU(name, memory_gib, layer, power_w, source)


GPU_VARIANTS = {  # memory (GB as sold, GiB here as GPUS counts it), TB/s, W: the data sheets
    "h100-sxm-80gb": variant(GPUS["h100"], "H100 SXM 80GB", 80, 3.35, 700, H100_DATASHEET),
    # HBM2e, 500 W power limit; the peak is between SXM's and NVL's, unknown (torchtitan's
    # footnote): the SXM figure is kept, as torchtitan's MFU keeps it
    "h100-sxm-96gb": variant(GPUS["h100"], "H100 SXM 96GB HBM2e", 96, 2.4, 500,
                             TORCHTITAN_H100),
    "h100-pcie-80gb": variant(GPUS["h100"], "H100 PCIe 80GB", 80, 2.0, 350, H100_DATASHEET,
                              756),
    "h100-nvl-94gb": variant(GPUS["h100"], "H100 NVL 94GB", 94, 3.9, 400, H100_DATASHEET, 835),
    "a100-40gb": variant(GPUS["a100"], "A100 SXM 40GB", 40, 1.555, 400, A100_DATASHEET),
    "a100-80gb": variant(GPUS["a100"], "A100 SXM 80GB", 80, 2.039, 400, A100_DATASHEET),
    "h200-141gb": variant(GPUS["h200"], "H200 SXM 141GB", 141, 4.8, 700, H200_DATASHEET),
}

# Outside PyTorch's caching allocator, so in nvidia-smi's "memory used" but in neither
# torch.cuda.memory_allocated nor memory_reserved (PyTorch docs, "CUDA semantics: memory
# management"): the CUDA context (its kernels and driver state; some hundreds of MiB with
# CUDA's lazy module loading, more with cuBLAS/cuDNN/NCCL kernels loaded) and NCCL's own
# buffers (cudaMalloc'd by NCCL: NCCL_BUFFSIZE, 4 MiB by default, per channel, per peer and
# protocol; NVLS buffers on NVSwitch systems). Assumed figures, not measured here.
CUDA_CONTEXT_BYTES = 1.0 * GiB
NCCL_BUFFER_BYTES = 2.0 * GiB


def outside_allocator_bytes() -> float:
    """GPU memory that PyTorch's counters do not see: the CUDA context and NCCL's buffers."""
    return CUDA_CONTEXT_BYTES + NCCL_BUFFER_BYTES


LINKS = {  # GB/s per GPU and direction as reached (docs/library.md): intra-node, inter-node
    "a100": (240.0, 20.0),
    "h100": (360.0, 40.0),
    "h200": (360.0, 40.0),
}


@dataclass(frozen=True)
class Cluster:
    """GPUs per node x nodes; memory in GiB, bandwidths per GPU in GB/s, latencies in s."""
    gpus_per_node: int = 8
    nodes: int = 16
    gpu: GPU = field(default=GPUS["h100"])
    intra_bw_gbs: float = LINKS["h100"][0]
    inter_bw_gbs: float = LINKS["h100"][1]
    intra_alpha: float = 5e-6
    inter_alpha: float = 10e-6
    reserve: float = 0.0             # a further share of memory kept back, if wanted
    terms: ClusterTerms = field(default=terms_of("h100"))

    def __post_init__(self):
        for name in ("gpus_per_node", "nodes", "intra_bw_gbs", "inter_bw_gbs"):
            positive(name, getattr(self, name))
        if not 0 <= self.reserve < 1:
            raise ValueError(f"reserve must be in [0, 1), got {self.reserve}")
        if self.intra_alpha < 0 or self.inter_alpha < 0:
            raise ValueError(f"latencies must be >= 0, got {self.intra_alpha}, {self.inter_alpha}")

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def gpu_memory_gib(self) -> float:
        return self.gpu.memory_gib

    @property
    def usable_bytes(self) -> float:
        """What the caching allocator may reserve: the memory less the CUDA context and
        NCCL's buffers (``outside_allocator_bytes``), less ``reserve`` of it if set."""
        return (self.gpu.memory_gib * GiB - outside_allocator_bytes()) * (1 - self.reserve)

    def link(self, group_span: int) -> tuple[float, float]:
        """(alpha, bytes/s) of a group whose ranks span ``group_span`` consecutive GPUs."""
        if group_span <= self.gpus_per_node:
            return self.intra_alpha, self.intra_bw_gbs * GB
        return self.inter_alpha, self.inter_bw_gbs * GB


def cluster_of(name: str | GPU, nodes: int, gpus_per_node: int = 8, **overrides) -> Cluster:
    """A cluster of a known GPU type (a100, h100, h200) or variant (``GPU_VARIANTS``) with its
    type's links and end-to-end terms. ``name`` may be a :class:`GPU` (its type read from its
    name, e.g. "H100 94GB"), and
    ``gpu=`` replaces the GPU while keeping the named type's links and terms, as any other
    field of :class:`Cluster` may be replaced."""
    if isinstance(name, str) and name.lower() in GPU_VARIANTS:
        name = GPU_VARIANTS[name.lower()]
    kind = gpu_kind(name.name if isinstance(name, GPU) else name)
    options = dict(gpus_per_node=gpus_per_node, nodes=nodes,
                   gpu=name if isinstance(name, GPU) else GPUS[kind],
                   intra_bw_gbs=LINKS[kind][0], inter_bw_gbs=LINKS[kind][1],
                   terms=terms_of(kind))
    options.update(overrides)
    return Cluster(**options)


def gpu_kind(name: str) -> str:
    """The known GPU type (a100, h100, h200) a name starts with: "h100", "H100 80GB"."""
    key = name.split()[0].lower() if name.strip() else name
    if key not in GPUS:
        raise ValueError(f"unknown GPU {name!r}; choose one of {', '.join(GPUS)}")
    return key


def gpu_with_memory(name: str, memory_gib: float) -> GPU:
    """A known GPU type or variant with another memory size (an H100 NVL's 94 GB, say)."""
    positive("GPU memory", memory_gib)
    spec = GPU_VARIANTS.get(name.lower()) or GPUS[gpu_kind(name)]
    return replace(spec, name=f"{spec.name.split()[0]} {memory_gib:g}GB", memory_gib=memory_gib)
