"""Which sandbox a graded run gets, and what it says: namespaces where one can be made, none
where it cannot (saying why and what that leaves open), a refusal where one was required."""
import pytest

from reference_impl.course import sandboxing


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
    with pytest.raises(ValueError, match="choose one of auto, namespaces, none"):
        sandboxing.choose("docker")


def test_where_one_can_be_made_it_says_what_it_covers_and_what_not():
    if sandboxing.probe() is not None:
        pytest.skip(f"no sandbox here: {sandboxing.probe()}")
    sandboxed, line = sandboxing.choose("auto")
    assert sandboxed and line.startswith("sandbox: namespaces: ") and "not covered:" in line
