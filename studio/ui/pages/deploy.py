"""Deploy: what a user takes to a Snapdragon device — the Genie bundle for a target chip (its
files with sizes and hashes, checked by running Qualcomm's Genie on the HTP simulator against
the studio's runtime), the DLC files of the quantized graphs and the compiled context
binaries; build it, see the check, open or export the folder."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QPushButton,
    QVBoxLayout,
)

from studio.core.artifacts import ArtifactStore
from studio.core.errors import StudioError
from studio.core.fsutil import atomic_copytree
from studio.core.gates import evaluate_gates
from studio.core.jobs import Job
from studio.core.units import format_bytes
from studio.services import history
from studio.ui.pages.base import TargetStagePage
from studio.ui.standalone import run_page
from studio.ui.widgets import fill_table, label, read_only_table

FORMATS = ("Genie bundle", "DLC files", "Context binaries")



class DeployPage(TargetStagePage):
    key = "deploy"

    role = "bundle"

    def __init__(self, ctl, parent=None):
        super().__init__(
            ctl,
            "No bundle yet",
            "Build makes a Genie bundle for each target chip: the quantized AR-N prefill and "
            "AR-1 decode graphs in Genie's form, compiled to context binaries, with "
            "genie_config.json, tokenizer.json, "
            "a manifest and a README — then loads it in Qualcomm's Genie runtime (from the "
            "installed onnxruntime-qnn, on the HTP simulator) and checks that its greedy text "
            "equals the studio's on held-out prompts. DLC files of the graphs come with it "
            "where they hold up to 2 GiB of weights (bundle.dlc).",
            parent,
        )
        self.add_run_action(
            "Build bundle",
            "Runs the bundle stage and what it needs (export, quantize, compile)")
        self.job: Job | None = None
        self.folder: Path | None = None
        cl = self.content_layout
        row = QHBoxLayout()
        row.addWidget(label("Format:"))
        self.format = QComboBox()
        self.format.addItems(FORMATS)
        self.format.currentIndexChanged.connect(self.show_current)
        row.addWidget(self.format)
        self.summary = label("", wrap=True)
        row.addWidget(self.summary, 1)
        self.build_btn = QPushButton("Build again")
        self.build_btn.setToolTip("Run the bundle stage (from the cache when nothing changed)")
        self.build_btn.clicked.connect(self.run_stage)
        self.open_btn = QPushButton("Open folder")
        self.open_btn.clicked.connect(self.open_folder)
        self.export_btn = QPushButton("Export…")
        self.export_btn.setToolTip("Copy the shown files to a folder of your choice")
        self.export_btn.clicked.connect(self.export_dialog)
        for b in (self.build_btn, self.open_btn, self.export_btn):
            row.addWidget(b)
        cl.addLayout(row)
        box = QVBoxLayout()
        box.addWidget(label("Files", "section"))
        self.files = read_only_table(["File", "Size", "SHA-256 / contents"])
        box.addWidget(self.files, 1)
        box.addWidget(label("Checked by Genie on the HTP simulator", "section"))
        self.checks = read_only_table(["Prompt", "Prompt tokens",
                                       "Genie vs studio (the same binaries)", "New tokens",
                                       "Genie time", "Genie's text"])
        # the prompt column stays narrow (the full prompt is in the tooltip), Genie's text
        # takes the rest
        self.checks.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Interactive)
        self.checks.setColumnWidth(0, 240)
        self.checks.setTextElideMode(Qt.TextElideMode.ElideRight)
        box.addWidget(self.checks, 1)
        self.note = label("", "muted", wrap=True)
        box.addWidget(self.note)
        cl.addLayout(box, 1)

    # ---- drawing ----------------------------------------------------------------------------
    def _gates_line(self, res: dict[str, Any]) -> str:
        """The project's gates on the bundle's own binaries (scored like validate)."""
        rows = evaluate_gates(self.ctl.project.gates, res) if self.ctl.project else []
        if not rows:
            return ""
        bad = [r["gate"] for r in rows if not r["passed"]]
        return (f" Accuracy gates on the shipped binaries: {len(rows) - len(bad)} of "
                f"{len(rows)} pass" + (f"; FAILED: {', '.join(bad)}." if bad else "."))

    def show_job(self, job: Job) -> None:
        self.job = job
        res: dict[str, Any] = job.result or {}
        self.job_label.setText(f"run {job.run_id} · job {job.id}"
                               + (" (from the cache)" if job.cached else ""))
        self.badge.set_source(res.get("source", "simulated"))
        self.summary.setText(res.get("summary", ""))
        self.folder = self._artifact_folder(job)
        fmt = self.format.currentText()
        if fmt == "Genie bundle":
            files = res.get("files", {})
            shared = {r["file"] for r in res.get("weight_shared") or []}
            by_part = bool(res.get("by_part"))

            def how(name: str) -> str:  # how a binary of the bundle was checked
                if not name.endswith(".bin"):
                    return ""
                if name in shared:
                    return " · checked by structure only: a device executes it"
                return (" · executed on the HTP simulator" + (", part by part" if by_part
                                                               else ""))

            fill_table(self.files, [[n, format_bytes(f["bytes"]), f["sha256"] + how(n)]
                               for n, f in files.items()]
                  + [["manifest.json", "", "every file's size and hash, versions, the check"],
                     ["README.md", "", "the on-device command line"]])
            ar = res.get("prefill_ar")
            self.note.setText(
                (f"Prompts go through the AR-{ar} prefill graph ({ar} tokens per pass), new "
                 "tokens through the AR-1 decode graph, over a context of "
                 f"{res.get('context_size')} positions. " if ar else
                 "Prompts and new tokens go through the AR-1 decode graph, one token per pass. ")
                + "On the device: genie-t2t-run -c genie_config.json -p \"…\" with the QAIRT "
                "SDK's libraries. Genie's times here are the simulator's: they follow this "
                "host's CPU, not device latency." + self._gates_line(res))
        elif fmt == "DLC files":
            fill_table(self.files, [[d["file"], format_bytes(d["bytes"]),
                                f"{len(d['entries'])} entries: " + ", ".join(d["entries"][:4])]
                               for d in res.get("dlc", {}).values()])
            self.note.setText(
                "DLC files are for Qualcomm's on-device tools (qnn-net-run, Genie with a DLC "
                "config): this host cannot run them back." if res.get("dlc") else
                "No DLC files: " + res.get("dlc_note", "the bundle wrote none") + ".")
        else:
            fill_table(self.files, self._context_rows(job))
            self.note.setText("The compiled QNN context binaries the studio's own runtime, the "
                              "agent and qnn-net-run on a phone use.")
        rows = []
        for c in res.get("checks", []):
            passes = c.get("prompt_passes")
            rows.append([c["prompt"].replace("\n", "⏎"),
                         f"{c['prompt_tokens']}" + (f" ({passes} pass{'es' if passes != 1 else ''})"
                                                    if passes else ""),
                         "identical" if c["identical"] else
                         (f"near tie at new token {c['parted']['token']} (best two logits "
                          f"{c['parted']['gap']:.3g} apart)"
                          if (c.get("parted") or {}).get("near_tie") else
                          f"differs at character {c['first_difference_at_char']}"),
                         str(c["studio_tokens"]), f"{c['genie_wall_s']:.1f} s (simulated)",
                         c["genie_text"].replace("\n", "⏎")])
        tips = [f"{c['prompt']}\n\nthe studio's runtime: {c['studio_text']}"
                for c in res.get("checks", [])]
        for i, c in enumerate(res.get("by_part") or []):  # the simulator could not hold it
            parts = c["parts"]
            cos = [p["handoff_cosine_to_fp32"] for p in parts
                   if p.get("handoff_cosine_to_fp32") is not None]
            last = parts[-1]
            rows.append([f"held-out prompt {i + 1}", str(c["prompt_tokens"]),
                         f"part by part: {len(parts)} parts each loaded alone; hand-offs vs "
                         + (f"FP32 cosine ≥ {min(cos):.4f}; " if cos else "")
                         + f"last part's tokens = FP32's {last['top1_same_as_fp32']}/"
                         f"{last['tokens']}", "", "", ""])
            tips.append("Genie could not load the whole bundle on the simulator: each part's "
                        "binaries ran alone, fed the hand-off the part before recorded")
        fill_table(self.checks, rows, tips)
        for b in (self.open_btn, self.export_btn):
            b.setEnabled(self.folder is not None)

    def _artifact_folder(self, job: Job) -> Path | None:
        if not job.artifact_key or self.ctl.project is None:
            return None
        art = ArtifactStore(self.ctl.project.folder / "artifacts").get(job.artifact_key)
        return art.path if art is not None else None

    def _compile_folder(self, job: Job) -> Path | None:
        """The compiled context of the job's target (the latest compile job's artifact)."""
        comp = [j for j in history.latest_jobs(self.ctl.studio.jobs, "compile")
                if j.target == job.target]
        return self._artifact_folder(comp[0]) if comp else None

    def _context_rows(self, job: Job) -> list[list[str]]:
        folder = self._compile_folder(job)
        if folder is None:
            return []
        return [[f.name, format_bytes(f.stat().st_size), "QNN context (EPContext model)"
                 if f.suffix == ".onnx" else "QNN context binary"]
                for f in sorted(folder.iterdir()) if f.suffix in (".onnx", ".bin")]

    def shown_folder(self) -> Path | None:
        """The folder of what the format picker shows."""
        if self.folder is None or self.job is None:
            return None
        fmt = self.format.currentText()
        if fmt == "Genie bundle":
            return self.folder / "bundle"
        if fmt == "DLC files":  # none where bundle.dlc left them out
            return self.folder / "dlc" if (self.folder / "dlc").is_dir() else None
        return self._compile_folder(self.job)

    # ---- actions ----------------------------------------------------------------------------
    def open_folder(self) -> None:
        folder = self.shown_folder()
        if folder is not None:
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder)))

    def export_dialog(self) -> None:
        dest = QFileDialog.getExistingDirectory(self, "Export to")
        if dest:
            self.export_to(Path(dest))

    def export_to(self, dest: Path):
        """Copy the shown files into ``dest/<format>-<chip>`` (whole or not at all), off the UI
        thread; returns the task."""
        src = self.shown_folder()
        if src is None or self.job is None:
            return None
        name = {"Genie bundle": "genie-bundle", "DLC files": "dlc",
                "Context binaries": "context-binaries"}[self.format.currentText()]
        target = Path(dest) / f"{name}-{self.job.target}"

        async def go() -> None:
            try:
                await self.ctl.in_thread(atomic_copytree, src, target)
            except (OSError, StudioError) as exc:
                self.ctl.message.emit("error", f"export failed: {exc}")
            else:
                self.ctl.message.emit("info", f"exported to {target}")

        return asyncio.ensure_future(go())


def main() -> int:
    return run_page(DeployPage)


if __name__ == "__main__":
    raise SystemExit(main())
