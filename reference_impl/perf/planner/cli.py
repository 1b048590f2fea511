"""The planner's command line: rank layouts, explain the recommendation, evaluate one layout
(``--evaluate``, any model and GPU), validate against published runs, or calibrate
(``calibrate.py``)."""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from reference_impl.perf.planner import calibrate
from reference_impl.perf.planner.cluster_compute import BEST_CASE
from reference_impl.perf.planner.explain import explain, full_explanation
from reference_impl.perf.planner.framework_memory import ACCOUNTINGS
from reference_impl.perf.planner.hardware import (GPU_VARIANTS, GPUS, cluster_of,
                                                  gpu_with_memory)
from reference_impl.perf.planner.layer_efficiency import fit, load_table
from reference_impl.perf.planner.model_spec import PRESETS, get_model, positive
from reference_impl.perf.planner.plans import evaluate, plan, table
from reference_impl.perf.planner.specs import LAYOUT_KEYS, MODEL_KEYS, layout_from, model_from
from reference_impl.perf.planner.validation import memory_report, report


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["calibrate"]:
        return calibrate.main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m reference_impl.perf.planner",
        description="Rank TP x CP x PP x DP layouts for a model on a cluster by estimated step "
                    "time; 'calibrate' measures this GPU's layer-efficiency table.")
    parser.add_argument("--preset", default="70b", help=f"model: {', '.join(PRESETS)}")
    parser.add_argument("--model", help=f"any model instead of a preset: key=value,... or a "
                                        f"JSON file, keys {', '.join(MODEL_KEYS)}")
    parser.add_argument("--gpu", default="h100",
                        help=f"one of {', '.join(GPUS)} or a variant: {', '.join(GPU_VARIANTS)}")
    parser.add_argument("--gpu-memory", type=float, help="GiB per GPU (default: the GPU's)")
    parser.add_argument("--table", help="a calibration table (from 'calibrate') to fit and use")
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--seq", type=int, help="sequence length (default: the preset's)")
    parser.add_argument("--global-batch", type=int, default=1024, help="sequences per step")
    parser.add_argument("--accounting", default="megatron", choices=ACCOUNTINGS)
    parser.add_argument("--tp", type=int, help="fix the TP degree")
    parser.add_argument("--pp", type=int, help="fix the PP degree")
    parser.add_argument("--top", type=int, default=5, help="rows of the ranked table")
    parser.add_argument("--tp-comm-overlap", action="store_true",
                        help="overlap TP collectives with the GEMMs (Megatron-Core's "
                             "tp_comm_overlap, priced as it runs); default: exposed, as "
                             "Megatron-LM's default")
    parser.add_argument("--best-case", action="store_true",
                        help="the most optimistic reading: TP overlap at its bound, no clock "
                             "derating, no SMs lost to overlapped collectives, no framework time")
    parser.add_argument("--evaluate", metavar="LAYOUT",
                        help=f"evaluate one layout and print its breakdown: key=value,... or a "
                             f"JSON file, keys {', '.join(LAYOUT_KEYS)} (tp, pp, dp required); "
                             f"the cluster is its GPUs in nodes of --gpus-per-node")
    parser.add_argument("--explain", action="store_true",
                        help="the math of the recommended plan, why it beats the runner-up, "
                             "public recipes' layouts beside it, the global batch's effect")
    parser.add_argument("--validate", action="store_true",
                        help="predicted against published training runs")
    args = parser.parse_args(argv)
    if args.validate:
        print(report())
        print()
        print(memory_report())
        return
    try:
        model = model_from(args.model) if args.model else get_model(args.preset)
        if args.seq is not None:
            positive("seq", args.seq)
            model = replace(model, seq_len=args.seq)
        positive("top", args.top)
        layout = layout_from(args.evaluate) if args.evaluate else None
        nodes = args.nodes
        if layout is not None:
            positive("gpus_per_node", args.gpus_per_node)
            if layout.gpus % args.gpus_per_node:
                raise ValueError(f"the layout's {layout.gpus} GPUs do not fill nodes of "
                                 f"{args.gpus_per_node}")
            nodes = max(1, layout.gpus // args.gpus_per_node)
        gpu = gpu_with_memory(args.gpu, args.gpu_memory) if args.gpu_memory else args.gpu
        cluster = cluster_of(gpu, nodes, args.gpus_per_node,
                             **({"terms": BEST_CASE} if args.best_case else {}))
        if args.table:
            layer = fit(load_table(args.table), cluster.gpu.layer.memory_bandwidth,
                        f"fitted to {args.table}")
            cluster = replace(cluster, gpu=replace(cluster.gpu, layer=layer))
        if layout is not None:
            if args.tp_comm_overlap:
                layout = replace(layout, tp_comm_overlap=True)
            print(explain(evaluate(model, cluster, layout, args.global_batch)))
            return
        plans = plan(model, cluster, args.global_batch, args.tp, args.pp, args.accounting,
                     tp_comm_overlap=args.tp_comm_overlap)
    except ValueError as error:
        parser.error(str(error))
    print(f"{len(plans)} layouts fit; the {min(args.top, len(plans))} fastest by the estimate:")
    print(table(plans[:args.top]))
    if args.explain:
        print()
        print(explain(plans[0]) if args.tp or args.pp else
              full_explanation(model, cluster, args.global_batch, args.accounting,
                               args.tp_comm_overlap))
