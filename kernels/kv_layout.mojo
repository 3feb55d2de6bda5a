# Where a sequence's keys and values live, for the two attention ops.
#
# Ragged (contiguous): k, v are [T, Hkv, D]; key j of sequence b is row offsets[b] + j.
# Paged: MAX's KV cache buffer kv_blocks [pages, 2, layers, page_size, Hkv, D] (K at index 0 of dim 1,
# V at 1), a page table lookup[b, j // page_size] and slot j % page_size. Strides are read off the
# buffer (MAX may hand a strided view of a larger page slab), so no layout is assumed beyond the dims.

from .common import F32, Ptr

# Struct fields may not carry MutAnyOrigin; the view only lives for one op call, so untracked is right.
comptime UPtr[dtype: DType] = Pointer[Scalar[dtype], MutUntrackedOrigin]


struct KVView[dtype: DType](Copyable, ImplicitlyCopyable, Movable):
    """Addresses key/value rows of one layer, ragged or paged."""

    var _base: UPtr[Self.dtype]       # ragged: k tensor; paged: kv_blocks at (page 0, K, layer, slot 0)
    var _v_base: UPtr[Self.dtype]     # ragged: v tensor; paged: kv_blocks at (page 0, V, layer, slot 0)
    var _lookup: UPtr[DType.uint32]   # paged: [B, max_pages] page ids (unused when ragged)
    var lookup_cols: Int
    var page_size: Int
    var page_shift: Int               # log2(page_size) when it is a power of two, else -1
    var page_stride: Int              # elements between pages
    var slot_stride: Int              # elements between slots (tokens) of a page / rows of ragged K
    var head_stride: Int              # elements between kv heads
    var paged: Bool

    def __init__(
        out self, base: Ptr[Self.dtype], v_base: Ptr[Self.dtype], lookup: Ptr[DType.uint32], lookup_cols: Int,
        page_size: Int, page_stride: Int, slot_stride: Int, head_stride: Int, paged: Bool,
    ):
        self._base = rebind[UPtr[Self.dtype]](base)
        self._v_base = rebind[UPtr[Self.dtype]](v_base)
        self._lookup = rebind[UPtr[DType.uint32]](lookup)
        self.lookup_cols = lookup_cols
        self.page_size = page_size
        # Row addressing runs per key and row: a shift and a mask instead of two integer divisions
        # (MAX's page sizes are powers of two; others keep the division).
        self.page_shift = -1
        if page_size > 0 and (page_size & (page_size - 1)) == 0:
            var shift = 0
            while (1 << shift) < page_size:
                shift += 1
            self.page_shift = shift
        self.page_stride = page_stride
        self.slot_stride = slot_stride
        self.head_stride = head_stride
        self.paged = paged

    @staticmethod
    def ragged(k: Ptr[Self.dtype], v: Ptr[Self.dtype], Hkv: Int, D: Int) -> Self:
        """Contiguous K and V, [T, Hkv, D] each; key j of sequence b is row offsets[b] + j."""
        # No page table. Pointer is non-nullable (a null one fails a compile-time constraint), so K's
        # address stands in for it; it is never read while `paged` is False.
        return Self(k, v, rebind[Ptr[DType.uint32]](k), 0, 0, 0, Hkv * D, D, False)

    @staticmethod
    def paged_dense(
        blocks: Ptr[Self.dtype], lookup: Ptr[DType.uint32], lookup_cols: Int, page_size: Int, n_layers: Int,
        layer: Int, Hkv: Int, D: Int,
    ) -> Self:
        """Layer `layer` of a dense (unstrided) cache [pages, 2, n_layers, page_size, Hkv, D].

        The ops read the strides off the buffer MAX hands them instead; this is for code that lays the
        buffer out itself (profiling drivers, compile checks).
        """
        var slot = Hkv * D
        var layer_stride = page_size * slot
        var kv_stride = n_layers * layer_stride
        var base = blocks.unsafe_offset(layer * layer_stride)
        return Self(base, base.unsafe_offset(kv_stride), lookup, lookup_cols, page_size,
                    Self.dense_page_elems(n_layers, page_size, Hkv, D), slot, D, True)

    @staticmethod
    def dense_page_elems(n_layers: Int, page_size: Int, Hkv: Int, D: Int) -> Int:
        """Elements per page of a dense cache [pages, 2, n_layers, page_size, Hkv, D] (see paged_dense)."""
        return 2 * n_layers * page_size * Hkv * D

    @always_inline
    def base(self) -> Ptr[Self.dtype]:
        return rebind[Ptr[Self.dtype]](self._base)

    @always_inline
    def v_base(self) -> Ptr[Self.dtype]:
        return rebind[Ptr[Self.dtype]](self._v_base)

    @always_inline
    def lookup(self) -> Ptr[DType.uint32]:
        return rebind[Ptr[DType.uint32]](self._lookup)

    @always_inline
    def _offset(self, b: Int, seq_start: Int, j: Int, g: Int) -> Int:
        if self.paged:
            var page_index: Int
            var slot: Int
            if self.page_shift >= 0:
                page_index = j >> self.page_shift
                slot = j & (self.page_size - 1)
            else:
                page_index = j // self.page_size
                slot = j % self.page_size
            var page = Int(self._lookup[unsafe_offset=b * self.lookup_cols + page_index])
            return page * self.page_stride + slot * self.slot_stride + g * self.head_stride
        return (seq_start + j) * self.slot_stride + g * self.head_stride

    @always_inline
    def key(self, b: Int, seq_start: Int, j: Int, g: Int) -> Ptr[Self.dtype]:
        """Key j (position in the sequence) of kv head g of sequence b; seq_start is its first ragged row."""
        return self.base().unsafe_offset(self._offset(b, seq_start, j, g))

    @always_inline
    def value(self, b: Int, seq_start: Int, j: Int, g: Int) -> Ptr[Self.dtype]:
        return self.v_base().unsafe_offset(self._offset(b, seq_start, j, g))
