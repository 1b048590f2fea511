"""Which sandbox a graded run gets, and what it says: namespaces where one can be made, none
where it cannot (saying why and what that leaves open), a refusal where one was required; and
the batch grader, which never grades a class without one unless asked (``--sandbox none``)."""
import re

import pytest

from reference_impl.course import sandboxing
from reference_impl.course.grade import cli
from reference_impl.course.grade.results import Graded


@pytest.fixture
def no_namespaces(monkeypatch):
    monkeypatch.setattr(sandboxing, "probe", lambda: "no user namespaces in this test")


def test_auto_falls_back_to_none_and_says_why_and_what_is_open(no_namespaces):
    sandboxed, line = sandboxing.choose("auto")
    assert not sandboxed
    assert line.startswith("sandbox: none (no user namespaces in this test)")
    assert "runs with your rights" in line and "container" in line


def test_namespaces_refuses_to_grade_without_one(no_namespaces):
    with pytest.raises(ValueError, match="--sandbox namespaces: no sandbox can be made here: "
                                         "no user namespaces in this test"):
        sandboxing.choose("namespaces")


def test_none_is_none_when_asked_for_and_unknown_modes_are_refused():
    assert sandboxing.choose("none") == (False, f"sandbox: none (asked for): "
                                                f"{sandboxing.NOT_COVERED}")
    with pytest.raises(ValueError, match="choose one of auto, namespaces, user, none"):
        sandboxing.choose("docker")


def test_where_one_can_be_made_it_says_what_it_covers_and_what_not():
    if sandboxing.probe() is not None:
        pytest.skip(f"no sandbox here: {sandboxing.probe()}")
    sandboxed, line = sandboxing.choose("auto")
    assert sandboxed and line.startswith("sandbox: namespaces: ") and "not covered:" in line
    assert len(line) < 300  # one short line: the rest is in the documentation


def test_without_fall_back_auto_refuses_saying_why_and_how_to_choose(no_namespaces):
    """The batch grader's rule: a class is never graded unsandboxed unless asked."""
    with pytest.raises(ValueError) as refused:
        sandboxing.choose("auto", fall_back=False)
    message = str(refused.value)
    assert "no user namespaces in this test" in message and "--sandbox none" in message
    assert "docs/grading.md" in message
    assert sandboxing.choose("none", fall_back=False)[0] is False  # asked for: graded


def class_of_one(root):
    (root / "submissions" / "alice").mkdir(parents=True)
    return [str(root / "submissions"), "--labs", "0", "--out", str(root / "results")]


def test_the_batch_grader_stops_before_the_first_student_without_a_sandbox(
        no_namespaces, monkeypatch, tmp_path, capsys):
    graded = []

    def grade_one(submission, *rest):
        graded.append(submission.name)
        return Graded(submission.name, [], [], [], 0.0)

    monkeypatch.setattr(cli, "grade_one", grade_one)
    monkeypatch.setattr(cli, "Reaper", lambda: None)  # not this process: it grades no one here
    with pytest.raises(SystemExit) as stopped:
        cli.main(class_of_one(tmp_path))
    assert stopped.value.code == 2 and not graded
    error = capsys.readouterr().err
    assert "no user namespaces in this test" in error and "--sandbox none" in error


def test_the_batch_grader_grades_without_a_sandbox_when_asked(no_namespaces, monkeypatch,
                                                              tmp_path, capsys):
    monkeypatch.setattr(cli, "grade_one", lambda submission, *rest: Graded(
        submission.name, [], [], [], 0.0))
    monkeypatch.setattr(cli, "Reaper", lambda: None)  # not this process: it grades no one here
    assert cli.main([*class_of_one(tmp_path), "--sandbox", "none"]) == 0
    assert "sandbox: none (asked for)" in capsys.readouterr().out
    assert (tmp_path / "results" / "alice" / "results.json").exists()


def test_a_box_user_is_refused_where_it_cannot_run_saying_why():
    from reference_impl.comm.user_box import unavailable as no_box_user
    reason = no_box_user()
    if reason is None:
        pytest.skip("a box user can run here")
    with pytest.raises(ValueError, match=re.escape(f"--sandbox user: {reason}")):
        sandboxing.choose("user")
