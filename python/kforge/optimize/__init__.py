"""Internals of ``kforge optimize``: the agents that propose candidates.

* :mod:`.dispatch`: the ``dispatch`` agent, ``python3 -m kforge.optimize.dispatch`` — eager or a
  torch.compile mode per problem, chosen by interleaved timing.

Nothing is imported here: importing a submodule does not import the others.
"""
