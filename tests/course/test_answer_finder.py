"""The answer finder the handout build runs (reference_impl/course/answer_finder.py): a shipped
function that gives an exercise's results, whatever its names and however it is written, and a
shipped table of an exercise's results, are found and named with their file; a function that
only looks up the exercise's own recorded results, or that is almost right, is not; a function
tried on arbitrary inputs cannot start a process."""
import json

import pytest

from reference_impl.course import answer_finder, answer_units

pytestmark = pytest.mark.slow

# Lab 8's merge, written as the ring test's stand-in once was (another way than the solution).
MERGE = '''
import torch

def combine(a, la, b, lb):
    lses = torch.stack((la, lb))
    shares = lses.softmax(dim=0).nan_to_num(0.0)
    return (shares[..., None] * torch.stack((a, b))).sum(dim=0), lses.logsumexp(dim=0)

def combine_unguarded(a, la, b, lb):
    lse = torch.logaddexp(la, lb)
    return (a * (la - lse).exp()[..., None] + b * (lb - lse).exp()[..., None]) * 1.001, lse
'''
# Lab 7's bubble, in given library code, under other names.
BUBBLE = '''
def idle_share(stages, micro, chunks=1):
    return (stages - 1) / (chunks * micro + stages - 1)
'''
# Lab 8's positions read from the shipped snapshot: recorded results, not an answer.
LOOKUP = '''
from reference_impl.course.snapshots import snapshot

def positions(seq, cp, rank):
    return snapshot("lab8", "layouts")[f"{cp}/{seq // (2 * cp)}"][rank]
'''
# A function that would start a process when tried.
STARTS = '''
import subprocess

def start(p, m):
    subprocess.Popen(["touch", "{marker}"])
    return None
'''
# Lab 4's 1F1B orders, as the notebook's table gave them.
TABLE = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                    "source": ["ORDERS = {(4, 8): [\"F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7\",\n",
                               " \"F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7\"]}\n"]}],
         "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def test_answers_written_another_way_are_found_and_lookups_and_near_misses_are_not(tmp_path):
    marker = tmp_path / "started"
    files = {"tests/labs/test_given.py": MERGE, "reference_impl/given_bubble.py": BUBBLE,
             "labs/lookup.py": LOOKUP, "labs/starts.py": STARTS.format(marker=marker),
             "labs/lab4_given.ipynb": json.dumps(TABLE)}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "reference_impl" / "__init__.py").write_text("")
    found = answer_finder.answers(tmp_path, sorted(files), {"lab4", "lab7", "lab8"})
    assert {(answer.unit, answer.where) for answer in found} == {
        ("merge_partials", "tests/labs/test_given.py:combine"),
        ("bubble_fraction", "reference_impl/given_bubble.py:idle_share"),
        ("one_f_one_b", "labs/lab4_given.ipynb:ORDERS")}, found
    assert "tests/labs/test_given.py:combine gives merge_partials's results" in map(str, found)
    assert not marker.exists(), "a function tried by the finder started a process"


def test_released_labs_are_not_searched(tmp_path):
    (tmp_path / "labs").mkdir()
    (tmp_path / "labs" / "given.py").write_text(BUBBLE)
    assert answer_finder.answers(tmp_path, ["labs/given.py"], {"lab4"}) == []


def test_a_known_answer_that_is_gone_is_reported_where_its_lab_was_searched(monkeypatch):
    kept, dropped = ("merge_partials", "tests/labs/a.py:f"), ("one_f_one_b", "tests/labs/b.py:T")
    monkeypatch.setattr(answer_finder, "KNOWN", {kept: "why", dropped: "why"})
    found = [answer_finder.Answer(*kept), answer_finder.Answer("gpipe", "labs/new.py:f")]
    every_lab = {unit.lab for unit in answer_units.units()}
    new, gone = answer_finder.refused(found, every_lab)
    assert [str(answer) for answer in new] == ["labs/new.py:f gives gpipe's results"]
    assert gone == [dropped]
    assert answer_finder.refused([], set())[1] == [], "a released lab's known answer is not gone"


def test_the_handout_ships_no_known_answer():
    assert answer_finder.KNOWN == {}, "every give-away the finder found is gone from the handout"
