# The demo notebook here is driven by tests/test_browser.py in a real browser; it is not a
# lesson, so nbval (`pytest --nbval`) must not collect it.
collect_ignore_glob = ["*.ipynb"]
