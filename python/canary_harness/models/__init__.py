"""PyTorch implementations of the canary architectures (torch required; imported on demand).

`canary_harness.models.gpt2` is the package's one GPT-2 canary: the PyTorch lane
(`python3 -m canary_harness.lane`), the external twin (tests/twin) and the PyTorch step
benchmark (bench/torch_step.py) all run it. `canary_harness.models.llama` is the llama
canary (architecture "llama", canaries/architectures/llama/llama.cpp), which the lane runs for llama packs.
"""
