"""The web monitor: a live page that shows the runs under a folder (or one run) to a browser on
a phone or another computer, private by default. `reading.py` reads run folders without
writing to them (the run list, a metrics.jsonl followed as it grows, the tails of the samples,
the log and GRPO's completions); `access.py` is the token, its cookie, the CSRF token and the
delay after wrong tokens; `server.py` is the HTTP server (the standard library's
ThreadingHTTPServer; updates as server-sent events) with its headers and limits; `beside.py`
runs it in a process of its own beside `core.train --monitor`'s training; `static/` is the page
and its vendored plotting library (uPlot, MIT). The command line is core/cli/monitor.py
(`python -m core.monitor`); the window starts it in a thread of its own process (training runs
in a child process there). Imports core.errors, core.config (the methods' curves) and
core.runs, never torch: the command starts in a fraction of a second and the page's reading
takes no GPU memory."""
