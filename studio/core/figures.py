"""The catalogue of figures: every number the studio shows is one entry here.

An entry names the figure once — its key (what a stage records it as, or what a page
derives), the title every page, report and command calls it, its unit, what it counts, the
sources it can carry (``measured`` / ``simulated`` / ``estimated`` / ``imported``, see
:mod:`studio.core.metrics`), the one function that computes it (``module:qualname``), and how
it differs from the figure a reader would take it for (its nearest neighbour). Pages, the
report and the CLI write a figure with :func:`title`, :func:`fmt` and :func:`tip`, so one
quantity has one name, one unit and one way of rounding wherever it shows; two quantities
never share a title (a test holds every entry to that, and every figure a full run records to
having an entry).

A recorded figure is one value per (key, device, target): the host CPU's decode speed and the
simulator's are two figures of one entry, told apart by their source badge and where they were
taken (:func:`where`).

This module imports nothing of Qt and nothing of the studio above ``core``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from studio.core.units import format_bytes

SOURCES = ("measured", "simulated", "estimated", "imported")
_HOST = ("measured",)
_DEV = ("measured", "simulated")
_EST = ("estimated",)


@dataclass(frozen=True)
class Figure:
    key: str
    #: what every page, the report and the CLI call it (unique in the catalogue)
    title: str
    #: ``B`` (bytes, written in binary units), ``s``, ``ms``, ``tok/s``, ``1/s``,
    #: ``fraction`` (written as a percentage), ``cycles``, ``nats``, ``ops``, ``layers``, ``""``
    unit: str
    #: what it counts, in one sentence (the first line of its tooltip)
    counts: str
    #: the one function that computes it (``module:qualname``)
    computed_by: str
    #: the sources it can carry
    sources: tuple[str, ...] = _DEV
    #: how it differs from the figure a reader would take it for
    neighbour: str = ""
    #: ``higher`` / ``lower`` is better, or "" (neither)
    better: str = ""
    #: significant digits a plain number is written with
    digits: int = 4

    def tip(self) -> str:
        lines = [f"{self.title}: {self.counts}"]
        if self.neighbour:
            lines.append(f"Not to be confused with {self.neighbour}")
        lines.append(f"Computed by {self.computed_by.rsplit(':', 1)[-1]} "
                     f"({self.computed_by.split(':', 1)[0]}); "
                     f"source: {' or '.join(self.sources)}.")
        return "\n".join(lines)

    def fmt(self, value: float | int | None) -> str:
        return fmt_unit(value, self.unit, self.digits, cosine="cosine" in self.key)


def fmt_unit(value: float | int | None, unit: str, digits: int = 4, cosine: bool = False) -> str:
    """One way of writing a value of ``unit``: bytes in binary units (``5.3 MiB``), a fraction
    as a percentage (``97.7%``), a cosine with the digits where quantization shows
    (``0.999977``), timings and rates at ``digits`` significant digits, never ``-0``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if unit == "B":
        return format_bytes(int(round(value)))
    if unit == "fraction":
        return _no_minus_zero(f"{value:.1%}")
    if cosine:
        text = f"{value:.6f}"
    elif unit == "ppl":  # at the precision a recipe change moves it
        text = f"{value:.3f}" if abs(value) < 100 else f"{value:.2f}"
    elif isinstance(value, int) or (float(value).is_integer() and abs(value) >= 1):
        text = f"{int(value):,}"
    elif abs(value) >= 10 ** digits:
        text = f"{value:,.0f}"
    else:
        text = f"{value:.{digits}g}"
    text = _no_minus_zero(text)
    if unit in ("", "ppl"):
        return text
    return f"{text} {unit}"


def _no_minus_zero(text: str) -> str:
    stripped = text.lstrip("-")
    if text.startswith("-") and not any(c in "123456789" for c in stripped.split("e")[0]):
        return stripped
    return text


def _f(key, title, unit, counts, computed_by, sources=_DEV, neighbour="", better="",
       digits=4) -> Figure:
    return Figure(key, title, unit, counts, computed_by, sources, neighbour, better, digits)


_EXPORT = "studio.worker.stages.export:run"
_VALIDATE = "studio.worker.stages.validate:run"
_RUN = "studio.worker.stages.run:run_result"
_PROFILE = "studio.worker.stages.profile:_compiler_metrics"
_SENS = "studio.worker.stages.sensitivity:run"
_BUNDLE = "studio.engine.bundle:build_bundle"

#: every figure, by key
CATALOGUE: dict[str, Figure] = {f.key: f for f in (
    # ---- how long a stage's own work took (the Jobs page's duration is the whole job)
    _f("export_seconds", "export time", "s", "seconds the export stage spent writing and "
       "checking the ONNX graphs (not loading the worker)", _EXPORT, _HOST,
       "the Jobs page's duration of the export job (the whole job, start-up included)",
       "lower"),
    _f("quantize_seconds", "quantize time", "s", "seconds the quantize stage spent calibrating "
       "and writing the quantized graphs", "studio.worker.stages.quantize:run", _HOST,
       "the Jobs page's duration of the quantize job (the whole job)", "lower"),
    _f("rounding_seconds", "weight rounding time", "s", "seconds of the quantize stage spent "
       "choosing integer weights (SeqMSE / AdaRound / GPTQ)",
       "studio.worker.stages.quantize:run", _HOST, "quantize time (the whole stage)", "lower"),
    _f("compile_seconds", "context compile time", "s", "seconds the HTP compiler spent on the "
       "context binaries (a cached part counts 0)", "studio.worker.stages.compile:run", _HOST,
       "the Jobs page's duration of the compile job (placement checks and loading included)",
       "lower"),
    _f("autoprecision_seconds", "auto-precision time", "s", "seconds the auto-precision "
       "search took", "studio.worker.stages.autoprecision:run", _HOST, "", "lower"),
    _f("sensitivity_seconds", "sensitivity scan time", "s", "seconds the sensitivity scan "
       "took", _SENS, _HOST, "", "lower"),
    _f("layerdiff_seconds", "layer diff time", "s", "seconds the layer diff took",
       "studio.worker.stages.layerdiff:run", _HOST, "", "lower"),
    # ---- the export's own check (FP32 ONNX against the PyTorch model)
    _f("export_max_abs_logit_diff", "export: max logit difference", "", "the largest "
       "absolute difference of any logit between the exported FP32 graph and PyTorch",
       _EXPORT, _HOST, "max abs logit error (quantized against FP32)", "lower"),
    _f("export_top1_agreement", "export: top-1 agreement", "fraction", "positions whose "
       "top-1 token the exported FP32 graph shares with PyTorch", _EXPORT, _HOST,
       "top-1 agreement (quantized against FP32)", "higher"),
    _f("export_positions_checked", "export: positions checked", "positions", "token positions "
       "the export's check compared", _EXPORT, _HOST),
    _f("export_cosine_min", "export: worst output cosine", "", "the worst cosine of the "
       "exported graph's outputs against PyTorch", "studio.worker.stages.import:run", _HOST,
       "worst output cosine vs FP32 (quantized)", "higher"),
    _f("export_encoder_cosine", "export: image encoder cosine", "", "the exported image "
       "encoder's output against PyTorch's", _EXPORT, _HOST, "", "higher"),
    _f("export_image_max_abs_logit_diff", "export: max logit difference with an image", "",
       "the largest logit difference with an image in the prompt, exported against PyTorch",
       _EXPORT, _HOST, "", "lower"),
    _f("export_image_top1_agreement", "export: top-1 agreement with an image", "fraction",
       "top-1 agreement with an image in the prompt, exported against PyTorch", _EXPORT,
       _HOST, "", "higher"),
    # ---- accuracy against FP32 (validate)
    _f("logits_cosine_mean", "logits cosine vs FP32 (mean)", "", "the mean cosine similarity "
       "of each held-out token's logits with FP32's", _VALIDATE, _DEV,
       "logits cosine, host QDQ (the same graphs in ONNX Runtime on the host)", "higher"),
    _f("logits_max_abs_error", "max abs logit error", "", "the largest absolute difference "
       "of any logit from FP32's over the held-out tokens", _VALIDATE, _DEV,
       "export: max logit difference (FP32 ONNX against PyTorch)", "lower"),
    _f("top1_agreement", "top-1 agreement with FP32", "fraction", "held-out positions whose "
       "most likely next token is FP32's", _VALIDATE, _DEV,
       "greedy token agreement (generated text, not held-out text)", "higher"),
    _f("perplexity_quantized", "perplexity, quantized", "ppl", "perplexity of the quantized "
       "model on the project's held-out text", _VALIDATE, _DEV,
       "perplexity, host QDQ (the quantized graphs in ONNX Runtime on the host)", "lower"),
    _f("perplexity_fp32", "perplexity, FP32", "ppl", "perplexity of the FP32 export on the "
       "project's held-out text", _VALIDATE, _HOST, "perplexity, quantized", "lower"),
    _f("perplexity_fp32_heldout", "perplexity, FP32, all held-out tokens", "ppl",
       "perplexity of the FP32 export on every held-out token (a model validated in parts "
       "scores only the first tokens on the device)", _VALIDATE, _HOST,
       "perplexity, FP32 (on the tokens the device scored)", "lower"),
    _f("perplexity_host_qdq", "perplexity, host QDQ", "ppl", "perplexity of the quantized "
       "graphs run by ONNX Runtime on the host (fake-quantized)", _VALIDATE, _HOST,
       "perplexity, quantized (the deployed binaries on the device or simulator)", "lower"),
    _f("logits_cosine_host_qdq", "logits cosine, host QDQ", "", "mean logits cosine with "
       "FP32 of the quantized graphs in ONNX Runtime on the host", _VALIDATE, _HOST,
       "logits cosine vs FP32 (mean) (the deployed binaries)", "higher"),
    _f("top1_agreement_host_qdq", "top-1 agreement, host QDQ", "fraction", "top-1 agreement "
       "with FP32 of the quantized graphs in ONNX Runtime on the host", _VALIDATE, _HOST,
       "top-1 agreement with FP32 (the deployed binaries)", "higher"),
    _f("greedy_agreement", "greedy token agreement", "fraction", "greedy-decoded tokens "
       "that FP32 would also choose given the same text, position by position",
       _VALIDATE, _DEV, "greedy prefix agreement (up to the first divergence)", "higher"),
    _f("greedy_prefix_agreement", "greedy prefix agreement", "fraction", "greedy tokens "
       "identical to FP32's before the first divergence", _VALIDATE, _DEV,
       "greedy token agreement (every position)", "higher"),
    _f("encoder_cosine_min", "image encoder: worst cosine", "", "the worst image's encoder "
       "output cosine with FP32's", _VALIDATE, _DEV, "", "higher"),
    _f("image_answer_top1_agreement", "answer about an image: top-1 agreement", "fraction",
       "top-1 agreement with FP32 over the answer tokens after an image", _VALIDATE, _DEV, "",
       "higher"),
    _f("image_answer_logits_cosine", "answer about an image: logits cosine", "", "logits "
       "cosine with FP32 over the answer tokens after an image", _VALIDATE, _DEV, "", "higher"),
    _f("image_answer_perplexity", "answer about an image: perplexity", "ppl", "perplexity of "
       "the answer tokens after an image, quantized", _VALIDATE, _DEV, "", "lower"),
    _f("image_answer_perplexity_fp32", "answer about an image: perplexity, FP32", "ppl",
       "perplexity of the answer tokens after an image, FP32", _VALIDATE, _HOST, "", "lower"),
    # ---- graph (non-LLM) projects
    _f("output_cosine_min", "worst output cosine vs FP32", "", "the worst sample's output "
       "cosine with FP32's", "studio.worker.stages.graph_validate:run", _DEV,
       "worst output cosine, host QDQ", "higher"),
    _f("output_max_abs_error", "max abs output error", "", "the largest absolute difference "
       "of any output from FP32's", "studio.worker.stages.graph_validate:run", _DEV, "",
       "lower"),
    _f("output_cosine_min_host_qdq", "worst output cosine, host QDQ", "", "the worst output "
       "cosine of the quantized graph in ONNX Runtime on the host",
       "studio.worker.stages.graph_validate:run", _HOST, "worst output cosine vs FP32",
       "higher"),
    _f("embedding_cosine_mean", "embedding cosine vs FP32 (mean)", "", "mean cosine of each "
       "text's embedding with FP32's", "studio.worker.stages.graph_validate:run", _DEV, "",
       "higher"),
    _f("ranking_top1", "retrieval top-1 agreement", "fraction", "queries whose best match is "
       "FP32's", "studio.worker.stages.graph_validate:run", _DEV, "", "higher"),
    _f("ranking_kendall_tau", "ranking Kendall tau", "", "mean rank correlation of each "
       "query's ranking with FP32's", "studio.worker.stages.graph_validate:run", _DEV, "",
       "higher"),
    _f("recall_at_1", "recall@1", "fraction", "queries whose labelled answer ranks first",
       "studio.worker.stages.graph_validate:run", _DEV, "", "higher"),
    _f("rewrite_cosine_min", "graph rewrite: worst cosine", "", "the rewritten graph's worst "
       "output cosine with the original's", "studio.worker.stages.graph_quantize:run", _HOST,
       "", "higher"),
    _f("rewrite_max_abs_error", "graph rewrite: max abs error", "", "the largest difference "
       "of the rewritten graph's outputs from the original's",
       "studio.worker.stages.graph_quantize:run", _HOST, "", "lower"),
    _f("latency_ms", "latency per inference", "ms", "median wall time of one inference",
       "studio.worker.stages.graph_run:run", _DEV, "first inference (includes warm-up)",
       "lower"),
    _f("inferences_per_s", "inferences per second", "1/s", "inferences per second at the "
       "median latency", "studio.worker.stages.graph_run:run", _DEV, "", "higher"),
    _f("first_inference_ms", "first inference", "ms", "wall time of the first inference "
       "(warm-up included)", "studio.worker.stages.graph_run:run", _DEV,
       "latency per inference (the median)", "lower"),
    _f("inference_total", "one inference (profile)", "cycles", "HTP cycles of one inference, "
       "the median of the profile's runs", "studio.worker.stages.graph_profile:run",
       ("simulated", "measured"), "latency per inference (wall time)", "lower"),
    _f("encoder_inference_total", "one image through the encoder (profile)", "cycles",
       "HTP cycles of the vision encoder on one image, the median of the profile's runs",
       "studio.worker.stages.profile:run", ("simulated", "measured"),
       "image encoder time (the run stage's wall time)", "lower"),
    # ---- generation (run)
    _f("prefill_ms", "prefill", "ms", "wall time of the prompt's prefill", _RUN, _DEV,
       "time to first token (prefill and the first step)", "lower"),
    _f("decode_ms_per_token", "decode per token", "ms", "median wall time of one decode "
       "step (every step, the first included)", _RUN, _DEV,
       "first decode step (the warm-up step alone)", "lower"),
    _f("decode_tokens_per_s", "decode speed", "tok/s", "tokens per second at the median decode "
       "step (1 / decode per token)", _RUN, _DEV,
       "the Playground's and the demo's speed of one generation (wall clock of that "
       "generation)", "higher"),
    _f("first_decode_step_ms", "first decode step", "ms", "wall time of the first decode "
       "step (warm-up included)", _RUN, _DEV, "decode per token (the median)", "lower"),
    _f("load_ms", "load time", "ms", "wall time to load the model or binaries before the "
       "first step", _RUN, _DEV, "", "lower"),
    _f("time_to_first_token_ms", "time to first token", "ms", "wall time from the prompt to "
       "the first new token", _RUN, _DEV, "prefill (the prompt's pass alone)", "lower"),
    _f("encoder_ms", "image encoder time", "ms", "wall time of the image encoder", _RUN, _DEV,
       "", "lower"),
    _f("round_trip_prefill_ms", "prefill, adb round trip", "ms", "the prefill's wall time "
       "including adb's push and pull", _RUN, ("measured",), "prefill (on the device alone)",
       "lower"),
    _f("round_trip_decode_ms_per_token", "decode per token, adb round trip", "ms", "one decode "
       "step's wall time including adb's push and pull", _RUN, ("measured",),
       "decode per token (on the device alone)", "lower"),
    _f("round_trip_decode_tokens_per_s", "decode speed, adb round trip", "tok/s", "tokens per "
       "second including adb's push and pull", _RUN, ("measured",),
       "decode speed (on the device alone)", "higher"),
    _f("round_trip_first_decode_step_ms", "first decode step, adb round trip", "ms",
       "the first step's wall time including adb's push and pull", _RUN, ("measured",), "",
       "lower"),
    _f("round_trip_load_ms", "load time, adb round trip", "ms", "loading including adb's "
       "push", _RUN, ("measured",), "", "lower"),
    _f("round_trip_time_to_first_token_ms", "time to first token, adb round trip", "ms",
       "time to the first token including adb's push and pull", _RUN, ("measured",),
       "time to first token (on the device alone)", "lower"),
    _f("round_trip_encoder_ms", "image encoder time, adb round trip", "ms", "the image "
       "encoder's wall time including adb's push and pull", _RUN, ("measured",),
       "image encoder time (on the device alone)", "lower"),
    # ---- the profile: the simulator's cycles and the compiler's own figures
    _f("decode_step_total", "one decode step (profile)", "cycles", "HTP cycles of one decode "
       "step, the median of the profile's runs (the simulator's cycles follow host load)",
       "studio.worker.stages.profile:run", ("simulated", "measured"),
       "decode per token (the run stage's wall time)", "lower"),
    _f("profiled_ops", "ops in the simulator's profile of a decode step", "ops", "the ops "
       "the HTP simulator's profile reports for one decode step (its events: the "
       "compiler's ops merged and some skipped)", "studio.engine.qnn_profile:merge_repeats",
       ("simulated", "measured"), "HTP ops in the compiled decode graph (the compiler's own "
       "count, larger)", ""),
    _f("compiler_dram_bytes_per_step", "DRAM traffic per decode step (compiler)", "B",
       "bytes the compiled decode graph reads and writes in DRAM in one step (the HTP "
       "compiler's optrace)", _PROFILE, _HOST,
       "the roofline's per-layer bytes (one layer, not the step)", "lower"),
    _f("compiler_vtcm_bytes_per_step", "VTCM traffic per decode step (compiler)", "B",
       "bytes the compiled decode graph reads and writes in VTCM in one step", _PROFILE,
       _HOST, "VTCM used at the peak (compiler) (space, not traffic)", "lower"),
    _f("compiler_dma_ops_per_step", "DMA transfers per decode step (compiler)", "ops",
       "ops the compiler made DMA transfers in one decode step", _PROFILE, _HOST, "", "lower"),
    _f("compiler_vtcm_peak_bytes", "VTCM used at the peak (compiler)", "B", "VTCM the "
       "compiler placed tensors in at once (of the chip's VTCM, the catalog's figure)",
       _PROFILE, _HOST, "VTCM traffic per decode step (compiler) (bytes moved)", ""),
    _f("compiler_spill_fill_ops", "spill/fill ops (compiler)", "ops", "ops spilling tensors "
       "out of VTCM or filling them back", _PROFILE, _HOST, "", "lower"),
    _f("compiler_htp_ops", "HTP ops in the compiled decode graph", "ops", "HTP ops after the "
       "compiler's optimization, counted in the decode graph the profile compiled",
       _PROFILE, _HOST, "ops in the simulator's profile of a decode step (its events, which "
       "merge and skip some ops)", ""),
    _f("compiler_binary_bytes", "profiled decode binary size", "B", "the size of the decode "
       "graph the profile compiled for its optrace (one graph, no prefill)", _PROFILE, _HOST,
       "deployable binaries, total (every part's prefill and decode graphs, weight-shared or "
       "not)", "lower"),
    # ---- the bundle (the binaries that ship)
    _f("genie_identical_prompts", "Genie: prompts identical to the studio", "fraction",
       "prompts whose greedy text from Genie on the bundle equals the studio's over the "
       "same binaries", _BUNDLE, _DEV, "", "higher"),
    _f("bundle_part_top1_agreement", "bundle: part-by-part top-1 agreement", "fraction",
       "the last part's tokens against FP32's, the parts run one at a time on recorded "
       "hand-offs", _BUNDLE, _DEV, "", "higher"),
    _f("bundle_logits_cosine", "bundle: logits cosine vs FP32", "", "the shipped binaries' "
       "mean logits cosine with FP32 over held-out tokens", _BUNDLE, _DEV,
       "logits cosine vs FP32 (mean) (validate's, of the same binaries fed otherwise)",
       "higher"),
    _f("bundle_kl_divergence", "bundle: KL divergence from FP32", "nats", "mean KL divergence "
       "of the shipped binaries' next-token distribution from FP32's", _BUNDLE, _DEV, "",
       "lower"),
    _f("bundle_top1_agreement", "bundle: top-1 agreement with FP32", "fraction", "the shipped "
       "binaries' top-1 agreement with FP32 over held-out tokens", _BUNDLE, _DEV, "",
       "higher"),
    _f("bundle_perplexity", "bundle: perplexity", "ppl", "the shipped binaries' perplexity "
       "on held-out tokens", _BUNDLE, _DEV, "perplexity, quantized (validate's)", "lower"),
    _f("bundle_greedy_agreement", "bundle: greedy token agreement", "fraction", "tokens the "
       "shipped binaries generated, each against FP32's choice given that text", _BUNDLE,
       _DEV, "greedy token agreement (validate's)", "higher"),
    _f("bundle_draft_identical_prompts", "bundle: draft's greedy = plain greedy", "fraction",
       "prompts whose greedy speculative tokens — the bundle's draft on the CPU, its binaries "
       "verifying — equal plain greedy decoding's over the same binaries", _BUNDLE, _DEV, "",
       "higher"),
    _f("bundle_draft_tokens_per_pass", "bundle: tokens per target pass with the draft",
       "tokens", "tokens the bundle's binaries emit per verify pass with the bundle's draft "
       "proposing (greedy)", _BUNDLE, _DEV, "", "higher"),
    _f("genie_tokens_per_s", "Genie's decode speed", "tok/s", "Genie's own tokens per second "
       "on the bundle (its wall clock)", _BUNDLE, _DEV, "decode speed (the run stage's)",
       "higher"),
    _f("genie_load_s", "Genie's load time", "s", "Genie's wall time to load the bundle",
       _BUNDLE, _DEV, "load time (the run stage's)", "lower"),
    # ---- sensitivity, ablation, auto-precision, layer diff, waterfall
    _f("sensitivity_perplexity_fp32", "sensitivity: perplexity, FP32", "ppl", "FP32 "
       "perplexity on the scan's held-out windows", _SENS, _HOST,
       "perplexity, FP32 (validate's held-out text)", "lower"),
    _f("perplexity_base", "sensitivity: perplexity of the base recipe", "ppl", "the scan's "
       "base recipe's perplexity on its windows", _SENS, _HOST, "perplexity, quantized",
       "lower"),
    _f("logits_cosine_base", "sensitivity: logits cosine of the base recipe", "", "the base "
       "recipe's logits cosine with FP32 on the scan's windows", _SENS, _HOST, "", "higher"),
    _f("kl_divergence_base", "sensitivity: KL of the base recipe", "nats", "the base recipe's "
       "KL divergence from FP32", _SENS, _HOST, "", "lower"),
    _f("kl_divergence_base_htp", "sensitivity: KL of the base recipe on the simulator",
       "nats", "the base recipe's KL divergence from FP32, on the HTP simulator", _SENS,
       ("simulated",), "", "lower"),
    _f("top_raise_kl_change", "sensitivity: best raise, KL change", "nats", "the KL change "
       "of raising the most sensitive layer", _SENS, _HOST, "", "lower"),
    _f("top_raise_kl_change_htp", "sensitivity: best raise on the simulator, KL change",
       "nats", "the KL change of raising the most sensitive layer, on the HTP simulator",
       _SENS, ("simulated",), "", "lower"),
    _f("top_raise_perplexity_change", "sensitivity: best raise, perplexity change", "ppl",
       "the perplexity change of raising the most sensitive layer", _SENS, _HOST, "",
       "lower"),
    _f("top_point_raise_kl_change", "sensitivity: best activation raise, KL change", "nats",
       "the KL change of raising the most sensitive key activation", _SENS, _HOST, "",
       "lower"),
    _f("top_lower_perplexity_change", "sensitivity: cheapest lowering, perplexity change",
       "ppl", "the perplexity change of lowering the least sensitive layer", _SENS, _HOST,
       "", ""),
    _f("pruned_perplexity", "perplexity after pruning", "ppl", "perplexity with the ablated "
       "blocks removed", "studio.worker.stages.ablation:run", _HOST, "", "lower"),
    _f("layers_raised", "layers raised", "layers", "layers the auto-precision search raised",
       "studio.worker.stages.autoprecision:run", _HOST, "", ""),
    _f("weight_bytes_before", "auto-precision: weight bytes before", "B", "weight bytes of "
       "the weighted layers before the search", "studio.worker.stages.autoprecision:run",
       _HOST, "", ""),
    _f("weight_bytes_after", "auto-precision: weight bytes after", "B", "weight bytes of the "
       "weighted layers after the search", "studio.worker.stages.autoprecision:run", _HOST,
       "", "lower"),
    _f("layerdiff_kl_htp", "layer diff: KL on the simulator", "nats", "the final logits' KL "
       "from FP32 in the layer diff's run", "studio.worker.stages.layerdiff:run", _DEV, "",
       "lower"),
    _f("layerdiff_top1_htp", "layer diff: top-1 on the simulator", "fraction", "top-1 "
       "agreement in the layer diff's run", "studio.worker.stages.layerdiff:run", _DEV, "",
       "higher"),
    _f("layerdiff_boundary_rel_error_max_htp", "layer diff: worst block error", "",
       "the largest relative error at a block boundary, simulator against FP32",
       "studio.worker.stages.layerdiff:run", _DEV, "", "lower"),
    _f("layerdiff_boundary_rel_error_max_htp_vs_host_qdq",
       "layer diff: worst block error vs host QDQ", "", "the largest relative error at a "
       "block boundary, simulator against the host's QDQ run",
       "studio.worker.stages.layerdiff:run", _DEV, "", "lower"),
    _f("layerdiff_extra_outputs_logits_change_htp", "layer diff: logits change from probes",
       "", "how much the extra probe outputs changed the final logits",
       "studio.worker.stages.layerdiff:run", _DEV, "", "lower"),
    _f("waterfall_final_tokens_per_s", "waterfall: final decode speed", "tok/s", "the "
       "waterfall's last step's tokens per second", "studio.worker.stages.waterfall:run",
       _HOST, "decode speed (the run stage's)", "higher"),
    # ---- figures the pages derive (not recorded by a stage)
    _f("kv_cache_device_bytes", "KV cache on the device", "B", "K and V of every block at "
       "the project's context length, in the deployed graphs' cache precision (uint16 with "
       "quantized graph I/O, uint8 with an INT8 cache, float32 with float I/O)",
       "studio.core.modelinfo:ModelInfo.kv_cache_bytes", _EST,
       "KV cache of the host runtime (float32 arrays in ONNX Runtime)", "lower"),
    _f("kv_cache_host_bytes", "KV cache of the host runtime", "B", "the KV cache the host's "
       "ONNX Runtime generator holds (float32, or uint8 with an INT8 cache)",
       "studio.services.generate:generate", ("measured",),
       "KV cache on the device (the deployed precision)", "lower"),
    _f("checkpoint_weight_bytes", "checkpoint weights at a precision", "B", "every "
       "parameter once (a tied embedding once) × the bytes of one precision: FP32, FP16, "
       "INT8 or INT4 for the whole model", "studio.core.modelinfo:ModelInfo.weight_bytes", _EST,
       "MatMul weight bytes (the recipe's projections alone) and graph weights (the "
       "quantized graph's initializers as stored)", "lower"),
    _f("matmul_weight_bytes", "MatMul weight bytes", "B", "the weights the recipe quantizes "
       "(the projections; no embeddings, norms or biases), each at its layer's precision",
       "studio.services.precision:scheme_diff", _EST, "checkpoint weights at a precision (the "
       "whole model at one precision)", "lower"),
    _f("graph_weight_bytes", "graph weights as stored", "B", "one graph's initializers at "
       "their stored dtypes (a quantized graph's integer weights with their scales and zero "
       "points, the FP32 export's floats; a tied embedding stored as the embedding and the "
       "head), for the graph the Memory tab shows", "studio.engine.memplan:graph_memory",
       _EST, "checkpoint weights at a precision (every parameter once) and MatMul weight bytes "
       "(the projections alone, no scales)", "lower"),
    _f("kv_cache_graph_io_bytes", "KV cache, graph I/O", "B", "one graph's cache tensors at "
       "its inputs and outputs (past_* in, present_* out) as the host runs it: float32 in "
       "the exported and QDQ graphs (a prefill graph takes none in)", "studio.engine.memplan:graph_memory", _EST, "KV cache on the device "
       "(the deployed binaries' cache precision)", "lower"),
    _f("deployable_binary_bytes", "deployable binaries, total", "B", "the context binaries "
       "the compile stage made for the device, every part's prefill and decode graphs (file "
       "sizes)", "studio.engine.deploy:read", ("measured",),
       "profiled decode binary size (one graph compiled for the profile)", "lower"),
    _f("vtcm_bytes", "VTCM of the chip", "B", "the chip's vector TCM (the catalog's figure)",
       "studio.core.catalog:Chip", ("imported",),
       "VTCM used at the peak (compiler)", ""),
)}


def get(key: str) -> Figure | None:
    return CATALOGUE.get(key)


def title(key: str) -> str:
    f = CATALOGUE.get(key)
    return f.title if f else key.replace("_", " ")


def tip(key: str) -> str:
    f = CATALOGUE.get(key)
    return f.tip() if f else key


def fmt(key: str, value: float | int | None, unit: str | None = None) -> str:
    """``value`` written as the catalogue writes ``key`` (its unit, its digits); a key not in
    the catalogue is written in ``unit``."""
    f = CATALOGUE.get(key)
    if f is None:
        return fmt_unit(value, unit or "", cosine="cosine" in key)
    return f.fmt(value)


def by_title(text: str) -> Figure | None:
    for f in CATALOGUE.values():
        if f.title == text:
            return f
    return None


# ---- the derived figures' one function each ----------------------------------------------
def kv_cache_dtype(graph_io: str, kv_cache: str) -> tuple[str, int]:
    """The deployed graphs' cache element: ``("uint16", 2)`` with quantized graph I/O,
    ``("uint8", 1)`` with an INT8 cache, ``("float32", 4)`` with float I/O."""
    if kv_cache == "int8":
        return "uint8", 1
    if graph_io == "quantized":
        return "uint16", 2
    return "float32", 4


def where(device: str, target: str = "") -> str:
    """Where a recorded figure was taken, as pages write it: ``host CPU``, ``HTP simulator ·
    snapdragon-8-gen-3``, ``agent lab1 · snapdragon-8-gen-3``."""
    kind = device.split(":", 1)[0]
    name = {"host-cpu": "host CPU", "htp-sim": "HTP simulator",
            "htp-compiler": "HTP compiler"}.get(kind, device)
    return name + (f" · {target}" if target and target not in name else "")
