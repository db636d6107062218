"""``studio generate FILE --prompt TEXT [--device D] [--max-new-tokens N] [--temperature T
--top-k K --top-p P --seed S] [--stop S ...] [--speculative [--draft REF | --prompt-lookup] [--k K]
[--fixed-k]] [--kv float|int8] [--window W] [--runtime studio|genie] [--raw] [--json]``:
generate text with the deployed model on a device, streaming it on stdout. The prompt goes in
through the checkpoint's chat template (``model.chat_template``) unless ``--raw``; stdout
shows it as the model reads it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from studio.cli.command import Context
from studio.cli.commands import registered
from studio.cli.common import device_arg, native_output_to_stderr, number, setting_arg, whole
from studio.core import project as projectfile
from studio.core.devices import device_names, resolve
from studio.core.errors import StudioError
from studio.core.sampling import SamplingConfig
from studio.services.bundle import genie_generate
from studio.services.generate import generate


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file")
    p.add_argument("--prompt", required=True)
    p.add_argument("--raw", action="store_true",
                   help="the prompt as written, without the checkpoint's chat template "
                        "(model.chat_template)")
    p.add_argument("--image", help="a vision-language model: the picture the prompt is about "
                                   "(PNG or JPEG; resized as the checkpoint's image "
                                   "processor resizes it, within export.image_size squared "
                                   "pixels)")
    p.add_argument("--device", type=device_arg, help="where it runs: " + ", ".join(device_names()) + " (cpu, "
                                    "the FP32 export on the host CPU, by default; htp-sim: the "
                                    "first target's simulator)")
    p.add_argument("--max-new-tokens", type=setting_arg("run.max_new_tokens"),
                   dest="max_new_tokens")
    p.add_argument("--temperature", type=number(0, 100), default=0.0, help="0 (default) is greedy")
    p.add_argument("--top-k", type=whole(0), default=0, dest="top_k")
    p.add_argument("--top-p", type=number(high=1, above=0), default=1.0, dest="top_p")
    p.add_argument("--seed", type=whole(0, 2**32 - 1))
    p.add_argument("--stop", action="append", help="a stop string (repeatable)")
    p.add_argument("--speculative", action="store_true",
                   help="speculative decoding: drafted tokens checked in one target pass")
    p.add_argument("--draft", help="the draft model (a checkpoint folder or sample:NAME; "
                                   "default: the project's model.draft)")
    p.add_argument("--prompt-lookup", action="store_true", dest="prompt_lookup",
                   help="draft by n-gram lookup in the text so far (no draft model)")
    p.add_argument("--k", type=whole(1, 64), default=4, help="drafted tokens per target pass (max)")
    p.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=None,
                   help="with a draft model: draft the next window on the CPU while the target "
                        "verifies (default: the project's run.speculative_overlap)")
    p.add_argument("--fixed-k", action="store_true", dest="fixed_k",
                   help="keep k fixed instead of adapting it to the acceptance")
    p.add_argument("--kv", choices=("float", "int8"),
                   help="the KV cache: float or int8 (uint8 cache I/O); default: the "
                        "project's quantization.kv_cache")
    p.add_argument("--window", type=whole(1),
                   help="attend to the last W tokens (W <= the context): a ring buffer that "
                        "lets generation run past the context")
    p.add_argument("--runtime", choices=("studio", "genie"), default="studio",
                   help="the studio's own runtime (default) or Qualcomm's Genie from the "
                        "project's Genie bundle (greedy, on the HTP simulator)")
    p.add_argument("--json", dest="generate_json", action="store_true")


def _generate_genie(args, p, stream, on_format) -> int:
    rest = [f for f, v in (("--speculative", args.speculative or args.prompt_lookup or args.draft),
                           ("--kv", args.kv), ("--window", args.window),
                           ("--temperature", args.temperature), ("--stop", args.stop)) if v]
    if rest:
        raise StudioError(f"Genie runs the bundle's greedy dialog: leave out {', '.join(rest)}")
    target = None
    if args.device:
        dev = resolve(args.device, p.targets)
        if not dev.runs_genie:
            raise StudioError("Genie runs here on the HTP simulator: use --device htp-sim[:CHIP]")
        target = dev.chip
    # a bundle takes minutes to build: generate runs the one the store holds, or says which
    # command builds it (before any work, nothing written)
    out = genie_generate(p, args.prompt, target, args.max_new_tokens, on_text=stream,
                         raw=args.raw, on_format=on_format, build=False)
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


def run(args: argparse.Namespace, ctx: Context) -> int:
    p = projectfile.load(Path(args.file))
    cfg = SamplingConfig(args.temperature, args.top_k, args.top_p, args.seed)
    native_output_to_stderr()
    shown = _Shown(args.prompt)
    stream = None if args.generate_json else shown.show
    if args.runtime == "genie":
        if args.image:
            raise StudioError("Genie runs the bundle's text dialog: an image prompt runs with "
                              "--runtime studio")
        return _generate_genie(args, p, stream, None if args.generate_json else shown.on_format)
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
                   adaptive=not args.fixed_k, kv=args.kv, window=args.window,
                   overlap=args.overlap,
                   image=Path(args.image).expanduser() if args.image else None, raw=args.raw,
                   on_format=None if args.generate_json else shown.on_format)
    if args.generate_json:
        print(json.dumps(out, indent=1))
        return 0
    if not shown.started:  # no text came: the prompt format is still said
        print(out["prompt_format"]["note"], file=sys.stderr)
    _print_speed(f"{len(out['tokens'])} tokens ({out['stopped']})", out)
    img = out.get("image")
    if img:
        print(f"time to first token = vision encoder {img['encoder_ms']:.1f} ms "
              f"({img['resized'][0]} x {img['resized'][1]} px -> {img['image_tokens']} "
              f"image tokens) + prefill "
              f"{img['prefill_ms']:.1f} ms", file=sys.stderr)
    kvc = out.get("kv_cache")
    if kvc:
        print(f"KV cache: {kvc['dtype']}, {kvc['bytes_measured'] / 1024:.0f} KiB held "
              f"({kvc['bytes_by_formula'] / 1024:.0f} KiB by formula)"
              + (f", window {kvc['window']} tokens (ring buffer)" if kvc["window"] else ""),
              file=sys.stderr)
    if "speculative" in out:
        _print_speculative(out["speculative"])
    return 0


class _Shown:
    """The prompt as the model reads it (through the chat template) and the new text as it
    streams, on stdout; how the prompt went in, one line on stderr once text comes (a
    refusal stays one line)."""

    def __init__(self, prompt: str) -> None:
        self.started = False
        self.fed = prompt  # the prompt as the model reads it (through the chat template)
        self.said = ""  # how it went in

    def on_format(self, fmt, text: str) -> None:
        self.said, self.fed = fmt.line(), text

    def show(self, text: str) -> None:  # the prompt, then the new text as it streams
        if not self.started:
            self.started = True
            if self.said:
                print(self.said, file=sys.stderr, flush=True)
            print(self.fed, end="", flush=True)
        print(text, end="", flush=True)


def _print_speculative(sp: dict) -> None:
    """The speculative decode's figures on stderr: acceptance and time split, the overlap,
    the draft's token table, the performance model's estimate."""
    split = sp["time_split_s"]
    print(f"speculative ({sp['proposer']}, k ≤ {sp['k']}): acceptance "
          f"{sp['acceptance_rate']:.0%}, {sp['tokens_per_target_pass']:.2f} tokens per "
          f"target pass ({sp['target_passes']} passes); time: draft "
          f"{split['draft'] * 1e3:.0f} ms, verify {split['verify'] * 1e3:.0f} ms, host "
          f"{split['host'] * 1e3:.0f} ms", file=sys.stderr)
    if sp.get("overlap"):
        busy, wait = sp["busy_s"], sp["waiting_s"]
        print(f"overlapped: draft busy {busy['draft'] * 1e3:.0f} ms, target busy "
              f"{busy['target'] * 1e3:.0f} ms, both {busy['both'] * 1e3:.0f} ms; the "
              f"target waited {wait['target'] * 1e3:.0f} ms, the draft "
              f"{wait['draft'] * 1e3:.0f} ms; {sp['ahead']['used']} of "
              f"{sp['ahead']['drafted']} tokens drafted ahead were taken", file=sys.stderr)
    table = sp.get("draft_table")
    if table:
        print(table["line"] + (f"; the draft's graphs hold "
                               f"{table['graph_bytes_dropped'] / 1024:.0f} KiB less "
                               "(measured)" if "graph_bytes_dropped" in table else ""),
              file=sys.stderr)
    est = sp.get("estimated")
    if est:
        print(f"estimated on {est['chip']} ({est['scheme']}): {est['speedup']:.2f}x "
              f"({est['plain_tokens_per_s']:.0f} -> {est['speculative_tokens_per_s']:.0f} "
              "tok/s, performance model)", file=sys.stderr)


COMMAND = registered("generate", add_arguments, run)
