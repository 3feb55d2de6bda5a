# The bytes of a group of Q4 blocks as the int8 pair rows take them (qgemv_rows_q8.mojo, _pair_group):
# each block pair's nibbles in the pair layout [a lo, b lo, a hi, b hi] (pair_nibbles) and the group's
# raw headers (group_headers). Two forms, chosen at compile time:
#   - portable (AVX2, AVX-512 without VBMI, NEON): per pair two 16-byte loads joined, an and and a
#     shift; one scalar load per header.
#   - NIBBLE_PERM (AVX-512 VBMI + GFNI): per pair one byte permute and one bit-matrix op of a 64-byte
#     window, and the 4 headers of a group one more permute of the first window.

from std.memory import bitcast
from std.sys import llvm_intrinsic
from std.sys._assembly import inlined_assembly
from std.sys.info import CompilationTarget

from .common import BytePtr
from .cpu_tuning import OPAQUE_PERM
from .qdot_int8 import PAIR_LANES
from .quant import block_bytes, header_bytes


# AVX-512 VBMI + GFNI: a block pair's nibbles in the pair layout [a lo, b lo, a hi, b hi] from one
# 64-byte load by one vpermb (the two blocks' packed bytes, each twice) and one vgf2p8affineqb (a
# per-qword bit matrix: x & 0xF on the low 32 bytes, x >> 4 on the high 32). The portable join takes
# two lane-crossing inserts, an and and a shift per pair.
comptime NIBBLE_PERM = (
    PAIR_LANES == 16 and CompilationTarget._has_feature["avx512vbmi"]() and CompilationTarget._has_feature["gfni"]()
)


def _pair_perm[qtype: StaticString, window: Int]() -> SIMD[DType.uint8, 64]:
    # vpermb indices into window 0 (bytes [0, 64) of a group of 4 blocks: pair 0 = blocks 0, 1) or
    # window 1 (bytes [4 bb - 64, 4 bb): pair 1 = blocks 2, 3): [a's 16 packed bytes, b's] twice.
    comptime bb = block_bytes[qtype]()
    comptime head = header_bytes[qtype]()
    var start = 0 if window == 0 else 4 * bb - 64
    var a = 2 * window * bb + head - start
    var idx = SIMD[DType.uint8, 64](0)
    for i in range(64):
        idx[i] = UInt8((a + bb if (i // 16) % 2 == 1 else a) + i % 16)
    return idx


comptime _PERM[qtype: StaticString, window: Int] = _pair_perm[qtype, window]()


def _nibble_matrix() -> SIMD[DType.uint8, 64]:
    # vgf2p8affineqb matrices, one per qword: result bit i = parity(byte 7 - i of the matrix & x).
    # Low 4 qwords: bit i <- bit i (i < 4), x & 0xF. High 4: bit i <- bit i + 4 (i < 4), x >> 4.
    var m = SIMD[DType.uint64, 8](0)
    for q in range(8):
        m[q] = 0x0102040800000000 if q < 4 else 0x1020408000000000
    return bitcast[DType.uint8, 64](m)


comptime _NIBBLE_MATRIX = _nibble_matrix()


# LLVM rewrites a vpermb whose constant indices move whole words or dwords into vpermw or vpermd
# (and a two-source byte or word permute likewise). For Q4_0 (18-byte blocks: every run of bytes starts
# on an even offset) that is vpermw / vpermt2w, which some CPUs run as 2 / 3 uops against one for
# vpermb / vpermt2b. Where cpu_tuning.OPAQUE_PERM holds, Q4_0's indices are therefore hidden from the
# optimizer (an empty asm statement, hoisted out of the loops as any pure value), so the byte permutes
# run. Q4_1's 20-byte blocks give dword permutes, one uop, which measured faster than the byte form:
# Q4_1 always keeps LLVM's choice.
def opaque_perm[qtype: StaticString]() -> Bool:
    """Whether qtype's permute indices are hidden from the optimizer: Q4_0 where OPAQUE_PERM."""
    return OPAQUE_PERM and qtype == "q4_0"


@always_inline
def opaque_indices[hide: Bool](perm: SIMD[DType.uint8, 64]) -> SIMD[DType.uint8, 64]:
    """perm itself; with hide, through an empty asm statement the optimizer cannot see into."""
    comptime if hide:
        return inlined_assembly["", SIMD[DType.uint8, 64], constraints="=v,0", has_side_effect=False](perm)
    return perm


@always_inline
def permute_bytes[hide: Bool](window: SIMD[DType.uint8, 64], perm: SIMD[DType.uint8, 64]) -> SIMD[DType.uint8, 64]:
    """vpermb: byte i of the result is window[perm[i] % 64]; hide: opaque_indices."""
    return llvm_intrinsic["llvm.x86.avx512.permvar.qi.512", SIMD[DType.uint8, 64]](window, opaque_indices[hide](perm))


@always_inline
def _nibbles_vbmi[hide: Bool](window: SIMD[DType.uint8, 64], perm: SIMD[DType.uint8, 64]) -> SIMD[DType.uint8, 64]:
    var ab = permute_bytes[hide](window, perm)
    return llvm_intrinsic["llvm.x86.vgf2p8affineqb.512", SIMD[DType.uint8, 64]](ab, _NIBBLE_MATRIX, Int8(0))


def _header_perm[qtype: StaticString]() -> SIMD[DType.uint8, 64]:
    # vpermb indices moving the headers of blocks 0..3 of a group, all inside its first 64 bytes (block
    # 3's header ends at byte 3 bb + head: 56 for Q4_0, 64 for Q4_1), to the front in block order.
    comptime bb = block_bytes[qtype]()
    comptime head = header_bytes[qtype]()
    comptime assert 3 * bb + head <= 64, "a group's 4 headers must lie in its first 64 bytes"
    var idx = SIMD[DType.uint8, 64](0)
    for i in range(4 * head):
        idx[i] = UInt8((i // head) * bb + i % head)
    return idx


comptime _HEADER_PERM[qtype: StaticString] = _header_perm[qtype]()


@always_inline
def group_headers[qtype: StaticString, NP: Int, H: DType](blk: BytePtr, win0: SIMD[DType.uint8, 64]) -> SIMD[H, 2 * NP]:
    """The raw headers of the 2 NP blocks from `blk` on, one H word each (Q4_0 d: uint16; Q4_1 d, m:
    uint32). With NIBBLE_PERM and NP == 2 one vpermb of win0 (the group's first 64 bytes) instead of
    4 scalar loads and 3 inserts."""
    comptime bb = block_bytes[qtype]()
    comptime head = header_bytes[qtype]()
    comptime if NIBBLE_PERM and NP == 2:
        var words = bitcast[H, 64 // head](permute_bytes[opaque_perm[qtype]()](win0, _HEADER_PERM[qtype]))
        return rebind[SIMD[H, 2 * NP]](words.slice[4, offset=0]())
    var h = SIMD[H, 2 * NP](0)
    comptime for j in range(2 * NP):
        h[j] = blk.unsafe_offset(j * bb).unsafe_bitcast[Scalar[H]]()[unsafe_offset=0]
    return h


@always_inline
def pair_nibbles[qtype: StaticString, NP: Int](blk: BytePtr, win0: SIMD[DType.uint8, 64]) -> Array[SIMD[DType.uint8, 64], NP]:
    # The nibbles of NP block pairs from `blk` on, each in the pair layout [a lo, b lo, a hi, b hi].
    # win0: the group's first 64 bytes, as _pair_group loaded them (used with NIBBLE_PERM and NP == 2).
    # With NIBBLE_PERM two pairs read two 64-byte windows of their 4 blocks: the first starts at
    # block 0, the second ends with block 3, so neither reads outside the group.
    comptime bb = block_bytes[qtype]()
    comptime head = header_bytes[qtype]()
    var wq = Array[SIMD[DType.uint8, 64], NP](fill=SIMD[DType.uint8, 64](0))
    comptime if NIBBLE_PERM and NP == 2:
        wq[0] = _nibbles_vbmi[opaque_perm[qtype]()](win0, _PERM[qtype, 0])
        wq[1] = _nibbles_vbmi[opaque_perm[qtype]()](blk.unsafe_offset(4 * bb - 64).unsafe_load[width=64](0), _PERM[qtype, 1])
    else:
        comptime for u in range(NP):
            var q = blk.unsafe_offset(2 * u * bb + head).unsafe_load[width=16](0).join(
                blk.unsafe_offset((2 * u + 1) * bb + head).unsafe_load[width=16](0))
            wq[u] = (q & 0xF).join(q >> 4)
    return wq^
