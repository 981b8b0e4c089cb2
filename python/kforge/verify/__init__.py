"""Internals of ``kforge verify``: the candidate-side process the orchestrator (Rust) starts as
``python3 -m kforge.verify.runner``.

* :mod:`.runner`: the entry point — load the problem and the candidate, run the checks, write the result;
* :mod:`.cascade`: the runtime checks in order (dry run, correctness, model level, exploits, dispatch);
* :mod:`.checks`: what the stages are made of (identities, sentinels, counters, the fp64 rule);
* :mod:`.perf`: gate 4, interleaved timing against the compiled baseline (GPU);
* :mod:`.kernel`: replacement-kernel candidates (``--kernel NAME``), re-stitched into the compiled problem.

Nothing is imported here: importing a submodule does not import the others.
"""
