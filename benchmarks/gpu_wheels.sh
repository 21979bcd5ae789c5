#!/bin/sh
# The wheels the device machine's python3 lacks for `python3 -m benchmarks.gpu_check`
# (docs/gpu.md, "On a lent machine"): platformdirs (core imports it at module level), gguf
# (an export dependency; numpy, pyyaml and tqdm, which it needs, are there) and liger-kernel
# (the speed section's transformers + peft + Liger side; torch and Triton, which it needs,
# are there). All three are pure Python. They land in benchmarks/wheels/, which .gitignore
# leaves out and the run carries.
set -e
cd "$(dirname "$0")/.."
rm -rf benchmarks/wheels
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    -d benchmarks/wheels "platformdirs>=4" "gguf>=0.19" "liger-kernel==0.8.5"
ls -l benchmarks/wheels
du -sh benchmarks/wheels
