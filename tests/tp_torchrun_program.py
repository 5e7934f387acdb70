"""The program test_tensor_parallel.py starts under torchrun (2 CPU ranks): every rank builds the
same LLM; rank 0 generates and prints its tokens and those of a one-rank LLM, ranks > 0 serve
inside LLM(...) and exit when rank 0 shuts down."""

import json
import sys

from tritonllm import LLM, SamplingParams

path = sys.argv[1]
prompts = [{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": list(range(100, 130))}]
params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
args = dict(model=path, max_model_len=64, kernel_backend="torch_ref")
llm = LLM(**args, tensor_parallel_size=2, distributed_launcher="torchrun")
split = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
llm.shutdown()
whole = [o.outputs[0].token_ids for o in LLM(**args).generate(prompts, params, use_tqdm=False)]
print(json.dumps({"split": split, "whole": whole}))
