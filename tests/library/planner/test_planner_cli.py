"""``--evaluate``: any layout of any model on any GPU from the command line (or JSON files),
its breakdown printed; bad keys and illegal layouts named."""
import json
import re
import subprocess
import sys

import pytest

from reference_impl.perf.planner.cli import main
from reference_impl.perf.planner.specs import layout_from, model_from

GPT3 = "layers=96,hidden=12288,heads=96,vocab=51200,seq=2048,tied=1"


@pytest.mark.slow  # the planner's command line, end to end
def test_evaluate_runs_on_the_command_line():
    process = subprocess.run(
        [sys.executable, "-m", "reference_impl.perf.planner", "--evaluate",
         "tp=8,pp=12,v=8,dp=64,cp=1,mb=1", "--model", GPT3, "--global-batch", "1536"],
        capture_output=True, text=True, timeout=120)
    assert process.returncode == 0, process.stderr
    out = process.stdout
    assert "layout: TP 8 x PP 12 (v 8) x DP 64" in out
    assert "768 nodes x 8 H100 80GB = 6144 GPUs" in out and "N = 174.58B parameters" in out
    for needle in ("memory per GPU", "framework", "DP ", "by cause (s)", "step "):
        assert needle in out


def test_evaluate_reads_json_files_and_a_gpu_of_another_memory(tmp_path, capsys):
    model = tmp_path / "model.json"
    model.write_text(json.dumps(dict(layers=32, hidden=4096, heads=32, vocab=32000, seq=4096,
                                     ffn=11008, gated=True)))
    layout = tmp_path / "layout.json"
    layout.write_text(json.dumps(dict(tp=2, pp=2, dp=4, mb=1, zero=1, recompute="full")))
    main(["--evaluate", str(layout), "--model", str(model), "--gpu", "h100", "--gpu-memory",
          "94", "--global-batch", "64"])
    out = capsys.readouterr().out
    assert "2 nodes x 8 H100 94GB = 16 GPUs (91.0 GiB usable" in out
    assert "recompute full" in out and "MLP 11008 gated" in out


def test_best_case_is_faster_than_the_priced_estimate(capsys):
    steps = []
    for extra in ([], ["--best-case"]):
        main(["--evaluate", "tp=4,pp=4,v=5,dp=8,tp_overlap=1", "--preset", "70b", *extra])
        out = capsys.readouterr().out
        steps.append(float(out.split("  step               ")[1].split(" s:")[0]))
    assert steps[1] < steps[0]


def test_specs_convert_and_name_what_is_wrong():
    layout = layout_from("tp=2,pp=4,dp=8,cp=2,v=5,mb=2,recompute=none,sp=0,tp_overlap=true")
    assert (layout.tp, layout.pp, layout.dp, layout.cp, layout.v, layout.micro_batch) == \
        (2, 4, 8, 2, 5, 2)
    assert layout.recompute is None and not layout.sequence_parallel and layout.tp_comm_overlap
    assert model_from(GPT3).num_params == pytest.approx(174.58e9, rel=1e-4)
    with pytest.raises(ValueError, match="unknown layout key pq; known: tp, pp"):
        layout_from("tp=2,pq=4,dp=8")
    with pytest.raises(ValueError, match="the layout needs pp"):
        layout_from("tp=2,dp=8")
    with pytest.raises(ValueError, match="mb must be an integer, got 'two'"):
        layout_from("tp=2,pp=1,dp=8,mb=two")
    with pytest.raises(ValueError, match="the model needs heads, vocab, seq"):
        model_from("layers=2,hidden=64")


@pytest.mark.parametrize("argv, message", [
    (["--evaluate", "tp=8,pp=9,v=11,dp=1", "--preset", "gpt3-175b"],
     r"interleaving needs equal chunks: 96 layers are not divisible by pp\*v = 9\*11 = 99"),
    (["--evaluate", "tp=8,pp=2,dp=2,cp=2,attention=explicit"],
     "context parallelism needs fused attention"),
    (["--evaluate", "tp=8,pp=1,dp=3", "--gpus-per-node", "16"],
     "the layout's 24 GPUs do not fill nodes of 16"),
    (["--evaluate", "tp=8,pp=4,dp=4", "--gpu", "b200"], "unknown GPU 'b200'"),
])
def test_evaluate_reports_illegal_layouts_without_a_traceback(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err
    assert re.search(message, err), err
