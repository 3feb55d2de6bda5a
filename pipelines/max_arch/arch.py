"""The SupportedArchitecture entries for Crucible's Llama-family graph, and the CPU batch-size default.

Registered under MAX's Hugging Face class names so ``--custom-architectures`` swaps our graph in for
MAX's built-in Llama and Qwen2 graphs. Encodings are the ones MAX's config machinery knows and our
kernels run: float32 and bfloat16 safetensors (converted to float32 at load: MAX runs CPU graphs in
float32), and GGUF files whose majority type MAX calls q4_0. MAX has no name for q4_1 or q8_0, so a
Q4_1 GGUF such as SmolLM2's is refused by MAX's config resolution before our code runs; our own
engine (``crucible serve``/``crucible batch``) serves those.
"""

from __future__ import annotations

from typing import Any

from max.graph.weights import WeightsFormat
from max.pipelines.architectures.llama3.batch_processor import Llama3BatchProcessor
from max.pipelines.architectures.llama3.model_config import Llama3Config
from max.pipelines.context import TextContext
from max.pipelines.kv_cache.memory_planner import PagedMemoryPlanner
from max.pipelines.lib import SupportedArchitecture, TextTokenizer
from max.pipelines.modeling.types import PipelineTask

from pipelines.max_arch.model import CrucibleLlamaModel
from pipelines.scheduler import DEFAULT_CPU_BATCH

# MAX's memory planner gives CPU one sequence per batch unless told otherwise; we default to our
# engine's batch (a CPU KV page costs little). --max-batch-size overrides it.
CPU_DEFAULT_MAX_BATCH_SIZE = DEFAULT_CPU_BATCH


class CruciblePlanner(PagedMemoryPlanner):
    """MAX's paged planner with a CPU default batch size that serves concurrent users."""

    def infer_max_batch_size(self, pipeline_config: Any, devices: list[Any], weights_size: int) -> int | None:
        """Returns CPU_DEFAULT_MAX_BATCH_SIZE on CPU; MAX's own inference elsewhere."""
        if devices and all(d.label == "cpu" for d in devices):
            return CPU_DEFAULT_MAX_BATCH_SIZE
        return super().infer_max_batch_size(pipeline_config, devices, weights_size)


def _architecture(hf_class: str) -> SupportedArchitecture:
    return SupportedArchitecture(
        name=hf_class,
        example_repo_ids=["HuggingFaceTB/SmolLM2-135M-Instruct"],
        default_encoding="float32",
        supported_encodings={"float32", "bfloat16", "q4_0"},
        pipeline_model=CrucibleLlamaModel,
        tokenizer=TextTokenizer,
        context_type=TextContext,
        default_weights_format=WeightsFormat.safetensors,
        multi_gpu_supported=False,
        task=PipelineTask.TEXT_GENERATION,
        config=Llama3Config,
        batching=Llama3BatchProcessor,
        memory_planner=CruciblePlanner,
    )


ARCHITECTURES = [_architecture("LlamaForCausalLM"), _architecture("Qwen2ForCausalLM")]
