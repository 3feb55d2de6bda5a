"""Engine batch-1 decode tok/s with sampling params, new sampler vs the old full-sort one, interleaved."""
import sys, time, numpy as np
sys.path.insert(0, "/work/main/tests/pipelines")
from test_sampling import _reference_sample
from crucible.core.registry import resolve_model
from crucible.core.tokenizer import load_tokenizer
from graphs.model import CrucibleModel, ModelOptions
from pipelines.throughput import batch1_engine, chat_prompt_of_length
from pipelines.sampling import Sampler, SamplingParams
import pipelines.sampling as S

model_arg = sys.argv[1]
src = resolve_model(model_arg)
model = CrucibleModel(model_arg, ModelOptions())
tok = load_tokenizer(src)
_, ids = chat_prompt_of_length(tok, 512)
engine = batch1_engine(model, tok, 512)
new_sample = Sampler.sample
def old_sample(self, logits):
    if self.params.greedy: return int(np.argmax(logits))
    return _reference_sample(self.params, self.rng, logits)

def run(params):
    times = []
    engine.submit(list(ids), params)
    while engine.has_work:
        if any(o.new_token_ids for o in engine.step()):
            times.append(time.perf_counter())
    return (len(times) - 1) / (times[-1] - times[0])

configs = {"greedy": SamplingParams(temperature=0, max_tokens=96, ignore_eos=True),
           "t1": SamplingParams(temperature=1.0, max_tokens=96, ignore_eos=True, seed=1),
           "t0.7 top_p0.9": SamplingParams(temperature=0.7, top_p=0.9, max_tokens=96, ignore_eos=True, seed=1),
           "t1 top_p0.95": SamplingParams(temperature=1.0, top_p=0.95, max_tokens=96, ignore_eos=True, seed=1)}
run(configs["greedy"])
res = {(k, v): [] for k in configs for v in ("old", "new")}
for r in range(int(sys.argv[2]) if len(sys.argv) > 2 else 4):
    for k, p in configs.items():
        for v, f in (("old", old_sample), ("new", new_sample)) if r % 2 == 0 else (("new", new_sample), ("old", old_sample)):
            Sampler.sample = f
            res[(k, v)].append(run(p))
    print(r, {f"{k}/{v}": round(x[-1], 1) for (k, v), x in res.items()}, flush=True)
for k in configs:
    o, n = np.median(res[(k, "old")]), np.median(res[(k, "new")])
    wins = sum(b > a for a, b in zip(res[(k, "old")], res[(k, "new")]))
    print(f"{k:16s} old {o:6.1f}  new {n:6.1f} tok/s  new/old {n/o:.3f}  new faster in {wins}/{len(res[(k,'old')])}")
