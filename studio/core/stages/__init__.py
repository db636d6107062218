"""One declaration module per stage: its settings class and its :class:`StageDecl`.

``studio/core/stages/<stage>.py`` holds what the rest of the studio knows about a stage: the
typed class of the settings it reads (:class:`studio.core.keys.StageSettings`; each key
declared once, by the stage that owns it, and taken as it is by the others), and ``DECL``,
its declaration (its place in the graph, its memory line, the disk it takes, its help line,
whether its figures make the report's headline). :mod:`studio.core.stagegraph` gathers the
declarations, :mod:`studio.core.settings` assembles the project file's sections from their
keys, and the stage's code (``studio/worker/stages/<module>.py``, which sits above the core)
reads an instance of the class: ``s = QuantizeSettings.of(ctx.config)``, ``s.scheme``.

Adding a setting to a stage is one line in its class here (or, for a key another stage
declares, one line taking that key) and the code that reads it. The graph stages' import
stage is :mod:`graph_import` (``import`` is a keyword).
"""
