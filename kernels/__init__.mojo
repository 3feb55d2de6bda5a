# Crucible's Mojo kernel library: custom ops for the hot path of Llama-family models.
#
# Every op is registered with @extensibility.register as "crucible.<op>" and has one body with a CPU
# and a GPU branch (comptime if target == "cpu" / else). Variants are compile-time parameters of the
# op (ops.custom(parameters=...) from Python), never copies. Per-host CPU constants: cpu_tuning.mojo.
#
#   matmul.mojo          matmul: y[M,N] = x[M,K] @ W[N,K]^T
#   qmatmul.mojo         qmatmul: y = x @ dequant(Wq)^T, every GGUF block format; act="q8": int8 x on CPU
#   qmatmul2.mojo        qmatmul2: two such projections of one x in one op, concatenated or gated (SwiGLU)
#   mlp.mojo             mlp: the gated MLP (gate|up, activation, down) in one op, two phases on CPU
#   embedding.mojo       embedding: rows of a float or GGUF-block table
#   attention.mojo       attention_ragged (causal GQA prefill, contiguous K/V), attention_paged (prefill
#                        with history and decode from MAX's paged KV cache)
#   kv_cache.mojo        kv_cache_write; qkv_rope_write.mojo: fused qkv -> roped q, roped k + v to cache
#   rmsnorm.mojo         rmsnorm, add_rmsnorm (residual add + rmsnorm); rope.mojo: rope (half-split and
#                        interleaved); silu_mul.mojo: silu(gate) * up on a fused [T, 2I] projection
#   bandwidth.mojo       read_bandwidth (benchmark ceiling); overhead.mojo: overhead_probe (floor)
