"""The ``studio`` command.

    studio                       open the desktop app (see studio/__main__.py)
    studio --batch FILE [...]    run a project's pipeline headless (CI)
    studio new FILE --sample tiny-coder | --checkpoint DIR [--target T ...]
    studio info FILE [--json]
    studio compare FILE [RUN_A [RUN_B]] [--json]
    studio layerdiff FILE [--target T] [--all] [--json]
    studio estimate --config CONFIG --chip CHIP [--scheme S] [--context N] [--json]
    studio estimate --calibration [--json] [--write-fit]
    studio generate FILE --prompt TEXT [--device D] [--max-new-tokens N] [--temperature T
                    --top-k K --top-p P --seed S] [--stop S ...]
                    [--speculative [--draft REF | --prompt-lookup] [--k K] [--fixed-k]]
                    [--kv float|int8] [--window W] [--runtime studio|genie] [--json]
    studio prune FILE [--drop N] [--out DIR] [--json]
    studio graph MODEL.onnx --calibration DATA.npz [--shape NAME=D,..] [--target CHIP]
                 [--placement strict|partition|rewrite] [--scheme W8A16|W8A8]
                 [--weights per_channel|per_tensor] [--out DIR] [--json]
    studio bundle FILE [--target CHIP] [--out DIR] [--parts N] [--prefill-length N] [--json]
    studio waterfall FILE [--chip CHIP] [--json]
    studio agent serve [--host 127.0.0.1] [--port P] [--token-file F] [--tls-cert C --tls-key K]
    studio devices list [--json] | add NAME --url URL (--token T | --token-file F) | remove NAME
                   | sdk [PATH | --clear]
    studio profile show FILE [--run N] [--target T] [--by block|op_type|layer|layer-block] [--json]
    studio profile export FILE [--run N] [--target T] --format chrome|csv OUT
    studio profile import PROFILE_FILE [--onnx MODEL] [--json]
    studio sweep FILE [--name N | --axis KEY=V1,V2 ...] [--executor local|ray] [--workers K]
                 [--ray-address ADDR] [--transfer auto|copy] [--stages S,..] [--best RULE]
                 [--search TRIALS [--minutes M]] [--show] [--apply best|pN] [--json]
    studio report FILE [--run N] [--format html|md|pdf|json] [--out PATH]

Exit codes: 0 success, 1 an accuracy gate failed, 2 bad input (one line on stderr),
3 a stage crashed (a bug: its traceback is in the job log).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, like every other bad input
        raise StudioError(f"{message} (see studio --help)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="studio", description="QStudio: deploy language models to Snapdragon NPUs.")
    p.add_argument("--batch", metavar="FILE", help="run the project's pipeline headless")
    p.add_argument("--stages", help="comma-separated stages to run (their inputs run too)")
    p.add_argument("--remeasure", action="store_true",
                   help="time the run and profile stages again instead of reusing a "
                        "measurement (e.g. one taken while the host was busy)")
    p.add_argument("--target", action="append", help="only this target (repeatable)")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    n = sub.add_parser("new", help="create a project file")
    n.add_argument("file")
    g = n.add_mutually_exclusive_group(required=True)
    g.add_argument("--sample", help="a built-in sample model, e.g. tiny-coder")
    g.add_argument("--checkpoint", help="a local Hugging Face checkpoint folder")
    g.add_argument("--onnx", dest="new_onnx", metavar="MODEL.onnx",
                   help="any ONNX network (model.kind onnx-graph)")
    n.add_argument("--target", dest="new_targets", action="append", help="target chip (repeatable)")
    n.add_argument("--scheme", default=None, help="W8A16 (default), W8A8 or FP16")
    n.add_argument("--calibration", dest="new_calibration", metavar="DATA.npz",
                   help="ONNX graphs: calibration samples, one array per input")
    n.add_argument("--validation", dest="new_validation", metavar="DATA.npz",
                   help="ONNX graphs: held-out validation samples")
    n.add_argument("--shape", dest="new_shapes", action="append", default=[],
                   metavar="NAME=D,D,...", help="ONNX graphs: a fixed shape for a dynamic input")
    n.add_argument("--placement", dest="new_placement", choices=("strict", "partition", "rewrite"),
                   help="encoders and ONNX graphs: the way past ops the HTP refuses")
    n.add_argument("--seq-len", dest="new_seq_len", type=int,
                   help="encoders: the exported sequence length (default 128)")
    i = sub.add_parser("info", help="describe a project file")
    i.add_argument("file")
    i.add_argument("--json", dest="info_json", action="store_true")
    c = sub.add_parser("compare", help="compare two runs: changed settings and metric deltas")
    c.add_argument("file")
    c.add_argument("run_a", nargs="?", type=int, metavar="RUN_A",
                   help="the run to compare against (default: the second newest with results)")
    c.add_argument("run_b", nargs="?", type=int, metavar="RUN_B",
                   help="the run to compare (default: the newest with results)")
    c.add_argument("--json", dest="compare_json", action="store_true",
                   help="print the comparison as JSON")
    ld = sub.add_parser("layerdiff", help="FP32 vs host QDQ vs HTP tensor by tensor (run "
                                          "studio --batch FILE --stages layerdiff first)")
    ld.add_argument("file")
    ld.add_argument("--target", dest="ld_target", help="the target chip (default: the first)")
    ld.add_argument("--all", dest="ld_all", action="store_true",
                    help="list every tensor, not only the boundaries between blocks")
    ld.add_argument("--json", dest="ld_json", action="store_true",
                    help="print the result and every tensor's figures as JSON")
    o = sub.add_parser("overrides", help="per-tensor precision as QNN / AIMET encodings JSON")
    osub = o.add_subparsers(dest="overrides_command", parser_class=_Parser, required=True)
    oe = osub.add_parser("export", help="write the quantized graph's encodings-override JSON")
    oe.add_argument("file")
    oe.add_argument("out")
    oi = osub.add_parser("import", help="add an encodings JSON's precisions to the recipe")
    oi.add_argument("file")
    oi.add_argument("encodings")
    oa = osub.add_parser("adopt", help="copy the auto-precision stage's rules into the recipe")
    oa.add_argument("file")
    sub.add_parser("targets", help="list the chip catalog")
    gn = sub.add_parser("generate", help="generate text with the deployed model on a device")
    gn.add_argument("file")
    gn.add_argument("--prompt", required=True)
    gn.add_argument("--device", help="cpu (FP32 export, default), htp-sim or htp-sim:<chip> "
                                     "(the compiled model on the HTP simulator)")
    gn.add_argument("--max-new-tokens", type=int, dest="max_new_tokens")
    gn.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    gn.add_argument("--top-k", type=int, default=0, dest="top_k")
    gn.add_argument("--top-p", type=float, default=1.0, dest="top_p")
    gn.add_argument("--seed", type=int)
    gn.add_argument("--stop", action="append", help="a stop string (repeatable)")
    gn.add_argument("--speculative", action="store_true",
                    help="speculative decoding: drafted tokens checked in one target pass")
    gn.add_argument("--draft", help="the draft model (a checkpoint folder or sample:NAME; "
                                    "default: the project's model.draft)")
    gn.add_argument("--prompt-lookup", action="store_true", dest="prompt_lookup",
                    help="draft by n-gram lookup in the text so far (no draft model)")
    gn.add_argument("--k", type=int, default=4, help="drafted tokens per target pass (max)")
    gn.add_argument("--fixed-k", action="store_true", dest="fixed_k",
                    help="keep k fixed instead of adapting it to the acceptance")
    gn.add_argument("--kv", choices=("float", "int8"),
                    help="the KV cache: float or int8 (uint8 cache I/O); default: the "
                         "project's quantization.kv_cache")
    gn.add_argument("--window", type=int,
                    help="attend to the last W tokens (W <= the context): a ring buffer that "
                         "lets generation run past the context")
    gn.add_argument("--runtime", choices=("studio", "genie"), default="studio",
                    help="the studio's own runtime (default) or Qualcomm's Genie from the "
                         "project's Genie bundle (greedy, on the HTP simulator)")
    gn.add_argument("--json", dest="generate_json", action="store_true")
    pn = sub.add_parser("prune", help="rank blocks by ablation and write a pruned checkpoint")
    pn.add_argument("file")
    pn.add_argument("--drop", type=int, help="blocks to drop (default: pruning.drop_blocks)")
    pn.add_argument("--out", help="folder for the pruned checkpoint; a project file for it is "
                                  "written beside it (OUT.qstudio)")
    pn.add_argument("--json", dest="prune_json", action="store_true")
    bd = sub.add_parser("bundle", help="a Genie bundle for a target chip, checked by running "
                                       "Genie on the HTP simulator")
    bd.add_argument("file")
    bd.add_argument("--target", help="the chip (default: the first target)")
    bd.add_argument("--out", help="where the bundle folder goes (default: the project folder's "
                                  "bundles/CHIP)")
    bd.add_argument("--parts", type=int, help="context binaries of consecutive blocks (default: "
                                              "bundle.parts; 0 there: by bundle.max_context_mb)")
    bd.add_argument("--prefill-length", type=int, help="tokens per pass of the AR-N prefill "
                                                       "graph (default: bundle.prefill_length; "
                                                       "1: no prefill graph)")
    bd.add_argument("--json", dest="bundle_json", action="store_true")
    gr = sub.add_parser("graph", help="any ONNX network onto a target's NPU: placement, "
                                      "quantization, validation per output, latency")
    gr.add_argument("model", help="an .onnx file")
    gr.add_argument("--calibration", required=True,
                    help=".npz with one array per input ([N, ...] samples), or .npy")
    gr.add_argument("--validation", help="held-out samples in the same form (default: the "
                                         "last calibration samples)")
    gr.add_argument("--shape", action="append", default=[], metavar="NAME=D,D,...",
                    help="a fixed shape for a dynamic input (repeatable)")
    gr.add_argument("--target", default="snapdragon-8-gen-3", help="the chip")
    gr.add_argument("--placement", choices=("strict", "partition", "rewrite"), default="strict",
                    help="ops the HTP refuses: fail (strict), leave them to the CPU "
                         "(partition) or replace them by known equivalents (rewrite)")
    gr.add_argument("--scheme", choices=("W8A16", "W8A8"), default="W8A16")
    gr.add_argument("--weights", choices=("per_channel", "per_tensor"), default="per_channel",
                    help="weight quantization granularity")
    gr.add_argument("--out", help="folder for the files (default: MODEL.studio-graph/ beside "
                                  "the model)")
    gr.add_argument("--json", dest="graph_json", action="store_true")
    ag = sub.add_parser("agent", help="the device agent that runs jobs on a target machine")
    ags = ag.add_subparsers(dest="agent_command", parser_class=_Parser, required=True)
    sv = ags.add_parser("serve", help="serve jobs over HTTP (bearer token; 127.0.0.1 unless "
                                      "told otherwise)")
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8765, help="0: any free port")
    sv.add_argument("--token-file", dest="token_file",
                    help="read the token from this file (default: a new pairing token, printed)")
    sv.add_argument("--tls-cert", dest="tls_cert")
    sv.add_argument("--tls-key", dest="tls_key")
    sv.add_argument("--store", help="where uploaded files live (default: the user's data folder)")
    sv.add_argument("--max-upload-mb", dest="max_upload_mb", type=float, default=2048.0)
    sv.add_argument("--max-jobs", dest="max_jobs", type=int, default=1)
    dv = sub.add_parser("devices", help="the device registry: list, add or remove agents")
    dvs = dv.add_subparsers(dest="devices_command", parser_class=_Parser, required=True)
    dl = dvs.add_parser("list", help="every device with its health and capabilities")
    dl.add_argument("--json", dest="devices_json", action="store_true")
    da = dvs.add_parser("add", help="register an agent (URL and its pairing token)")
    da.add_argument("name")
    da.add_argument("--url", required=True)
    tok = da.add_mutually_exclusive_group(required=True)
    tok.add_argument("--token")
    tok.add_argument("--token-file", dest="token_file")
    da.add_argument("--cafile", default="", help="the certificate an https agent is trusted by "
                                                "(its self-signed certificate or its CA)")
    dr = dvs.add_parser("remove", help="forget an agent")
    dr.add_argument("name")
    dk = dvs.add_parser("sdk", help="show or set the QAIRT SDK folder phones over adb run "
                                    "qnn-net-run from")
    dk.add_argument("path", nargs="?", help="the folder the QAIRT SDK unpacked into")
    dk.add_argument("--clear", action="store_true", help="forget the folder")
    wf = sub.add_parser("waterfall", help="the optimization waterfall: each step measured on "
                                          "the host CPU and estimated for a chip")
    wf.add_argument("file")
    wf.add_argument("--chip", help="the chip to estimate for (default: the first target)")
    wf.add_argument("--json", dest="waterfall_json", action="store_true")
    pr = sub.add_parser("profile", help="show, export or import profiles")
    prs = pr.add_subparsers(dest="profile_command", parser_class=_Parser, required=True)
    ps = prs.add_parser("show", help="a run's op table: by block (the seed's table), op type, "
                                     "layer, or layer x block")
    ps.add_argument("file")
    ps.add_argument("--run", type=int, help="the run (default: the newest with a profile)")
    ps.add_argument("--target", dest="profile_target", help="the chip / device id")
    ps.add_argument("--by", default="block", choices=["block", "op_type", "layer",
                                                      "layer-block"])
    ps.add_argument("--json", dest="profile_json", action="store_true")
    pe = prs.add_parser("export", help="write a run's profile as chrome-trace JSON or CSV")
    pe.add_argument("file")
    pe.add_argument("out")
    pe.add_argument("--run", type=int, help="the run (default: the newest with a profile)")
    pe.add_argument("--target", dest="profile_target", help="the chip / device id")
    pe.add_argument("--format", dest="profile_format", required=True, choices=["chrome", "csv"])
    pi = prs.add_parser("import", help="read a profile another tool wrote (QNN CSV, optrace "
                                       "schematic, ORT JSON, chrome trace, AI Hub JSON)")
    pi.add_argument("profile_file")
    pi.add_argument("--onnx", help="the ONNX model it profiles (places ops in the seed's table)")
    pi.add_argument("--json", dest="profile_json", action="store_true")
    sw = sub.add_parser("sweep", help="run a recipe sweep: every point through the stage "
                                      "graph, the Pareto front and the best point")
    sw.add_argument("file")
    sw.add_argument("--name", help="which [[sweeps]] of the project (or a name for --axis)")
    sw.add_argument("--axis", action="append", metavar="KEY=V1,V2",
                    help="a grid axis instead of a declared sweep (repeatable), e.g. "
                         "quantization.scheme=W8A16,W8A8; tables as a JSON list")
    sw.add_argument("--executor", default="local", help="local (process pool, default) or ray")
    sw.add_argument("--workers", type=int, help="jobs at once (default: what the cores and "
                                               "memory allow; on Ray, the cluster's CPUs)")
    sw.add_argument("--ray-address", help="a running Ray cluster (HOST:PORT); default: start "
                                          "a local one")
    sw.add_argument("--transfer", default="auto", help="Ray: auto (shared store where the "
                                                       "node sees it) or copy (through Ray)")
    sw.add_argument("--stages", dest="sweep_stages",
                    help="comma-separated stages each point runs (default: up to validate)")
    sw.add_argument("--best", help="smallest | most-accurate | fastest (among points that "
                                   "pass every gate)")
    sw.add_argument("--search", type=int, metavar="TRIALS",
                    help="instead of the whole grid, a multi-objective search (optuna NSGA-II: "
                         "accuracy up, size down) over its axes, at most TRIALS points")
    sw.add_argument("--minutes", type=float, help="with --search: stop asking for trials "
                                                  "after this many minutes")
    sw.add_argument("--show", action="store_true", help="print the recorded sweep, run nothing")
    sw.add_argument("--apply", metavar="POINT", help="write a point's settings into the project "
                                                   "file: best, or a label like p3")
    sw.add_argument("--json", dest="sweep_json", action="store_true", help="print JSON")
    from studio.cli.report import add_parser as add_report_parser

    add_report_parser(sub)
    # listed here for --help; `studio demo` opens a window, so studio/__main__.py takes it
    # before the command line sees it
    dm = sub.add_parser("demo", help="the full-screen stakeholder demo of a project (a window: "
                                     "studio demo FILE [--scene N|NAME] [--windowed])")
    dm.add_argument("file")
    e = sub.add_parser("estimate", help="estimated prefill / decode tok/s of an architecture on "
                                        "a chip (performance model, no weights needed)")
    e.add_argument("--config", help="a HF config.json, a checkpoint folder, or a bundled name "
                                    "(e.g. llama-3.2-1b)")
    e.add_argument("--chip", help="a catalog key or part number (see studio targets)")
    e.add_argument("--scheme", dest="est_scheme", default="W4A16",
                   help="W4A16 (default), W4, W8A16, W8A8 or FP16")
    e.add_argument("--context", type=int, default=4096, help="KV-cache context (default 4096)")
    e.add_argument("--prompt-tokens", type=int, default=None,
                   help="prompt length for prefill (default: min(context, 1024))")
    e.add_argument("--calibration", action="store_true",
                   help="published vs estimated tok/s on the anchors, MdAPE and leave-one-out")
    e.add_argument("--write-fit", action="store_true",
                   help="with --calibration: refit and write resources/perf/model.toml")
    e.add_argument("--json", dest="est_json", action="store_true", help="print JSON")
    return p


class _Printer:
    """Terminal progress: one line per job state change, a live line on a terminal."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self._last: dict[int, tuple[str, int]] = {}

    def __call__(self, event: dict[str, Any]) -> None:
        if self.quiet or event["kind"] != "job":
            return
        job = event["job"]
        pct = int(job.progress * 100)
        key = (job.state, pct // 10 if not self.tty else pct)
        if self._last.get(job.id) == key:
            return
        self._last[job.id] = key
        if job.state == "running":
            line = f"  {job.label:<28} {pct:3d}%  {job.message}"
            if self.tty:
                sys.stderr.write("\r\033[K" + line[:150])
            else:
                sys.stderr.write(line + "\n")
        elif job.state in ("succeeded", "failed", "cancelled", "interrupted"):
            if self.tty:
                sys.stderr.write("\r\033[K")
            mark = {"succeeded": "ok", "failed": "FAILED", "cancelled": "--"}.get(job.state, "!!")
            took = f"{job.elapsed:6.1f}s" if job.elapsed is not None else ""
            cached = " (cached)" if job.cached else ""
            sys.stderr.write(f"{mark:>6} {job.label:<28} {took}{cached}  {job.message}\n")
        sys.stderr.flush()


def _batch(args) -> int:
    from studio.core import project as projectfile
    from studio.services.pipeline import plan, preflight
    from studio.services.session import Studio

    stages = [s.strip() for s in args.stages.split(",") if s.strip()] if args.stages else None
    # the plan and its inputs first: bad input is refused before the project folder exists
    project = projectfile.load(Path(args.batch))
    preflight(project, plan(project, stages, args.target))
    studio = Studio(project)
    if not args.quiet:
        if studio.interrupted_jobs:
            print(f"note: {studio.interrupted_jobs} job(s) of an earlier run were interrupted; "
                  "resuming from the cached stages", file=sys.stderr)
        print(f"QStudio batch: {studio.project.name} ({studio.project.path})", file=sys.stderr)
    studio.pipeline.listeners.append(_Printer(args.quiet))
    try:
        summary = asyncio.run(studio.run_pipeline(stages, args.target,
                                                  remeasure=args.remeasure))
    finally:
        studio.close()
    if args.json:
        print(json.dumps(summary.to_dict(), indent=1))
    if not args.quiet:
        for g in summary.gates:
            mark = "pass" if g["passed"] else "FAIL"
            print(f"  gate {g['gate']} [{g['target']}]: {g['value']:.4f} "
                  f"(threshold {g['threshold']}) {mark}", file=sys.stderr)
        if summary.report:
            print(f"report: {summary.report}", file=sys.stderr)
        print(f"{summary.state} in {summary.seconds:.1f}s", file=sys.stderr)
    if summary.state != "succeeded":
        failed = [j for j in summary.jobs if j.state == "failed"]
        msg = summary.error or (failed[0].message if failed else summary.state)
        print(f"error: {msg}", file=sys.stderr)
        return summary.exit_code or 2
    return 0 if summary.gates_passed else 1


def _new(args) -> int:
    from studio.core import project as projectfile
    from studio.services.projects import source_ref
    from studio.services.session import Studio

    # an unknown sample or a folder that is not a checkpoint: a clear error, nothing written
    if args.sample:
        source = source_ref("sample", args.sample)
    elif args.new_onnx:
        source = source_ref("onnx", args.new_onnx)
    else:
        source = source_ref("checkpoint", args.checkpoint)
    sections: dict[str, Any] = {}
    quant: dict[str, Any] = {}
    if args.scheme:
        quant["scheme"] = args.scheme
    if args.new_placement:
        quant["placement"] = args.new_placement
    if quant:
        sections["quantization"] = quant
    graph: dict[str, Any] = {}
    if args.new_shapes:
        graph["shapes"] = _shapes(args.new_shapes)
    for key, value in (("calibration", args.new_calibration),
                       ("validation", args.new_validation)):
        if value:
            path = Path(value).expanduser().resolve()
            if not path.is_file() or path.suffix.lower() not in (".npz", ".npy"):
                raise StudioError(f"--{key} {value}: no such .npz / .npy file of sample inputs")
            graph[key] = str(path)
    if args.new_seq_len:
        graph["seq_len"] = args.new_seq_len
    if graph:
        if projectfile.infer_kind(source) == "causal-lm":
            raise StudioError("--calibration, --validation, --shape and --seq-len are for "
                              "encoders and ONNX graphs; a causal LM calibrates on text "
                              "(quantization.calibration_text)")
        sections["graph"] = graph
    if args.new_onnx and graph.get("calibration"):
        from studio.services.graphs import check_graph_samples

        # the shapes and the sample files against the graph: now, not minutes into a run
        check_graph_samples(Path(source), graph.get("shapes", {}), Path(graph["calibration"]),
                            Path(graph["validation"]) if graph.get("validation") else None)
    studio = Studio.create(Path(args.file), source, args.new_targets, **sections)
    print(f"created {studio.project.path}")
    studio.close()
    return 0


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "—"


def _open_history(p):
    """The project's run history, or None when it has none yet (nothing is created)."""
    from studio.core.jobs import JobStore

    db = p.folder / "runs.sqlite"
    return JobStore(db) if db.exists() else None


def _layers(p) -> tuple[list[dict[str, Any]] | None, list[str] | None, str | None]:
    """(layer table, unmatched override patterns, why there is no table)."""
    from studio.core.modelinfo import ModelInfo
    from studio.services import precision
    from studio.services.projects import describe_model

    try:
        info = describe_model(p)
    except StudioError as exc:
        return None, None, exc.message
    if not isinstance(info, ModelInfo):
        return None, None, ("the model is an ONNX file: per-layer precision needs a checkpoint "
                            "or a sample model")
    return precision.layer_precisions(p, info), precision.unmatched(p, info), None


def _info(args) -> int:
    from studio.core import project as projectfile
    from studio.services import history

    p = projectfile.load(Path(args.file))
    data = p.to_dict()
    data["file"] = str(p.path)
    runs: list[history.RunInfo] = []
    latest: int | None = None
    metrics: list[dict[str, Any]] = []
    store = _open_history(p)
    if store is not None:
        try:
            runs = history.runs(p, store, 5)
            with_results = history.runs_with_results(store)
            if with_results:
                latest = with_results[0]
                metrics = [dict(m.to_dict(), run=latest, stage=job.stage)
                           for job, m in history.run_metrics(store, latest)]
        finally:
            store.close()
    data["recent_runs"] = [r.to_dict() for r in runs]
    data["latest_run"] = latest
    data["latest_metrics"] = metrics
    layers = unmatched = why = None
    if args.info_json or p.quantization["overrides"]:
        layers, unmatched, why = _layers(p)
    if args.info_json:
        data["layers"] = layers
        data["unmatched_overrides"] = unmatched
        if why:
            data["layers_error"] = why
        print(json.dumps(data, indent=1))
        return 0
    print(f"{p.name}  ({p.path})")
    print(f"  model     {p.model['source']}  ({p.model['kind']})"
          + (f"  draft {p.model['draft']}" if p.model["draft"] else ""))
    q = p.quantization
    if p.model["kind"] == "causal-lm":
        print(f"  export    prompt {p.export['prompt_length']}, context "
              f"{p.export['context_length']}")
        print(f"  recipe    {q['scheme']} {q['weight_granularity']}, {q['calibration_samples']} "
              f"calibration windows, {len(q['overrides'])} override(s)")
    else:
        g = p.graph
        shapes = ", ".join(f"{k}={v}" for k, v in g["shapes"].items())
        print("  graph     " + (f"sequence length {g['seq_len']}" if p.model["kind"] == "encoder"
                                else f"shapes {shapes or 'as the file declares them'}"))
        calib = g["calibration"] or q["calibration_text"]
        print(f"  recipe    {q['scheme']} {q['weight_granularity']}, up to "
              f"{q['calibration_samples']} calibration samples from {calib}; placement "
              f"{q['placement']}")
    for pattern in unmatched or []:
        print(f"            override {pattern!r} covers no layer of the model")
    print(f"  targets   {', '.join(p.targets)}")
    print(f"  stages    {', '.join(p.pipeline['stages'])}")
    for r in runs:
        print(f"  run {r.id}: {r.state}  (started {_when(r.created)})")
    if metrics:
        print(f"  latest figures (run {latest}):")
        for m in metrics:
            where = m["device"] + (f" / {m['target']}" if m["target"] else "")
            print(f"    {m['name']:<26} {m['value']:>12.4g} {m['unit']:<9} {m['source']:<10} {where}")
    return 0


def _num(v: float | None, signed: bool = False) -> str:
    if v is None:
        return "—"
    return f"{v:+.4g}" if signed else f"{v:.4g}"


def _compare(args) -> int:
    from studio.core import project as projectfile
    from studio.services import history

    p = projectfile.load(Path(args.file))
    store = _open_history(p)
    if store is None:
        raise StudioError(f"{p.path.name} has no runs yet: run the pipeline twice "
                          "(e.g. studio --batch FILE, change the recipe, run again)")
    try:
        if args.run_a is not None and args.run_a == args.run_b:
            raise StudioError(f"run {args.run_a} was given twice: name two different runs")
        comp = history.compare(store, args.run_a, args.run_b)
    finally:
        store.close()
    a, b = comp["run_a"]["id"], comp["run_b"]["id"]
    if a == b:
        raise StudioError(f"run {a} is the newest run with results: name a second run to "
                          "compare it with (see studio info)")
    if args.compare_json:
        print(json.dumps(comp, indent=1))
        return 0
    print(f"run {b} vs run {a}")
    for side in ("run_a", "run_b"):
        r = comp[side]
        print(f"  run {r['id']}: {r['state']}, started {_when(r['created'])}")
    if not comp["settings_recorded"]:
        print("settings: not recorded for both runs (runs of an older QStudio)")
    elif comp["settings"]:
        print("settings changed:")
        for s in comp["settings"]:
            print(f"  {s['key']}: {s['a']!r} → {s['b']!r}")
    else:
        print("settings: none changed")
    rows = comp["metrics"]
    if not rows:
        print("metrics: neither run recorded any")
        return 0
    print(f"metrics (run {a} → run {b}):")
    table = []
    for m in rows:
        where = m["device"] + (f" / {m['target']}" if m["target"] else "")
        rel = "" if m["relative"] is None else f"({m['relative']:+.2%})"
        mark = {True: "better", False: "worse"}.get(m["better"], "")
        if m["delta"] == 0:
            mark = "same"
        elif m["a"] is None or m["b"] is None:
            mark = f"only in run {a if m['b'] is None else b}"
        unit = f" {m['unit']}" if m["unit"] else ""

        def value(v: float | None, unit: str = unit) -> str:
            return "—" if v is None else _num(v) + unit

        table.append((m["name"], m["source"], where, f"{value(m['a'])} → {value(m['b'])}",
                      _num(m["delta"], signed=True), rel, mark))
    widths = [max(len(r[i]) for r in table) for i in range(6)]
    for r in table:
        cells = [r[i].ljust(widths[i]) for i in range(6)] + [r[6]]
        print(("  " + "  ".join(cells)).rstrip())
    return 0


def _g(x: float | None) -> str:
    return "—" if x is None else f"{x:.3g}"


def _layerdiff(args) -> int:
    from studio.core import project as projectfile
    from studio.services.layerdiff import layerdiff_result

    p = projectfile.load(Path(args.file))
    got = layerdiff_result(p, args.ld_target)
    if args.ld_json:
        print(json.dumps(got, indent=1))
        return 0
    r, rows = got["result"], got["rows"]
    pairs, title = list(r["pairs"]), r["pair_titles"]
    print(f"layer diff of {p.name} on {r['target']}: {r['graph']} graph, {r['windows']} "
          f"held-out window(s) of {r['window_tokens']} tokens, {r['probes']} tensors")
    print(f"  host QDQ: measured on host-cpu (ONNX Runtime, graph optimizations off); "
          f"HTP: {r['source']} on {r['device']}")
    print("  relative error ||a - b|| / ||b|| (cosine):")
    shown = [x for x in rows if args.ld_all or x["kind"] == "boundary"]
    width = max(len(x["name"]) for x in shown)
    print("  " + "tensor".ljust(width) + "".join(f"  {title[q]:>22}" for q in pairs))
    for x in shown:
        cells = "".join(f"  {_g(x[q]['rel_error']):>9} ({x[q]['cosine']:.6f})" for q in pairs)
        print("  " + x["name"].ljust(width) + cells)
    for q in pairs:
        fj = r["first_jump"].get(q)
        print(f"  first jump, {title[q]}: " + (
            f"{fj['name']} ({fj['op']}), {_g(fj['input_rel_error'])} -> {_g(fj['rel_error'])}"
            if fj else "none"))
    part = r.get("parting")
    if "parting" in r:
        print("  host QDQ and the HTP part at: " + (
            f"{part['name']} ({part['op']}): vs FP32 host QDQ {_g(part['qdq_rel_error'])}, "
            f"HTP {_g(part['htp_rel_error'])}; {part['worse']} worse" if part else "nowhere"))
    for a in r.get("apart", [])[:3]:
        print(f"    {a['name']}: error gain host QDQ {_g(a['qdq_gain'])}x, "
              f"HTP {_g(a['htp_gain'])}x")
    lg = r["logits"]
    print("  final logits vs FP32 (KL nats, top-1):" + "".join(
        f"  {name} {_g(lg[k]['kl_divergence'])}, {lg[k]['top1_agreement']:.1%}"
        for k, name in (("qdq", "host QDQ"), ("qdq_default", "host QDQ ORT-default"),
                        ("htp", "HTP")) if k in lg))
    changed = [k for k, v in r["extra_outputs"].items() if not v["logits_identical"]]
    print("  extra outputs changed the logits of: " + ", ".join(changed) if changed
          else "  extra outputs left every runtime's logits bit-identical")
    return 0


def _overrides(args) -> int:
    from studio.services import precision
    from studio.services.session import Studio

    studio = Studio.open(Path(args.file))
    try:
        if args.overrides_command == "export":
            n = precision.export_overrides(studio, Path(args.out))
            print(f"wrote {args.out}: {n['activations']} activation and {n['params']} weight "
                  "encodings (qnn-onnx-converter --quantization_overrides)")
            return 0
        if args.overrides_command == "adopt":
            rules = precision.adopt_autoprecision(studio)
            print(f"{studio.project.path.name}: {len(rules)} auto-precision rule(s) in "
                  "quantization.overrides" + ("" if rules else " (the base already met the "
                                              "target)"))
            for pattern, prec in rules.items():
                print(f"  {pattern} = {prec}")
            return 0
        added, unnamed = precision.import_overrides(studio, Path(args.encodings))
        print(f"added {len(added)} override(s) to {studio.project.path.name}")
        for pattern, prec in added.items():
            print(f"  {pattern} = {prec}")
        if unnamed:
            print(f"  {len(unnamed)} tensor(s) no rule can name (kept at the scheme's "
                  f"precision): {', '.join(unnamed[:5])}", file=sys.stderr)
        return 0
    finally:
        studio.close()


def _targets() -> int:
    from studio.core.catalog import load_catalog

    for key, chip in load_catalog().items():
        print(f"{key:<24} {chip.name:<32} htp_arch v{chip.htp_arch}  soc_model {chip.soc_model}")
    return 0


def _estimate(args) -> int:
    from studio.services import estimate

    if args.calibration:
        if args.config or args.chip:
            raise StudioError("--calibration takes no --config or --chip")
        cal = estimate.write_fit() if args.write_fit else estimate.calibration()
        if args.est_json:
            print(json.dumps(cal, indent=2))
            return 0
        print(f"performance model {cal['model_version']} (estimated) against published "
              "decode tok/s")
        print(f"{'model':<14} {'scheme':<6} {'chip':<26} {'ctx':>5} {'published':>9} "
              f"{'estimated':>9} {'err %':>7} {'loo %':>7}")
        for r in cal["rows"]:
            print(f"{r['model']:<14} {r['scheme']:<6} {r['chip']:<26} {r['context']:>5} "
                  f"{r['decode_tokens_per_s']:>9.2f} {r['estimated_decode_tokens_per_s']:>9.2f} "
                  f"{r['ape']:>7.1f} {r['loo_ape']:>7.1f}")
        for r in cal["skipped"]:
            print(f"{r['model']:<14} {r['scheme']:<6} {r['chip']:<26} skipped: {r['reason']}")
        print(f"decode MdAPE {cal['decode_mdape']:.2f} %, leave-one-out MdAPE "
              f"{cal['decode_loo_mdape']:.2f} % ({cal['anchors_used']} anchors)")
        if cal["prefill_mdape"] is not None:
            print(f"prefill MdAPE {cal['prefill_mdape']:.2f} % ({cal['prefill_anchors']} anchor(s);"
                  " no leave-one-out with one)")
        p = cal["params"]
        print("parameters: " + ", ".join(f"{k} {v}" for k, v in p.items())
              + (" (written)" if args.write_fit else ""))
        return 0
    if args.write_fit:
        raise StudioError("--write-fit goes with --calibration")
    if not args.config or not args.chip:
        raise StudioError("estimate needs --config CONFIG and --chip CHIP (or --calibration)")
    est = estimate.estimate_config(args.config, args.chip, args.est_scheme, args.context,
                                   args.prompt_tokens)
    if args.est_json:
        print(json.dumps(est, indent=2))
        return 0
    gb = 1e9
    print(f"{est['model']} {est['scheme']} on {est['chip_name']}, context {est['context']}: "
          f"estimated ({est['model_version']}), not measured")
    print(f"  decode    {est['decode_tokens_per_s']:8.2f} tok/s  "
          f"({est['decode_ms_per_token']:.2f} ms/token, {est['bound']}-bound)")
    print(f"  prefill   {est['prefill_tokens_per_s']:8.2f} tok/s  "
          f"({est['prompt_tokens']} prompt tokens, TTFT {est['time_to_first_token_ms']:.1f} ms, "
          f"{est['prefill_bound']}-bound)")
    print(f"  weights   {est['weight_bytes'] / gb:8.3f} GB   KV cache "
          f"{est['kv_cache_bytes'] / gb:.3f} GB ({est['kv_bytes_per_token']} B/token)")
    print(f"  DRAM read {est['decode_dram_bytes_per_token'] / gb:8.3f} GB per decoded token "
          f"(chip {est['chip_figures']['ddr_gbps']} GB/s)")
    return 0


def _native_output_to_stderr() -> None:
    """Keep stdout for our own output: the QNN backend prints log lines on file descriptor 1,
    which would corrupt ``--json`` and the streamed text. Fd 1 becomes a copy of fd 2 and
    ``sys.stdout`` writes to a private duplicate of the original stdout."""
    sys.stdout.flush()
    try:
        private = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no usable descriptors (a windowed app): nothing to protect
        return
    sys.stdout = io.TextIOWrapper(os.fdopen(private, "wb"), encoding="utf-8",
                                  line_buffering=True)


def _generate_genie(args, p, stream) -> int:
    from studio.services.bundle import genie_generate

    rest = [f for f, v in (("--speculative", args.speculative or args.prompt_lookup or args.draft),
                           ("--kv", args.kv), ("--window", args.window),
                           ("--temperature", args.temperature), ("--stop", args.stop)) if v]
    if rest:
        raise StudioError(f"Genie runs the bundle's greedy dialog: leave out {', '.join(rest)}")
    target = None
    if args.device and args.device not in ("htp-sim", "cpu"):
        if not args.device.startswith("htp-sim:"):
            raise StudioError("Genie runs here on the HTP simulator: use --device htp-sim[:CHIP]")
        target = args.device.partition(":")[2]
    out = genie_generate(p, args.prompt, target, args.max_new_tokens, on_text=stream)
    if args.generate_json:
        print(json.dumps(out, indent=1))
        return 0
    _print_speed(f"{out['tokens_out']} tokens", out)
    return 0


def _print_speed(what: str, out: dict) -> None:
    """A generation's closing line: tokens, time to first token, decode rate, their source."""
    tps, ttft = out["decode_tokens_per_s"], out["time_to_first_token_ms"]
    print(f"\n--\n{what} · time to first token "
          + (f"{ttft:.1f} ms · " if ttft is not None else "not timed · ")
          + (f"decode {tps:.1f} tok/s" if tps else "no decode steps")
          + f" · {out['source']} on {out['device_name']}"
          + (f" ({out['timing_note']})" if out["timing_note"] else ""), file=sys.stderr)


def _generate(args) -> int:
    from studio.core import project as projectfile
    from studio.core.sampling import SamplingConfig
    from studio.services.generate import generate

    p = projectfile.load(Path(args.file))
    cfg = SamplingConfig(args.temperature, args.top_k, args.top_p, args.seed)
    _native_output_to_stderr()
    started = [False]

    def show(text: str) -> None:  # the prompt, then the new text as it streams
        if not started[0]:
            started[0] = True
            print(args.prompt, end="", flush=True)
        print(text, end="", flush=True)

    stream = None if args.generate_json else show
    if args.runtime == "genie":
        return _generate_genie(args, p, stream)
    spec_mode = None
    if args.speculative or args.prompt_lookup or args.draft:
        spec_mode = "lookup" if args.prompt_lookup else "draft"
        if args.prompt_lookup and args.draft:
            raise StudioError("give either --draft REF or --prompt-lookup, not both")
    draft = args.draft
    if draft and not draft.startswith("sample:"):
        draft = str(Path(draft).expanduser().resolve())
    out = generate(p, args.prompt, args.device, args.max_new_tokens, cfg, args.stop,
                   on_text=stream, speculative=spec_mode, draft_ref=draft, k=args.k,
                   adaptive=not args.fixed_k, kv=args.kv, window=args.window)
    if args.generate_json:
        print(json.dumps(out, indent=1))
        return 0
    _print_speed(f"{len(out['tokens'])} tokens ({out['stopped']})", out)
    kvc = out.get("kv_cache")
    if kvc:
        print(f"KV cache: {kvc['dtype']}, {kvc['bytes_measured'] / 1024:.0f} KiB held "
              f"({kvc['bytes_by_formula'] / 1024:.0f} KiB by formula)"
              + (f", window {kvc['window']} tokens (ring buffer)" if kvc["window"] else ""),
              file=sys.stderr)
    if "speculative" in out:
        sp = out["speculative"]
        split = sp["time_split_s"]
        print(f"speculative ({sp['proposer']}, k ≤ {sp['k']}): acceptance "
              f"{sp['acceptance_rate']:.0%}, {sp['tokens_per_target_pass']:.2f} tokens per "
              f"target pass ({sp['target_passes']} passes); time: draft "
              f"{split['draft'] * 1e3:.0f} ms, verify {split['verify'] * 1e3:.0f} ms, host "
              f"{split['host'] * 1e3:.0f} ms", file=sys.stderr)
        est = sp.get("estimated")
        if est:
            print(f"estimated on {est['chip']} ({est['scheme']}): {est['speedup']:.2f}x "
                  f"({est['plain_tokens_per_s']:.0f} -> {est['speculative_tokens_per_s']:.0f} "
                  "tok/s, performance model)", file=sys.stderr)
    return 0


def _agent(args) -> int:
    import asyncio
    import signal
    import ssl

    from studio.services.agent import server

    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise StudioError(f"cannot read the token file {args.token_file}: "
                              f"{exc.strerror}") from None
        if not token:
            raise StudioError(f"the token file {args.token_file} is empty")
    else:
        token = server.new_token()
    ctx = None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise StudioError("TLS needs both --tls-cert and --tls-key")
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ctx.load_cert_chain(args.tls_cert, args.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise StudioError(f"cannot load the TLS certificate / key: {exc}") from None
    if args.store:
        store = Path(args.store)
    else:
        import platformdirs

        store = platformdirs.user_data_path("qstudio", appauthor=False) / "agent"
    if args.host not in ("127.0.0.1", "localhost", "::1") and ctx is None:
        print("warning: serving beyond this machine without TLS: the token crosses the "
              "network in clear", file=sys.stderr)

    def ready(url: str) -> None:
        print(f"QStudio agent listening on {url}", flush=True)
        if not args.token_file:
            print(f"pairing token: {token}", flush=True)
        print(f"store: {store}", flush=True)

    async def main() -> None:
        task = asyncio.ensure_future(server.serve(
            store, args.host, args.port, token, ctx, int(args.max_upload_mb * (1 << 20)),
            args.max_jobs, ready))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            pass

    try:
        asyncio.run(main())
    except OSError as exc:
        raise StudioError(f"cannot listen on {args.host}:{args.port} ({exc.strerror}): choose "
                          "another --port") from None
    print("agent stopped", file=sys.stderr)
    return 0


def _devices(args) -> int:
    from studio.services.registry import Registry

    reg = Registry()
    if args.devices_command == "add":
        token = args.token
        if args.token_file:
            try:
                token = Path(args.token_file).read_text()
            except OSError as exc:
                raise StudioError(f"cannot read {args.token_file}: {exc.strerror}") from None
        a = reg.add(args.name, args.url, token or "", args.cafile)
        health = _check_agent(reg, a.name)
        print(f"added {a.id} ({a.url}): {health}")
        return 0
    if args.devices_command == "remove":
        reg.remove(args.name)
        print(f"removed agent:{args.name}")
        return 0
    if args.devices_command == "sdk":
        if args.clear or args.path:
            reg.set_sdk_root(None if args.clear else args.path)
        root, where = reg.sdk_root()
        print(f"QAIRT SDK: {root} (from {where})" if root else
              "QAIRT SDK: not set (studio devices sdk PATH, or QNN_SDK_ROOT)")
        return 0
    from studio.services.devices import device_state

    rows = [{"id": "cpu", "kind": "host-cpu", "source": "measured", "status": "ok"}]
    if device_state()["htp_sim"]["available"]:
        rows.append({"id": "htp-sim:CHIP", "kind": "htp-sim", "source": "simulated",
                     "status": "ok (one per catalog chip: studio targets)"})
    for a in reg.agents():
        rows.append({"id": a.id, "kind": "agent", "url": a.url,
                     "status": _check_agent(reg, a.name)})
    from studio.services.devices import adb_devices

    rows += adb_devices()
    root, _where = reg.sdk_root()
    for r in rows:
        if r["kind"] == "adb" and r["id"] != "adb" and not root:
            r["status"] += "; no QAIRT SDK set: studio devices sdk PATH"
    if args.devices_json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        print(f"{r['id']:<28} {r['kind']:<9} {r.get('url', ''):<28} {r['status']}")
    return 0


def _check_agent(reg, name: str) -> str:
    try:
        c = reg.client(name)
        h = c.health()
        info = c.info()
    except StudioError as exc:
        return f"unreachable: {exc.message}"
    backends = ", ".join(f"{b['id']} ({b['source']})" for b in info.get("backends", [])[:3])
    more = len(info.get("backends", [])) - 3
    return (f"ok, {h['rtt_ms']:.1f} ms; {info['machine'].get('name')} "
            f"({info['machine'].get('machine')}); backends {backends}"
            + (f" and {more} more" if more > 0 else ""))


def _waterfall(args) -> int:
    from studio.core import project as projectfile
    from studio.services import waterfall as wfs

    _native_output_to_stderr()
    data = wfs.waterfall(projectfile.load(Path(args.file)), args.chip)
    if args.waterfall_json:
        print(json.dumps(data, indent=1))
        return 0
    for line in wfs.table_lines(data):
        print(line)
    print(f"window {data['window']} of {data['context']} tokens · speculative: prompt lookup, "
          f"k <= {data['k']}, {data['tokens_per_pass']:.2f} tokens per target pass · pruned "
          f"without block(s) {data['dropped_blocks']}")
    print(data["estimate_note"])
    return 0


def _bundle(args) -> int:
    from studio.core import project as projectfile
    from studio.services.bundle import build_bundle

    _native_output_to_stderr()
    out = build_bundle(projectfile.load(Path(args.file)), args.target,
                       Path(args.out).expanduser().resolve() if args.out else None, args.parts,
                       args.prefill_length)
    if args.bundle_json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{out['summary']}\nwrote {out['folder']}")
    for name, f in out["files"].items():
        print(f"  {name:<28} {f['bytes']:>12,} bytes  sha256 {f['sha256'][:16]}…")
    for c in out["checks"]:
        print(f"  {'same' if c['identical'] else 'DIFFERENT'}: {c['prompt']!r} + "
              f"{c['studio_tokens']} tokens (Genie {c['genie_wall_s']:.1f} s, simulated)")
    return 0


def _shapes(specs: list[str]) -> dict[str, list[int]]:
    shapes = {}
    for spec in specs:
        name, _, dims = spec.partition("=")
        try:
            shapes[name] = [int(d) for d in dims.split(",")]
        except ValueError:
            raise StudioError(f"--shape {spec!r}: write NAME=D,D,... with whole numbers, e.g. "
                              "image=1,3,224,224") from None
    return shapes


def _graph(args) -> int:
    from studio.services.graphs import deploy_graph

    shapes = _shapes(args.shape)
    model = Path(args.model).expanduser().resolve()
    out = Path(args.out).expanduser().resolve() if args.out else model.with_suffix(
        ".studio-graph")
    _native_output_to_stderr()
    res = deploy_graph(model, out, Path(args.calibration).expanduser(), args.target, shapes,
                       args.placement, args.scheme, args.weights,
                       validation=Path(args.validation).expanduser() if args.validation else None)
    if args.graph_json:
        print(json.dumps(res, indent=1))
        return 0
    n = res["on_npu"]
    print(f"{model.name} on {res['target']} ({res['placement']}): {n['qnn_nodes']} of "
          f"{n['total_nodes']} nodes on the NPU in {n['qnn_subgraphs']} subgraph(s)"
          + (f", {n['transitions']} NPU<->CPU transitions carrying {n['bytes_crossing']} bytes"
             if n["transitions"] else ""))
    for node in res["cpu_nodes"]:
        print(f"  on the CPU: {node['name']} ({node['op_type']}): {node['reason']}")
    for r in res["rewrites"]:
        print(f"  rewrite {r['rewrite']} at {len(r['nodes'])} place(s): {r['description']}")
    if res["rewrite_check"]:
        print(f"  rewrite check: max |error| {res['rewrite_check']['max_abs_error']:.3g} vs "
              "the original graph (FP32)")
    for name, o in res["validation"]["outputs"].items():
        print(f"{name}: cosine {o['cosine']:.5f}, max |error| {o['max_abs_error']:.4g} vs FP32 "
              f"({res['validation']['on']})")
    lat = res["latency_ms"]
    print(f"latency per inference: {lat['htp']['value']:.2f} ms ({lat['htp']['source']}: "
          f"{lat['htp']['note']}); FP32 on the host CPU {lat['cpu_fp32']['value']:.2f} ms "
          f"(measured)\nwrote {out}")
    return 0


def _prune(args) -> int:
    from studio.core import project as projectfile
    from studio.services.pruning import prune

    p = projectfile.load(Path(args.file))
    out = prune(p, args.drop, Path(args.out).expanduser().resolve() if args.out else None)
    if args.prune_json:
        print(json.dumps(out, indent=1))
        return 0
    t = out["ablation"]
    print(f"perplexity over {t['tokens']} held-out tokens: {t['baseline_ppl']:.2f} "
          "(measured, host CPU, FP32)")
    print(f"{'dropped block':>14} {'perplexity':>11} {'change':>8}")
    for r in t["blocks"]:
        print(f"{r['block']:>14} {r['ppl']:>11.2f} {r['delta']:>+8.1%}")
    print(f"pruned (without {t['dropped']}): ppl {t['pruned_ppl']:.2f} "
          f"({t['pruned_delta']:+.1%})")
    if out.get("checkpoint"):
        print(f"wrote {out['checkpoint']} and {out['project']} (model.source = the pruned "
              f"checkpoint): studio --batch {out['project']}")
    return 0


def _profile(args) -> int:
    from studio.services import profile_view as pv
    from studio.services import profiles

    if args.profile_command == "import":
        data = profiles.import_profile_file(args.profile_file, onnx_path=args.onnx)
    else:
        from studio.core import project as projectfile

        p = projectfile.load(Path(args.file))
        data = profiles.load_run_profile(p, args.run, args.profile_target)
    if args.profile_command == "export":
        out = profiles.export(data, args.profile_format, args.out)
        print(f"wrote {out} ({args.profile_format}, {len(data.table)} events, "
              f"{data.source})")
        return 0
    if args.profile_json:
        print(json.dumps(profiles.summary(data), indent=1, default=str))
        return 0
    st = data.stats
    print(f"{data.title} · {data.source} · {len(data.profile.ops)} ops")
    if st.get("runs"):
        load = st.get("median_other_load")
        print(f"median of {st['runs']} runs {st['median']:,.0f} {data.unit}, "
              f"±{st['spread']:.1%} (range {st['range']:.0%})"
              + (f", other processes used {load:.0%} of the host CPUs" if load is not None
                 else ""))
        for w in st.get("warnings", []):
            print(f"warning: {w}")
    by = getattr(args, "by", "block")
    if by == "layer-block":
        layers, blocks, m = pv.layer_block_table(data)
        short = [b.split(" / ")[0].replace("attention: ", "attn ")[:10] for b in blocks]
        print(f"{'layer':<15}" + "".join(f"{b:>11}" for b in short))
        for i, name in enumerate(layers):
            print(f"{name:<15}" + "".join(f"{v:>10.1%} " for v in m[i]))
        return 0
    print(f"{by:<24} {'median':>14} {'share':>7} {'min':>14} {'max':>14} {'ops':>5}")
    for r in pv.breakdown(data, by):
        print(f"{r.name[:24]:<24} {r.value:>14,.0f} {r.share:>7.1%} {r.low:>14,.0f} "
              f"{r.high:>14,.0f} {r.count:>5}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        args = _parser().parse_args(argv)
        if args.command == "new":
            return _new(args)
        if args.command == "info":
            return _info(args)
        if args.command == "compare":
            return _compare(args)
        if args.command == "layerdiff":
            return _layerdiff(args)
        if args.command == "overrides":
            return _overrides(args)
        if args.command == "targets":
            return _targets()
        if args.command == "estimate":
            return _estimate(args)
        if args.command == "sweep":
            from studio.cli.sweep import sweep_command

            return sweep_command(args)
        if args.command == "demo":
            raise StudioError("the demo opens a window, which the command line alone cannot: "
                              f"run `studio demo {args.file}`")
        if args.command == "report":
            from studio.cli.report import report_command

            return report_command(args)
        if args.command == "profile":
            return _profile(args)
        if args.command == "generate":
            return _generate(args)
        if args.command == "prune":
            return _prune(args)
        if args.command == "bundle":
            return _bundle(args)
        if args.command == "graph":
            return _graph(args)
        if args.command == "waterfall":
            return _waterfall(args)
        if args.command == "agent":
            return _agent(args)
        if args.command == "devices":
            return _devices(args)
        if args.batch:
            return _batch(args)
        raise StudioError("nothing to do: give --batch FILE, or a command (new, info, compare, targets)")
    except StudioError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed early (studio ... | head): not an error
        sys.stdout = None  # type: ignore[assignment]
        return 0


if __name__ == "__main__":
    sys.exit(main())
