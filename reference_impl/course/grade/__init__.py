"""Grade a folder of submissions in one command: a grade sheet, Gradescope and JUnit files.

    python -m reference_impl.course.grade SUBMISSIONS --labs 2,3 --out RESULTS

Each submission (one folder each) runs the graded tests, public then hidden, in a process tree,
temporary folder and sandbox of its own, under per-test, per-launch and per-submission limits;
``RESULTS`` gets ``<submission>/results.json`` and ``junit.xml``, ``grades.csv`` and
``report.md``. Modules: ``ingest`` (what a submission hands in), ``points``, ``results``,
``running``, ``safe_text`` (text made safe for each file), ``reports``, ``parts`` and ``merge``
(a class graded in parts, ``--part i/n``), ``cli``. The files, the limits and the points file
(``--points``): docs/grading.md, 'A whole class in one command'; a class on a cluster: 'A class
on a cluster'.
"""
