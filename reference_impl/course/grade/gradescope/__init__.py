"""Gradescope's autograder, from one command:

    python -m reference_impl.course.grade.gradescope --labs 2 --out autograder.zip

``build`` writes the zip (``setup.sh``, ``run_autograder``, ``autograder.json`` and the kit as a
student's handout at those labs, with their hidden checks), ``run`` grades a submission inside
the container with the batch grader's own code, ``containers`` sizes the container from the
measured cost of each lab (``measured.json``). How it keeps the student's code away from the
hidden checks, the solutions and the results: docs/grading.md, 'Gradescope'.
"""
