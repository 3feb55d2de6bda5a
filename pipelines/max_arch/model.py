"""CrucibleLlamaModel: MAX's Llama pipeline model with its decoder graph replaced by Crucible's.

MAX keeps everything around the decoder: tokenizer, scheduler, Jenga paged KV cache, ragged batch
staging (Llama3BatchProcessor: tokens, input_row_offsets, return_n_logits, KV inputs) and the
sampler graph. ``load_model`` builds graphs/llama.py's graph with that input order
(``logits="last_token"``) on the KV params MAX planned, loads the weights with our own loaders
(GGUF blocks stay quantized; MAX's GGUF reader has no Q4_1 or Q8_0), and compiles it into MAX's session.

Graph inputs (MAX's order): tokens [total_seq_len] int64, input_row_offsets [B + 1] uint32,
return_n_logits [1] int64, *KV inputs. Output: next-token logits [B, vocab] float32.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from max.dtype import DType
from max.engine import InferenceSession, Model
from max.nn.transformer import ReturnHiddenStates, ReturnLogits
from max.pipelines.architectures.llama3.model import Llama3Model
from max.pipelines.lib import CompilationTimer, ModelInputs, ModelOutputs

from crucible.core.registry import ModelSource
from graphs.cpu_threads import CpuThreadTuner
from graphs.model import compile_decoder

logger = logging.getLogger("max.pipelines")


def model_source(model_path: str, weight_paths: list[Path]) -> ModelSource:
    """Which local files MAX resolved for the model: a GGUF file, else the Hugging Face folder.

    Args:
        model_path: MAX's --model-path (a local folder; hub ids cannot be fetched here).
        weight_paths: MAX's --weight-path entries, absolute or relative to model_path.

    Raises:
        ValueError: Several GGUF files, or no local folder to read.
    """
    folder = Path(model_path).expanduser() if model_path else None
    resolved = [p if p.is_absolute() or folder is None else folder / p for p in map(Path, weight_paths)]
    ggufs = [p for p in resolved if p.suffix == ".gguf"]
    if len(ggufs) > 1:
        raise ValueError(f"Crucible loads one GGUF file, got {len(ggufs)}: {ggufs}")
    if ggufs:
        return ModelSource(name=str(ggufs[0]), path=ggufs[0], format="gguf")
    if folder is None or not (folder / "config.json").is_file():
        raise ValueError(
            f"Crucible's MAX architecture reads local files: --model-path {model_path!r} is not a folder "
            "with config.json (pass a local Hugging Face folder, or --weight-path <file.gguf>)")
    return ModelSource(name=str(folder), path=folder, format="hf")


class CrucibleLlamaModel(Llama3Model):
    """Llama3Model whose ``load_model`` compiles Crucible's decoder graph instead of MAX's."""

    provenance: dict[str, Any]
    _largest_batch: int = 0
    _thread_tuner: CpuThreadTuner

    def load_model(self, session: InferenceSession) -> Model:
        """Builds, compiles and loads Crucible's decoder into MAX's session.

        Raises:
            ValueError: Options our graph does not implement (all-token logits, hidden states,
                several devices, a non-float32 KV cache).
        """
        if self.return_logits != ReturnLogits.LAST_TOKEN:
            raise ValueError(f"Crucible's graph returns last-token logits only, not {self.return_logits}")
        if self.return_hidden_states != ReturnHiddenStates.NONE:
            raise ValueError("Crucible's graph does not return hidden states")
        if len(self.device_refs) != 1:
            raise ValueError(f"Crucible's graph runs on one device, got {len(self.device_refs)}")
        cache_dtype = getattr(self.kv_params, "dtype", None)
        if cache_dtype != DType.float32:
            raise ValueError(f"Crucible's attention kernels read a float32 KV cache, MAX planned {cache_dtype}; "
                             "pass --kv-cache-format float32")

        model = self.pipeline_config.model
        source = model_source(str(model.model_path), list(model.weight_path))
        with CompilationTimer("crucible model") as timer:
            decoder = compile_decoder(source, self.kv_params, self.device_refs[0], session, logits="last_token")
            timer.mark_build_complete()
        # On CPU the session maps the registry's numpy arrays instead of copying them: they must
        # live as long as the model (freeing them here crashed the first step).
        self._decoder = decoder
        self.provenance = {**decoder.provenance, "device": str(self.device_refs[0].device_type).lower()}
        self._thread_tuner = CpuThreadTuner(self.provenance["device"] == "cpu")
        logger.info("Crucible decoder from %s: %s", source.path, self.provenance)
        return decoder.model


    def execute(self, model_inputs: ModelInputs) -> ModelOutputs:
        """Runs one step of MAX's batch; logs each new largest batch (how far MAX's scheduler batches us)."""
        n_seqs = int(model_inputs.input_row_offsets.shape[0]) - 1
        if n_seqs > self._largest_batch:
            self._largest_batch = n_seqs
            logger.info("Crucible decoder: largest batch so far %d sequences", n_seqs)
        # The KV cache inputs arrive by an asynchronous staged copy that the graph does not wait for
        # on CPU (see CrucibleModel.execute): let it land first.
        for device in self.devices:
            device.synchronize()
        # MAX's runtime threads get their priorities on the first steps (graphs/cpu_threads.py).
        return self._thread_tuner.execute(lambda: super(CrucibleLlamaModel, self).execute(model_inputs))
