"""Course tooling, not part of the library: the student files generated from the solutions
(``make_labs``), the graded tests' choice of implementation (``grading``) and pytest plugin
(``pytest_plugin``: ``--impl``, ``--backend``, the per-lab summary), and the deck builder
(``build_slides``). It needs the ``dev`` extra (nbformat, Jupyter)."""
