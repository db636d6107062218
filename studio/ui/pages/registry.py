"""Every page of the main window, declared once: its key, its title in the navigation, the
tool tip there, the line under its title, and the class that builds it.

The window builds its navigation, its View menu and its shortcuts (Ctrl+1 … Ctrl+9) from
:data:`PAGES`, in this order, and imports a page's module the first time the page is shown
(so start-up imports only what the first page needs). A page class names its ``key``;
:class:`studio.ui.pages.base.Page` reads its title and description from here.

Adding a page: a module under ``studio/ui/pages/`` with a :class:`~studio.ui.pages.base.Page`
subclass, and one :class:`PageSpec` below. This module imports no Qt.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class PageSpec:
    #: how the code names the page (``window.show_page("jobs")``, ``navigate.emit("jobs")``)
    key: str
    #: the name in the navigation and over the page
    title: str
    #: the navigation's tool tip: what is on the page, in a few words
    tip: str
    #: the line under the page's title
    description: str
    #: ``module:Class`` of the page, imported when the page is first shown
    target: str
    #: the model kinds whose projects list the page (empty: every kind); another kind's
    #: project hides it from the navigation
    kinds: tuple[str, ...] = ()

    def load(self) -> type:
        """The page class (imports its module)."""
        module, _, cls = self.target.partition(":")
        return getattr(importlib.import_module(module), cls)


PAGES: tuple[PageSpec, ...] = (
    PageSpec("overview", "Overview", "Model card, targets, recipe, latest results",
             "The model, where it goes, how it is quantized, and its newest figures, each from the "
             "run named on its card.",
             "studio.ui.pages.overview:OverviewPage"),
    PageSpec("model", "Model", "Blocks → modules → ONNX nodes",
             "Every layer, grouped by transformer block, with the ONNX nodes of the latest "
             "export and quantization; the graph drawn (Graph tab).",
             "studio.ui.pages.model:ModelPage"),
    PageSpec("precision", "Precision", "Quantization recipe and per-layer overrides",
             "The quantization recipe and each layer's precision: select cells in the grid "
             "and set them; every edit is undoable.",
             "studio.ui.pages.precision:PrecisionPage"),
    PageSpec("jobs", "Jobs", "Run the pipeline; live jobs and logs",
             "Every stage of every run, live. Jobs run in worker processes: the window stays "
             "responsive.",
             "studio.ui.pages.jobs:JobsPage"),
    PageSpec("queue", "Queue", "Every project's runs and sweeps, lined up",
             "Runs and sweeps of every project wait here for their turn: what runs, what waits "
             "and why, what ended. Reorder, prioritise, cancel, pause.",
             "studio.ui.pages.queue:QueuePage"),
    PageSpec("devices", "Devices",
             "Host CPU, HTP simulator, target chips, remote agents, phones over adb",
             "Where jobs run: this machine's CPU, the QNN HTP simulator for each target chip, "
             "remote agents and phones over adb.",
             "studio.ui.pages.devices:DevicesPage"),
    PageSpec("profiler", "Profiler", "Op-type time of a decode step",
             "Where one decode step spends its time: the seed's op table, by layer, compared.",
             "studio.ui.pages.profiler:ProfilerPage"),
    PageSpec("validation", "Validation", "FP32 vs quantized vs HTP accuracy",
             "FP32 on the CPU vs the quantized model on the host vs the HTP simulator, run by "
             "run: logits, top-1, perplexity, greedy text.",
             "studio.ui.pages.validation:ValidationPage"),
    PageSpec("llm", "LLM", "Generation speed and output",
             "Generation per device, a playground, the optimization waterfall and block "
             "ablation.",
             "studio.ui.pages.llm:LLMPage"),
    PageSpec("deploy", "Deploy", "Genie bundles, DLC files, context binaries",
             "What goes to the device: a Genie bundle per target chip, checked by Qualcomm's "
             "Genie runtime; DLC files; the compiled context binaries.",
             "studio.ui.pages.deploy:DeployPage"),
    PageSpec("placement", "Placement",
             "Encoders and ONNX graphs: NPU / CPU nodes, refusals, the way forward",
             "Where each node of the graph runs on the target's NPU, why the HTP refuses the "
             "ones it refuses, and the way forward: strict, partition or rewrite.",
             "studio.ui.pages.placement:PlacementPage", kinds=("encoder", "onnx-graph")),
    PageSpec("sweeps", "Sweeps", "Recipe sweeps: every point, the Pareto front, apply the best",
             "Variants of the recipe run side by side: every point's accuracy, size and speed "
             "with their sources, the Pareto front, the best point — and apply it.",
             "studio.ui.pages.sweeps:SweepsPage"),
    PageSpec("reports", "Reports", "HTML and JSON reports",
             "Self-contained HTML reports (plots inside) written by the report stage, with "
             "JSON for CI; export any run's report as HTML, Markdown, PDF or JSON.",
             "studio.ui.pages.reports:ReportsPage"),
)
_BY_NAME: dict[str, PageSpec] = {
    **{p.title.lower(): p for p in PAGES},
    **{p.key: p for p in PAGES},
}


def page_spec(name: str) -> PageSpec:
    """The page declared with this key (or title, in any case); KeyError if none is."""
    return _BY_NAME[name.lower()]


def has_page(name: str) -> bool:
    return name.lower() in _BY_NAME
