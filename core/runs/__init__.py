"""A run on disk and on the wire: the run folder (config.yaml, metrics.jsonl, logs), the
checkpoint file format, the run lock, the events a trainer sends and the controls it reads (and
the request files another process leaves for it), the progress arithmetic the front ends show,
the signals its records carry and the plots that draw them (signals.py), and a mixture of
experts' load read back from its step records (experts.py). May import `core.config` and
`core.platform`."""
