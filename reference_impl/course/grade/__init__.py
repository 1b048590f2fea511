"""Grade a folder of submissions in one command: a grade sheet, Gradescope and JUnit files.

    python -m reference_impl.course.grade SUBMISSIONS --labs 2,3 --out RESULTS

Each submission (one folder each) runs the graded tests, public then hidden, in a process tree,
temporary folder and sandbox of its own, under per-test, per-launch and per-submission limits;
``RESULTS`` gets ``<submission>/results.json`` and ``junit.xml``, ``grades.csv`` and
``report.md``. Modules: ``points``, ``results``, ``running``, ``reports``, ``cli``. The files,
the limits and the points file (``--points``): docs/grading.md, 'A whole class in one command'.
"""
