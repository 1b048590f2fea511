"""The MoE benchmark (``python -m reference_impl.benchmarks.moe_layer``) end to end on tiny
shapes: every variant's time and ratio is printed (the MoE layer's ratio is 1.00), the load
per expert and its imbalance, and every rank's all-to-all bytes match the formula. Times are
never asserted."""
import re

from reference_impl.benchmarks import moe_layer


def test_moe_benchmark_prints_ratios_load_and_matching_bytes(capsys):
    moe_layer.main(["--hidden", "8", "--ffn", "16", "--experts", "4", "--top-k", "2",
                    "--tokens", "12", "--capacity-factor", "1.0", "--steps", "1",
                    "--world-sizes", "2"])
    out = capsys.readouterr().out
    ratios = dict(re.findall(r"^(\S.*?)\s+[\d.]+\s+([\d.]+)$", out, re.M))
    assert ratios["MoE layer (gather per expert)"] == "1.00", out
    assert {"every expert on every token, masked", "loop over tokens and slots",
            "dense MLP, 2 x 16 hidden units"} <= set(ratios), out
    loads = re.search(r"^tokens per expert:\s+(.*)$", out, re.M).group(1).split()
    assert len(loads) == 4 and all(n.isdigit() for n in loads), out
    imbalance = float(re.search(r"load imbalance \(max/mean\): (\S+)", out).group(1))
    assert 1.0 <= imbalance <= 4.0, out
    verdicts = re.findall(r"^\s+\d+\s+.*\s(match|DIFFER)$", out, re.M)
    assert verdicts == ["match", "match"], out
    assert out.rstrip().endswith("on every rank: match"), out
