"""Sphinx configuration for the sepp-trio documentation (`make docs`; see contributing.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import sepp

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "sepp-trio"
author = "sepp-trio developers"
copyright = "sepp-trio developers, MIT licence"
release = version = sepp.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sepp_docs"]
napoleon_numpy_docstring = False  # sepp.testing uses Google-style sections
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_ext"]
root_doc = "index"

# Pages are MyST markdown; headings get anchors so pages can link to their sections.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# Docstrings write `name` for code, as Markdown does.
default_role = "code"
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": True}

# Every cross-reference to a public sepp name must resolve. Private types that appear in
# signatures (protocols, type variables) are not in the reference, and names from other
# projects are not checked: their inventories would need the network at build time.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(?!sepp\b).*"),
    (r"py:.*", r"sepp(\.\w+)*\._\w+.*"),
]

html_theme = "furo"
html_title = f"sepp-trio {release}"
html_show_sourcelink = False
