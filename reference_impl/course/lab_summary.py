"""The summary of a run with graded tests: each lab's passed/total, its hidden checks, the labs
not started, and what limited or flagged the run.

A lab none of whose tests passed and whose failures all stopped at exercise stubs is "not
started": its failures leave the terminal's list of failures (:func:`fold_not_started`), so
they do not bury those of the labs in progress.
"""
import collections
import re

import pytest

def graded_outcomes(stats, lab_of_test) -> dict[str, tuple[str, bool]]:
    """nodeid -> (lab, passed every phase), from the terminal reporter's reports.

    A test module that cannot be imported has no tests, only a failed collection report:
    it counts as one failed test of the labs its file name says (``test_lab2_*.py``)."""
    outcomes = {}
    for category in ("passed", "failed", "error", NOT_STARTED, "skipped", "xfailed", "xpassed"):
        for report in stats.get(category, []):
            lab = lab_of(report, lab_of_test)
            if lab is not None:
                ok = outcomes.get(report.nodeid, (lab, True))[1] and category == "passed"
                outcomes[report.nodeid] = (lab, ok)
    return outcomes


_STUB = re.compile(r"NotImplementedError: (lab\d+):")
# The terminal's category for the failures of a lab not started: counted in its last line
# ("14 not started"), listed neither with the failures nor in the short summary.
NOT_STARTED = "not started"


def not_started(stats, lab_of_test) -> set[str]:
    """The labs a student has not started: none of their tests passed and every failure
    stopped at an exercise's stub (``NotImplementedError: labN: ...``), at least one at the
    lab's own (the rest at the stubs of labs it builds on)."""
    outcomes = graded_outcomes(stats, lab_of_test)
    stubs_met = collections.defaultdict(set)  # lab -> the labs whose stubs its failures met
    for report in stats.get("failed", []) + stats.get("error", []):
        lab = lab_of(report, lab_of_test)
        if lab is not None:
            stubs_met[lab].add(frozenset(_STUB.findall(report.longreprtext)))
    return {lab for lab, met in stubs_met.items()
            if all(found for found in met) and any(lab in found for found in met)
            and not any(ok for name, ok in outcomes.values() if name == lab)}


def fold_not_started(stats, lab_of_test) -> None:
    """Move the failures of the labs not started to their own category: their tracebacks,
    one per test and all alike, would bury those of the labs in progress."""
    labs = not_started(stats, lab_of_test)
    for category in ("failed", "error"):
        folded = [report for report in stats.get(category, []) if lab_of(report, lab_of_test) in labs]
        if folded:
            stats[category] = [report for report in stats[category] if report not in folded]
            stats.setdefault(NOT_STARTED, []).extend(folded)


def _stopped_in_other_labs(stats, lab_of_test) -> collections.Counter:
    """(lab, other lab) -> how many of the lab's failed tests ran into the other lab's stubs
    in the submission's processes (in a handout, a lab builds on the student's own files of the
    labs not yet released)."""
    counts = collections.Counter()
    for report in stats.get("failed", []):
        lab, text = lab_of(report, lab_of_test), report.longreprtext
        other = next((found for found in _STUB.findall(text) if found != lab),
                     None) if "RankFailure" in text else None
        if lab is not None and other is not None:
            counts[lab, other] += 1
    return counts


def lab_of(report, lab_of_test):
    """The lab whose marker the report's test carries (not a parameter that looks like one),
    or, for a test module that could not be collected, the lab its file name says."""
    if isinstance(report, pytest.TestReport):
        return lab_of_test.get(report.nodeid)
    if getattr(report, "failed", False):  # a collection report: named by its file
        match = re.search(r"test_(lab\d+)_", report.nodeid or "")
        return match.group(1) if match else None
    return None


def write(terminalreporter, config) -> None:
    """After a run that included graded tests, print passed/total per lab."""
    lab_of_test = config.grading.lab_of_test
    outcomes = graded_outcomes(terminalreporter.stats, lab_of_test)
    not_run = {nodeid: lab for nodeid, lab in config.grading.lab_of_test.items()
               if nodeid not in outcomes}
    if not outcomes and not not_run:
        return
    outcomes.update((nodeid, (lab, False)) for nodeid, lab in not_run.items())
    terminalreporter.section(f"graded labs ({config.implementation.name})")
    folded = {lab_of(report, lab_of_test) for report in terminalreporter.stats.get(NOT_STARTED, [])}
    for lab in sorted({lab for lab, _ in outcomes.values()}, key=lambda name: int(name[3:])):
        results = [ok for name, ok in outcomes.values() if name == lab]
        missing = sum(name == lab for name in not_run.values())
        progress = (f"not started (0/{len(results)})" if lab in folded else
                    f"{sum(results)}/{len(results)} passed")
        hidden = [ok for nodeid, (name, ok) in outcomes.items()
                  if name == lab and config.grading.in_hidden_tier(nodeid)]
        terminalreporter.write_line(
            f"{lab}: {progress}" + (f" ({missing} not run)" if missing else "")
            + (f" (hidden checks among them: {sum(hidden)}/{len(hidden)} passed)"
               if hidden and lab not in folded else ""))
    if config.grading.interrupted:
        terminalreporter.write_line(f"interrupted: {config.grading.interrupted}")
    for (lab, other), count in sorted(_stopped_in_other_labs(terminalreporter.stats, lab_of_test).items()):
        terminalreporter.write_line(
            f"{lab}: {count} of its failures stopped in {other}'s unfinished exercises "
            f"(NotImplementedError: {other}: ...): {lab} builds on your {other} files until "
            f"{other}'s solutions are released")
    broken = sorted(nodeid for nodeid, (_, ok) in outcomes.items() if "::" not in nodeid and not ok)
    for nodeid in broken:
        terminalreporter.write_line(f"(could not be collected, counted as failed: {nodeid})")
    grading = config.grading
    if grading.sandbox_line:
        terminalreporter.write_line(grading.sandbox_line)
    if grading.budget is not None:
        per_launch = (f"at most {grading.launch_timeout:g} s" if grading.launch_timeout
                      else "each test's own limit")
        terminalreporter.write_line(f"budget: {grading.budget:g} s for the run (--budget), "
                                    f"{per_launch} per launch (--launch-timeout)")
    for labs, finding in grading.findings:
        terminalreporter.write_line(f"flagged ({', '.join(labs)}): {finding}")
    if grading.hung_in is not None:
        terminalreporter.write_line(f"hung: a launch did not finish in {grading.hung_in}; "
                                    f"launches after it got at most {grading.after_hang:g} s")
