# Crucible's Mojo kernel library: custom ops for the hot path of Llama-family models.
#
# Every op is registered with @extensibility.register under the name "crucible.<op>" and has one body
# with a CPU branch and a GPU branch (comptime if target == "cpu" / else). Variants are compile-time
# parameters of the op (passed from Python through ops.custom(parameters=...)), never copies.
#
#   crucible.matmul          matmul.mojo          y[M,N] = x[M,K] @ W[N,K]^T
#   crucible.qmatmul         qmatmul.mojo         y = x @ dequant(Wq)^T, Wq in GGUF blocks (Q4_0/Q4_1/Q8_0/F16);
#                                                 act="q8": int8 activations on CPU (qdot_int8.mojo)
#   crucible.embedding       embedding.mojo       rows of a float or GGUF-block table
#   crucible.attention_ragged  attention.mojo     causal GQA prefill over a ragged batch (contiguous K/V)
#   crucible.attention_paged   attention.mojo     prefill-with-history and decode from MAX's paged KV cache
#   crucible.kv_cache_write  kv_cache.mojo        stores new K/V rows into their pages
#   crucible.qkv_rope_write  qkv_rope_write.mojo  fused qkv -> roped q, and roped k + v into the paged cache
#   crucible.rmsnorm         rmsnorm.mojo
#   crucible.add_rmsnorm     rmsnorm.mojo         residual add + rmsnorm, both results
#   crucible.rope            rope.mojo            half-split (HF Llama) and interleaved (GGUF Llama) layouts
#   crucible.silu_mul        silu_mul.mojo        silu(gate) * up on a fused [T, 2I] gate|up projection
#   crucible.read_bandwidth  bandwidth.mojo       a plain read-bandwidth probe (benchmark ceiling)
#   crucible.overhead_probe  overhead.mojo        x + 1: the fixed cost of an op, serial or parallel (benchmark floor)
