"""The shared ground under every layer: model registry, devices, kernel build, tokenizer, process and
file helpers, version records and error reporting. It imports nothing from graphs, pipelines or serve."""
