"""A run's JSONL log (``perf/run_log.py``): records written as they come, read back, and a
resumed run's log cut back to its checkpoint's step."""
import json
import math

from reference_impl.perf.run_log import RunLog, read_log


def test_records_are_lines_as_they_come_and_a_resume_drops_the_later_ones(tmp_path):
    log = RunLog(str(tmp_path))
    for step in (1, 2, 3):
        log.write(step=step, loss=1.0 / step)
    log.write(step=3, val_loss=float("nan"))
    assert len(read_log(log.path)) == 4, "flushed at once: a stopped run keeps its records"
    log.close()
    assert json.loads(open(log.path).read().splitlines()[-1]) == {"step": 3, "val_loss": None}
    resumed = RunLog(str(tmp_path), after=2)  # its checkpoint was at step 2
    resumed.write(step=3, loss=0.25)
    resumed.close()
    records = read_log(resumed.path)
    assert [r["step"] for r in records] == [1, 2, 3] and records[-1]["loss"] == 0.25
    assert resumed.records == records and not math.isnan(records[0]["loss"])
