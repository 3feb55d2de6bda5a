# Runs quant_iq.iq4_levels, the IQ4 formats' 16-level lookup, on every index with and without upper
# bits set, against the levels table. tests/kernels/test_iq4_levels.py builds it for AVX2 (pshufb)
# and baseline x86-64 (lane by lane) and runs it here, so the paths the AVX-512 conformance host never
# takes are executed, not just compiled. Exits 1 on a mismatch.

from std.sys import exit

from kernels.quant_iq import IQ_LANES, KVALUES, iq4_levels


def main():
    var bad = 0
    comptime for high in range(0, 4):
        var q = SIMD[DType.int32, IQ_LANES](0)
        comptime for i in range(IQ_LANES):
            q[i] = Int32((IQ_LANES - 1 - i) + 16 * (high * 5))  # every index, upper bits 0, 80, 160, 240
        var got = iq4_levels(q)
        comptime for i in range(IQ_LANES):
            if got[i] != Float32(KVALUES[IQ_LANES - 1 - i]):
                print("index", IQ_LANES - 1 - i, "upper", high * 80, "got", got[i], "want", KVALUES[IQ_LANES - 1 - i])
                bad += 1
    print("iq4_levels mismatches:", bad)
    if bad:
        exit(1)
