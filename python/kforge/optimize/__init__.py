"""Internals of ``kforge optimize``: the agents that propose candidates.

* :mod:`.dispatch`: the ``dispatch``, ``inductor`` and ``rewrite`` agents' measurement,
  ``python3 -m kforge.optimize.dispatch`` — eager, a torch.compile mode, the baseline's mode with one
  Inductor knob, or the rewritten forward (``MODE~rewrite``), per problem, chosen by interleaved timing;
* :mod:`.result`: the winner as a standalone KernelBench ``ModelNew`` file and its verify policy;
* :mod:`.rewrite`: the ``rewrite`` agent's library — algebraic rewrite rules on a model's FX graph,
  each with its exactness class, ``rewrite_model`` (every rule to a fixed point) and
  ``module_source`` (the rewritten forward as a standalone KernelBench ``ModelNew`` file).

Nothing is imported here: importing a submodule does not import the others.
"""
