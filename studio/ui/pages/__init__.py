"""The pages of the main window; each one opens alone: python -m studio.ui.pages.<name>."""
