"""What a Genie bundle says of itself (:mod:`studio.engine.bundle`): what the check of its
binaries found, its ``manifest.json``, its figures and the bundle stage's result and summary."""

from __future__ import annotations

import hashlib
import platform
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError


@dataclass
class TakenBinaries:
    """The compile stage's binaries in the bundle: its folder, the folder the simulator
    executes (the bundle's own unless weight-shared binaries ship), and their rows."""

    out: Path
    run_dir: Path
    rows: list[dict[str, Any]]  # the compile stage's graphs, AR-N first
    shared: list[dict[str, Any]]  # its weight-shared binaries (none: the rows ship)
    run_names: list[str]  # the binaries executed, in Genie's order
    ctx_names: list[str]  # the binaries shipped, in Genie's order
    graph_rows: list[dict[str, Any]]  # the manifest's rows of the graphs
    shared_rows: list[dict[str, Any]]  # and of the weight-shared binaries


@dataclass
class BundleCheck:
    """What the check of a bundle found (:func:`studio.engine.bundle.check_bundle`)."""

    checks: list[dict[str, Any]] = field(default_factory=list)  # per prompt, Genie's text
    by_part: list[dict[str, Any]] = field(default_factory=list)  # per prompt, part by part
    accuracy: dict[str, Any] | None = None  # the shipped binaries against FP32
    draft: dict[str, Any] | None = None  # the draft shipped for the app's CPU
    passes: dict[int, int] = field(default_factory=dict)  # the studio's passes per AR
    load_s: float | None = None  # Genie's load time
    genie_note: str = ""  # why the bundle was checked part by part

    @property
    def identical(self) -> int:
        return sum(c["identical"] for c in self.checks)

    @property
    def ties(self) -> list[dict[str, Any]]:
        return [c for c in self.checks if c["parted"] and c["parted"]["near_tie"]]

    @property
    def tokens(self) -> int:
        return sum(c["studio_tokens"] for c in self.checks)

    @property
    def rate(self) -> float | None:
        if not self.checks:
            return None
        return self.tokens / sum(c["genie_wall_s"] for c in self.checks)


def file_sha256(f: Path) -> str:
    """The SHA-256 of a file, read in blocks of 16 MiB."""
    h = hashlib.sha256()
    with f.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def bundle_manifest(chip, spec: dict[str, Any], recipe: dict[str, Any], source: str,
                    record: dict[str, Any], taken: TakenBinaries, check: BundleCheck,
                    template: dict[str, Any] | None, prompt_format: str,
                    files: dict[str, Any]) -> dict[str, Any]:
    """The bundle's ``manifest.json`` (all but its ``dlc`` entry): the chip, the SDK, the
    recipe, the graphs, every file with its SHA-256 and the check."""
    cl, N = int(record["context_size"]), record.get("prefill_ar") or 1
    shared = taken.shared
    return {
        "format": "genie-bundle", "version": 2, "model": spec.get("model_type"),
        "chip": {"key": chip.key, "name": chip.name, "htp_arch": chip.htp_arch,
                 "soc_model": chip.soc_model},
        "qnn_sdk": record.get("sdk_version", ""),
        "onnxruntime_qnn": version("onnxruntime-qnn"),
        "built_on": platform.platform(),
        "recipe": {k: recipe[k] for k in ("scheme", "weight_granularity")},
        "context_size": cl, "prefill_ar": N if N > 1 else None,
        "binaries": "the compile stage's, copied: the binaries validate, studio generate and "
                    "profile ran",
        "graphs": taken.graph_rows,
        "weight_shared": taken.shared_rows or None,
        "executed_binaries": {r["file"]: file_sha256(taken.run_dir / r["file"])
                              for r in taken.rows} if shared else None,
        "kv_cache": dict(record["kv_cache"]),
        "chat_template": template,
        "draft": check.draft,
        "prompt_format": prompt_format,
        "weights_bytes": int(record["weights_bytes"]),
        "files": files,
        "verification": {"runtime": ("Genie (libGenie.so) on the QNN HTP simulator"
                                     if check.checks else "the studio's runtime, part by "
                                     "part, on the QNN HTP simulator"),
                         "reference": "the studio's runtime over the same binaries",
                         "source": source, "prompts": len(check.checks) or len(check.by_part),
                         "identical": check.identical, "tokens": check.tokens,
                         "genie_note": check.genie_note or None,
                         "by_part": check.by_part or None,
                         "accuracy_on_these_binaries": check.accuracy},
    }


def bundle_figures(check: BundleCheck, parts: int) -> list[tuple[str, Any, str, str, bool]]:
    """The bundle's figures: (name, value, unit, detail, whether it is a timing of the
    device)."""
    checks, by_part, accuracy, draft = check.checks, check.by_part, check.accuracy, check.draft
    identical, tokens, rate = check.identical, check.tokens, check.rate
    timed = "Genie's wall time"
    greedy = (accuracy or {}).get("greedy")
    return [
        *([] if not checks else [
            ("genie_identical_prompts", identical / len(checks), "fraction",
             f"{identical} of {len(checks)} prompts, {tokens} tokens, against the studio's "
             "runtime over the same binaries", False)]),
        *([] if not by_part else [
            ("bundle_part_top1_agreement",
             sum(c["top1_agreement"] for c in by_part) / len(by_part), "fraction",
             f"{len(by_part)} prompts through the {parts} parts one at a time, the last "
             "part's tokens against FP32's", False)]),
        *([] if accuracy is None else [
            (f"bundle_{k}", accuracy[k], unit, f"{accuracy['tokens']} held-out tokens on the "
             "bundle's own binaries (the studio's runtime over them, as Genie runs a prompt) "
             "against FP32", False)
            for k, unit in (("logits_cosine", ""), ("kl_divergence", "nats"),
                            ("top1_agreement", "fraction"), ("perplexity", ""))]),
        *([] if not greedy else [
            ("bundle_greedy_agreement", greedy["agreement"], "fraction",
             f"{greedy['tokens']} tokens the bundle's binaries generated after "
             "run.prompt, each against FP32's choice given that text", False)]),
        *([] if draft is None else [
            ("bundle_draft_identical_prompts",
             draft["check"]["identical"] / max(1, draft["check"]["prompts"]), "fraction",
             f"{draft['check']['prompts']} prompts, the bundle's draft on the CPU and its "
             "binaries verifying, against plain greedy over the same binaries", False)]),
        *([] if draft is None or draft["check"]["tokens_per_target_pass"] is None else [
            ("bundle_draft_tokens_per_pass", draft["check"]["tokens_per_target_pass"],
             "tokens", f"tokens per target pass, k = {draft['check']['k']}", False)]),
        *([] if rate is None else [("genie_tokens_per_s", rate, "tok/s", timed, True),
                                   ("genie_load_s", check.load_s, "s", timed, True)]),
    ]


def raise_on_defect(check: BundleCheck) -> None:
    """Raises where Genie's greedy text differs from the studio's other than at a near tie."""
    ties = check.ties
    bad = [c for c in check.checks if not c["identical"] and c not in ties]
    if bad:
        p = bad[0]["parted"]
        raise StudioError(f"Genie's greedy text differs from the studio's over the same "
                          f"binaries on {len(bad)} of {len(check.checks)} prompts (first at "
                          f"character {bad[0]['first_difference_at_char']} of "
                          f"{bad[0]['prompt']!r}, new token {p['token']}"
                          + (f", where the studio's best two tokens are {p['gap']:.3g} apart"
                             if p["gap"] is not None else "")
                          + "): not a near tie; a defect of the runtime, not of quantization")


def check_line(check: BundleCheck, source: str) -> str:
    """The summary's words on the check: Genie's text against the studio's, or each part's
    tokens against FP32's."""
    checks, by_part, ties = check.checks, check.by_part, check.ties
    genie_note = check.genie_note
    return (
        f"Genie's greedy text equals the studio's over the same binaries on "
        f"{check.identical}/{len(checks)} prompts ({check.tokens} tokens, {source}"
        + (f"; parted at a near tie on {len(ties)}: best two logits "
           + ", ".join(f"{c['parted']['gap']:.3g}" for c in ties) + " apart" if ties else "")
        + ")" if checks else
        f"every part checked alone on {len(by_part)} prompts (the simulator does not hold "
        f"the whole bundle{'; ' + genie_note if genie_note else ''}): the last part's tokens "
        f"equal FP32's on {sum(c['top1_agreement'] for c in by_part) / len(by_part):.1%}")


def bundle_summary(chip, taken: TakenBinaries, check: BundleCheck, files: dict[str, Any],
                   source: str) -> str:
    """The stage's one-line summary of the bundle: its files, the check, the weight-shared
    binaries, the shipped binaries' figures and the draft."""
    ctx_names, shared = taken.ctx_names, taken.shared
    accuracy, draft = check.accuracy, check.draft
    return (f"Genie bundle for {chip.name}: {len(files) + 2} files"
            + (f" ({len(ctx_names)} context binaries)" if len(ctx_names) > 1 else "")
            + ", the compile stage's binaries; " + check_line(check, source)
            + (f"; {len(shared)} weight-shared binar"
               + ("y" if len(shared) == 1 else "ies") + " shipped "
               f"({sum(r['bytes'] for r in shared) / 2**20:.1f} MiB against "
               f"{sum(r['separate_bytes'] for r in shared) / 2**20:.1f} MiB separate), "
               "equal by structure to the executed ones: a device executes them"
               if shared else "")
            + ("" if accuracy is None else
               f"; the shipped binaries against FP32 on {accuracy['tokens']} held-out "
               f"tokens: cosine {accuracy['logits_cosine']:.4f}, top-1 "
               f"{accuracy['top1_agreement']:.1%}, ppl {accuracy['fp32_perplexity']:.2f}"
               f" → {accuracy['perplexity']:.2f}")
            + ("" if draft is None else
               f"; the draft {draft['model']} for the app's CPU: greedy speculative "
               f"decoding with it gave plain greedy's tokens on "
               f"{draft['check']['identical']}/{draft['check']['prompts']} prompts"
               + (f", {draft['check']['tokens_per_target_pass']:.2f} tokens per "
                  "target pass" if draft["check"]["tokens_per_target_pass"] else "")))


def bundle_result(chip, source: str, record: dict[str, Any], taken: TakenBinaries,
                  check: BundleCheck, files: dict[str, Any], dlc: dict[str, Any],
                  manifest: dict[str, Any], figures: list) -> dict[str, Any]:
    """The bundle stage's result."""
    accuracy, draft = check.accuracy, check.draft
    N = record.get("prefill_ar") or 1
    return {
        "summary": bundle_summary(chip, taken, check, files, source),
        "target": chip.key, "source": source, "bundle": "bundle", "files": files,
        "checks": check.checks, "by_part": check.by_part,
        "context_size": int(record["context_size"]), "accuracy": accuracy,
        "qnn_sdk": record.get("sdk_version", ""), "prefill_ar": N if N > 1 else None,
        # the figures the project's gates judge, of the binaries that ship (as validate's are
        # of the compile stage's)
        **({} if accuracy is None else {
            "logits_cosine_mean": accuracy["logits_cosine"],
            "top1_agreement": accuracy["top1_agreement"],
            "perplexity_fp32": accuracy["fp32_perplexity"],
            "perplexity_quantized": accuracy["perplexity"]}),
        "studio_passes": {f"ar{k}": v for k, v in check.passes.items()},
        "ctx_bins": taken.ctx_names, "weight_shared": taken.shared_rows or None,
        "draft": None if draft is None else {k: draft[k] for k in ("model", "files",
                                                                    "token_table", "check")},
        "dlc": {g: {"file": f"dlc/{d['file']}", "bytes": d["bytes"], "entries": d["entries"]}
                for g, d in dlc.items()},
        **({} if dlc else {"dlc_note": manifest["dlc"]["note"]}),
        "figures": figures,
    }
