"""The machine: device choice and precision, GPUs and NVML readings, torchrun/DDP, files on disk
(atomic writes, free space). Imports nothing of TrainDeck but `core.errors`, the leaf every layer
shares."""
