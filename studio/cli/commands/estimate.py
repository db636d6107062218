"""``studio estimate --config CONFIG --chip CHIP [--scheme S] [--context N] [--json]``,
``studio estimate --calibration [--json] [--write-fit]``, ``studio estimate --heldout [--json]``:
estimated prefill / decode tok/s of an architecture on a chip (performance model, no weights
needed), the model against its published anchors, and against the published speeds held out
from its fit.
"""

from __future__ import annotations

import argparse
import json

from studio.cli.command import Context
from studio.cli.commands import registered
from studio.cli.common import whole
from studio.core.errors import StudioError
from studio.core.units import signed
from studio.services import estimate


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="a HF config.json, a checkpoint folder, or a bundled name "
                                    "(e.g. llama-3.2-1b)")
    p.add_argument("--chip", help="a catalog key or part number (see studio targets)")
    p.add_argument("--scheme", dest="est_scheme", default="W4A16",
                   help="W4A16 (default), W4, W8A16, W8A8 or FP16")
    p.add_argument("--context", type=whole(1, 1 << 20), default=4096, help="KV-cache context (default 4096)")
    p.add_argument("--prompt-tokens", type=whole(1, 1 << 20), default=None,
                   help="prompt length for prefill (default: min(context, 1024))")
    p.add_argument("--image", type=whole(28, 1 << 14), default=None,
                   help="a vision-language model (Qwen2-VL, Qwen2.5-VL): a square image of "
                        "this many pixels a side (e.g. 448); time to first token includes its "
                        "vision tower")
    p.add_argument("--draft-config", default=None,
                   help="a draft model's config (as --config): whether it can read this "
                        "model's token table, and the bytes that saves")
    p.add_argument("--draft-embedding", choices=("auto", "target", "own"), default="auto",
                   help="with --draft-config, as model.draft_embedding: target declares the "
                        "draft distilled on this model's table")
    p.add_argument("--calibration", action="store_true",
                   help="published vs estimated tok/s on the anchors, MdAPE and leave-one-out")
    p.add_argument("--heldout", action="store_true",
                   help="estimated vs published tok/s on the rows held out from the fit "
                        "(resources/perf/heldout.toml): every row with its source, MdAPE by "
                        "chip, runtime and model size")
    p.add_argument("--write-fit", action="store_true",
                   help="with --calibration: refit and write resources/perf/model.toml")
    p.add_argument("--json", dest="est_json", action="store_true", help="print JSON")


def run(args: argparse.Namespace, ctx: Context) -> int:
    if args.draft_config and (args.heldout or args.calibration):
        raise StudioError("--draft-config goes with --config and --chip")
    if args.heldout:
        if args.config or args.chip or args.calibration or args.write_fit:
            raise StudioError("--heldout takes no --config, --chip, --calibration or --write-fit")
        return _print_heldout(estimate.heldout(), args.est_json)
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
                                   args.prompt_tokens, args.image, args.draft_config,
                                   args.draft_embedding)
    if args.est_json:
        print(json.dumps(est, indent=2))
        return 0
    gb = 1e9
    print(f"{est['model']} {est['scheme']} on {est['chip_name']}, context {est['context']}: "
          f"estimated ({est['model_version']}), not measured")
    print(f"  decode    {est['decode_tokens_per_s']:8.2f} tok/s  "
          f"({est['decode_ms_per_token']:.2f} ms/token, {est['bound']}-bound)")
    vis = est.get("vision")
    if vis:
        print(f"  vision    {vis['encoder_ms']:8.1f} ms     ({vis['image_px']}x{vis['image_px']} "
              f"image: {vis['patches']} patches -> {vis['image_tokens']} tokens, "
              f"{vis['params'] / 1e6:.0f} M parameters at {vis['scheme']}, "
              f"{vis['encoder_bound']}-bound)")
        print(f"  prefill   {est['prefill_tokens_per_s']:8.2f} tok/s  ({est['prompt_tokens']} "
              f"prompt + {vis['image_tokens']} image tokens, {vis['prefill_ms']:.1f} ms, "
              f"{est['prefill_bound']}-bound)")
        print(f"  TTFT      {est['time_to_first_token_ms']:8.1f} ms     (vision "
              f"{vis['encoder_ms']:.1f} + prefill {vis['prefill_ms']:.1f})")
    else:
        print(f"  prefill   {est['prefill_tokens_per_s']:8.2f} tok/s  "
              f"({est['prompt_tokens']} prompt tokens, TTFT "
              f"{est['time_to_first_token_ms']:.1f} ms, {est['prefill_bound']}-bound)")
    print(f"  weights   {est['weight_bytes'] / gb:8.3f} GB   KV cache "
          f"{est['kv_cache_bytes'] / gb:.3f} GB ({est['kv_bytes_per_token']} B/token)")
    print(f"  DRAM read {est['decode_dram_bytes_per_token'] / gb:8.3f} GB per decoded token "
          f"(chip {est['chip_figures']['ddr_gbps']} GB/s)")
    if est.get("draft_table"):
        print(f"  {est['draft_table']['line']}")
    return 0


def _print_heldout(rep: dict, as_json: bool) -> int:
    if as_json:
        print(json.dumps(rep, indent=2))
        return 0
    print(f"performance model {rep['model_version']} (estimated) against published decode "
          "tok/s it was not fitted to (resources/perf/heldout.toml)")
    print(f"{'model':<26} {'scheme':<6} {'chip':<25} {'ctx':>5} {'runtime':<13} "
          f"{'published':>9} {'estimated':>9} {'error':>7}")
    for r in sorted(rep["rows"], key=lambda r: (r["chip"], r["params_b"], r["model"])):
        print(f"{r['model'][:26]:<26} {r['scheme']:<6} {r['chip'][:25]:<25} {r['context']:>5} "
              f"{r['runtime'][:13]:<13} {r['decode_tokens_per_s']:>9.2f} "
              f"{r['estimated_decode_tokens_per_s']:>9.2f} {signed(100 * r['error'], '.1f'):>6}%"
              + ("  doubtful: " + r["doubt"] if r["doubt"] else ""))
    reasons: dict[str, int] = {}
    for r in rep["skipped"]:
        what = f"{r['chip'] if 'chip' in r['reason'] else r['model']}: {r['reason']}"
        reasons[what] = reasons.get(what, 0) + 1
    for what, n in sorted(reasons.items()):
        print(f"skipped {n} row(s) of {what}")

    def line(name: str, s: dict) -> str:
        return (f"  {name:<26} {s['rows']:>4} rows  MdAPE {s['mdape']:6.1f} %  median error "
                f"{signed(s['median_error'], '.1f'):>6} %")

    print(f"MdAPE {rep['clean']['mdape']:.1f} % on {rep['clean']['rows']} rows "
          f"({rep['all']['mdape']:.1f} % with the {rep['all']['rows'] - rep['clean']['rows']} "
          "doubtful ones); without the doubtful rows, by")
    for group in ("by_chip", "by_runtime", "by_size"):
        for name, s in rep[group].items():
            print(line(name, s))
    return 0


COMMAND = registered("estimate", add_arguments, run)
