# Per-host CPU tuning table: the one place for kernel constants that differ by target CPU, chosen by
# Mojo's name for the compile target (CompilationTarget._is_arch). No other kernel file tests the
# target's name; choices that follow from the ISA (vector width, VNNI, VBMI, GFNI) stay with their
# kernels. Every other target takes the default, the setting measured best (or not worse) elsewhere.
# Names: "znver4" / "znver5" are AMD Zen 4 / Zen 5; "rocketlake" is what Mojo detects on the AVX-512
# Intel Xeon VM we measured. Each value says why in a line; docs/kernels.md has the reasoning and
# benchmarks/results/ the measurements.

from std.sys.info import CompilationTarget

comptime _ZEN4 = CompilationTarget._is_arch["znver4"]()
comptime _ZEN5 = CompilationTarget._is_arch["znver5"]()
comptime _ROCKETLAKE = CompilationTarget._is_arch["rocketlake"]()

# attention_cpu: slot-ordered decode prefetches the next key window into L2 (and uses 32-key windows so
# two fit L2). Faster on Zen 4; no gain on Zen 3 (Zen 5: the burst form gained nothing, spread untried).
comptime NEXT_WINDOW_PREFETCH = _ZEN4

# gemm_cpu MR: micro-tile rows. 5 where the compiler's schedule for the target spills the 6-row tile's
# accumulators inside the FMA loop (rocketlake); 6 elsewhere (more FMAs per load, no spills).
comptime GEMM_MR = 5 if _ROCKETLAKE else 6

# gemm_cpu KC on AVX-512 (AVX2 always takes 384): a 384-deep k-block (fewer passes over C) measured
# best on Zen 4; 128 (the panel stays in L1) stays where it was measured best, the first AVX-512 host.
comptime GEMM_KC_AVX512 = 384 if _ZEN4 else 128

# gemv_cpu: prefetch weight rows this many row groups ahead. Faster on Zen 4; on Zen 3 and the first
# AVX-512 host it gained nothing or lost, so they keep the hardware prefetchers alone (0).
comptime GEMV_PREFETCH_GROUPS = 2 if _ZEN4 else 0

# qgemv_rows: large decode tasks prefetch at two distances (L1 and L2) instead of one. Faster on Zen 4;
# slower on Zen 3; the other hosts keep the single distance.
comptime FAR_PREFETCH = _ZEN4

# qgemv_rows: the two-distance prefetch for the batch-1 int8 pair rows only: also faster on rocketlake
# (2 MB L2 per core), where the other rows lost with it.
comptime FAR_PREFETCH_PAIRS = FAR_PREFETCH or _ROCKETLAKE

# qpair_bytes: hide Q4_0's permute indices from LLVM so its byte permutes are not turned into word
# permutes, which cost 2-3 uops on Intel against one; Zen 4 / Zen 5 keep LLVM's choice (measured so).
comptime OPAQUE_PERM = not (_ZEN4 or _ZEN5)
