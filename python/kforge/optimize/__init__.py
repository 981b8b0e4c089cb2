"""Internals of ``kforge optimize``: what the search's agents need torch for.

* :mod:`.rewrite`: the ``rewrite`` agent's library — algebraic rewrite rules on a model's FX graph,
  each with its exactness class, ``rewrite_model`` (every rule to a fixed point) and
  ``module_source`` (the rewritten forward as a standalone KernelBench ``ModelNew`` file).

Nothing is imported here: importing a submodule does not import the others.
"""
