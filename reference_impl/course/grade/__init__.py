"""Grade a folder of submissions in one command: a grade sheet, Gradescope and JUnit files.

    python -m reference_impl.course.grade SUBMISSIONS --labs 2,3 --out RESULTS

``SUBMISSIONS`` holds one folder per submission (its student files, ``tp_layers.py`` and the
rest, at its top or in a ``labs/`` folder inside it). Each submission is graded by the kit's
graded tests (``pytest --impl``), both tiers: the public checks (``tests/labs/test_labN_*.py``,
in the students' handout) and then the hidden ones (``tests/labs/hidden/test_labN_*.py``, the
grader's only: the same checks on other seeds, sizes, layouts and dtypes). It runs in a process
tree of its own: its own session and process group, ended as a whole when it is done (this
process is the "subreaper" of whatever escapes the group, so that is ended too), and a
temporary folder of its own, removed afterwards.
Limits: ``--test-timeout`` per test, ``--launch-timeout`` per launch of ranks, ``--budget`` for
the whole submission (once a launch has hung, later ones get ``--after-hang`` seconds; once the
budget is spent the remaining tests fail at once, and the run is killed if it goes on longer).
On a machine with GPUs, ``--jobs`` submissions run at once, each seeing only its own
``--gpus-per-submission`` GPUs (``CUDA_VISIBLE_DEVICES``); without GPUs they run on CPU ranks.

Written to ``RESULTS``:

* ``<submission>/results.json``: Gradescope's autograder format (``score`` and, per test,
  ``name``, ``score``, ``max_score``, ``status``, the ``output`` naming the mistake and the
  ``visibility``: ``visible``, or ``after_due_date`` for a hidden check);
* ``<submission>/junit.xml``: JUnit XML, for CI dashboards (hidden checks in the class
  ``<submission>.<lab>.hidden``);
* ``grades.csv``: one row per submission and lab: submission, lab, passed, total, score,
  max_score, flags, notes (both tiers together), then public_score, public_max, hidden_score,
  hidden_max, hidden_passed, hidden_total (the tiers apart);
* ``report.md``: the most common failures across the course, hidden checks marked.

Points come from ``--points FILE`` (JSON), one place for the whole course::

    {"default": 1,                                   # each test, unless said otherwise
     "labs": {"lab2": 20},                           # a lab's points, shared by its tests
     "tests": {"test_lab2_tp_layers.py::test_tp_mlp_matches_the_single_device_mlp": 4},
     "flagged": "zero"}                              # a flagged lab scores 0 ("keep": flag only)

A test named under ``tests`` (a node id, or its start: every parametrization; a hidden check's
file is ``test_labN_hidden.py``) gets those points each; a lab's points are shared by its public
and hidden tests alike. A submission whose file imports the reference implementation of that
very file is *flagged* in its results, with the line.

Student code runs only in the launches of each graded run, each in a sandbox of its own
(``--sandbox``, :mod:`reference_impl.comm.sandbox`) that hides the class's folder, the
submissions and the results; the verdict is read from a log only pytest writes. Where no
sandbox can be made, the first line says so: grade in a container then (docs/grading.md).

Modules: ``points`` (what each test is worth), ``results`` (a graded run's log read into typed
results), ``running`` (one submission's graded run in a process tree of its own), ``reports``
(the files written), ``cli`` (the command).
"""
