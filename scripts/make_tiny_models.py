"""Write one tiny random-weight HF model folder per supported architecture.

    python scripts/make_tiny_models.py OUT_DIR [--seed 0] [--architectures LlamaForCausalLM ...]

Each OUT_DIR/<architecture> is a complete local model (config, float32 safetensors, generation
config, tokenizer with chat template) that both tritonllm and HF transformers load.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tritonllm.models.tiny import TINY_ARCHITECTURES, make_tiny_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path, help="folder that receives one sub-folder per architecture")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (same seed, same files)")
    parser.add_argument("--architectures", nargs="+", default=list(TINY_ARCHITECTURES), choices=TINY_ARCHITECTURES)
    args = parser.parse_args()
    for architecture in args.architectures:
        folder = make_tiny_model(args.out_dir / architecture, architecture, seed=args.seed)
        print(folder)


if __name__ == "__main__":
    main()
