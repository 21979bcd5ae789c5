"""The training loop and what it is made of: the step loop, schedule, optimizers, memory
estimate (and the VRAM tier presets derived from it), the planner over it (context, fit ladder,
preset, C heap), running it in a child process. May
import every layer below it (weights, data, runs, models, config, platform); never `core.use`
or `core.cli`."""
