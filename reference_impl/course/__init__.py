"""Course tooling, not part of the library: the student files generated from the solutions
(``make_labs``), the graded tests' choice of implementation (``grading``) and pytest plugin
(``pytest_plugin``: ``--impl``, ``--backend``, the limits and the per-lab summary; how a
graded test is written is in ``grading``), the student handout (``handout``), batch grading
of a class (``grade``), the deck builder (``build_slides``), the syllabus (``syllabus``) and the
machine check before a term (``check_machine``). It needs the ``dev`` extra (nbformat,
Jupyter)."""
