"""What grading costs: a solved submission graded lab by lab, and a class of 200 from it.

    python -m reference_impl.benchmarks.grading_cost [--labs 0,1] [--out FILE.json]

Each lab is graded by the batch grader's own command (``python -m reference_impl.course.grade
SUBMISSIONS --labs N --jobs 1``) on one solved submission (the reference's student files), and
its whole process tree (the grader, pytest, the rank servers, every rank) is measured
(``tree``): wall seconds, CPU seconds of every process (``meter``), and the peak memory of them
all (``memory``).
Where the time goes is read from the grader's output and its grading log as the run writes them
(``labs``), with the sandbox probe and an empty launch of each size timed apart
(``launches``). From these, a class of 200 on three setups and Gradescope's container per lab
(``estimates``), printed as tables (``tables``). Times are measured, never asserted; the
1-minute load average is printed beside them. The results: docs/grading.md, "What grading
costs".
"""
