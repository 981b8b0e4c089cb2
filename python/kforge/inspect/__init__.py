"""Internals of ``kforge inspect`` (run on a GPU by ``python3 -m kforge.inspect.capture``).

* :mod:`.capture`: the entry point — classify the source, compile and profile it, write the capture;
* :mod:`.restitch`: the re-stitch round trip (every Triton kernel replaced by one compiled from
  its own source) and its interleaved timing;
* :mod:`.traces`: torch.profiler traces — kernels per iteration, device work per call;
* :mod:`.inductor`: hooks into Inductor's generated code (wrapper modules, kernel compiles,
  launch configurations); also used by ``kforge verify --kernel``;
* :mod:`.kernel_source`: what a generated kernel's source says (its heuristic, size hints, blocks,
  fixed extents, runtime parameters);
* :mod:`.roofline`: each generated kernel's least traffic against the device's copy bandwidth
  (read by the config agent and the capture).

Nothing is imported here: importing a submodule does not import the others.
"""
