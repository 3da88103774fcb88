"""Sphinx configuration of the lessons' site (`make site`, book/build.py stages the sources).

MyST-NB renders each notebook with its stored outputs (CI's nbval executed them; nothing
runs here); the book theme gives the table of contents that build.py writes from
notebooks/tracks.toml."""
project = "The delivery-semantics lab"
author = "the delivery-semantics lab"
extensions = ["myst_nb"]
nb_execution_mode = "off"  # stored outputs, as committed
myst_heading_anchors = 3  # links such as docs/audit.md#reading-the-audit resolve
html_theme = "sphinx_book_theme"
html_title = project
html_theme_options = {"show_toc_level": 2, "use_download_button": True}
html_show_sourcelink = False
exclude_patterns = ["_build"]
html_context = {"default_mode": "light"}  # the theme logs an error when no mode is set
# Widgets are shown as their static pictures: no widget manager fetched from a CDN (the
# pages load offline, and a room's network may block CDNs).
nb_ipywidgets_js = {}
