"""The command lines: one argparse base and the error-to-one-line wrapper (`base`), and one module
per command (`train`, `generate`, `export`, `eval`, `monitor`). The top of the stack: may import
any layer."""
