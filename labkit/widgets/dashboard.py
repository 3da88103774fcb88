"""``Dashboard``: the views of one topic, live while an experiment runs, a static picture after.

    dash = Dashboard(bootstrap, topic, audit=my_audit, position=lambda: consumer_pos)
    result = dash.run(experiment)      # live updates while `experiment` runs in a thread

Creating a dashboard with the same ``key`` (default: topic and views), e.g. by re-running
the cell, stops the previous one. When the experiment ends the live widget is replaced by
the static picture, so the saved notebook shows the same thing.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from html import escape
from pathlib import Path

from labkit.kafka.inspect.client import InspectError
from labkit.kafka.inspect.states import IdOf, key_id
from labkit.widgets.html import VIEWS
from labkit.widgets.live import MODES, Loop, LoopStats, live_frontend
from labkit.widgets.model import Snapshot
from labkit.widgets.source import Source
from labkit.widgets.static import StaticPicture, figure, png_bytes

ALL_VIEWS = ("counters", "offsets", "log", "producers")
TITLES = {"counters": "counters", "offsets": "offsets dashboard", "log": "log strip",
          "producers": "producer-state table"}
_active: dict[Hashable, "Dashboard"] = {}
_active_lock = threading.Lock()


class Dashboard:
    def __init__(self, bootstrap: str, topic: str, *,
                 views: Iterable[str] = ALL_VIEWS,
                 audit: Callable[[], object] | None = None,
                 position: Callable[[], int | Mapping[int, int] | None] | None = None,
                 id_of: IdOf | None = key_id,
                 groups: Iterable[str] | None = None,
                 window: int = 120,
                 interval_s: float = 0.25,
                 mode: str | None = None,
                 key: Hashable | None = None):
        self.views = tuple(views)
        unknown = [v for v in self.views if v not in VIEWS]
        if unknown or not self.views:
            raise ValueError(f"unknown view(s) {unknown}: choose from {list(ALL_VIEWS)}")
        if mode is not None and mode not in MODES:
            raise ValueError(f"mode={mode!r}: use 'live', 'static' or None (guess)")
        self.live = live_frontend() if mode is None else mode == "live"
        self.interval_s = interval_s
        self.key = key if key is not None else (topic, self.views)
        with _active_lock:
            previous = _active.get(self.key)
        if previous is not None:
            previous.stop()
        self.source = Source(bootstrap, topic, audit=audit, position=position, id_of=id_of,
                             groups=groups, window=window)
        with _active_lock:
            _active[self.key] = self
        self.snapshot: Snapshot | None = None
        self.error: Exception | None = None
        self._loop: Loop | None = None
        self._handle = None
        self._closed = False
        self._widget = None
        self._parts: dict = {}
        self._collecting = threading.Lock()  # one Inspector: one request at a time
        self._done = threading.Event()  # set once the final picture is up

    # ------------------------------------------------------------ the live widget

    @property
    def widget(self):
        """The ipywidgets VBox (built on first use: static mode never needs it)."""
        if self._widget is None:
            import ipywidgets as w

            self._parts = {v: w.HTML() for v in self.views}
            self._parts["status"] = w.HTML()
            self._widget = w.VBox(list(self._parts.values()),
                                  layout=w.Layout(padding="6px", border="1px solid #e3e3e3"))
            self._widget.add_class("lk-dashboard")
            if self.snapshot is not None:
                self._render(self.snapshot)
        return self._widget

    def _render(self, snap: Snapshot) -> None:
        if self._widget is None:
            return
        for view in self.views:
            html = VIEWS[view](snap)
            if self._parts[view].value != html:  # unchanged views cost no comm traffic
                self._parts[view].value = html
        status = "" if self.error is None else (
            f'<span style="color:#c0392b">inspector: {escape(str(self.error))} (retrying)</span>')
        if self._parts["status"].value != status:
            self._parts["status"].value = status

    def _on_error(self, exc: Exception) -> None:
        self.error = exc
        if self.snapshot is not None:
            self._render(self.snapshot)

    # ------------------------------------------------------------ refresh, start, stop

    def refresh(self, finished: bool = False) -> Snapshot:
        """Collect one snapshot now and show it."""
        with self._collecting:
            snap = self.source.collect(finished=finished)
        self.snapshot, self.error = snap, None
        self._render(snap)
        return snap

    def _refresh_patiently(self, finished: bool = False, tries: int = 5) -> Snapshot:
        """A refresh that asks again when the broker says "retry" (a partition's leader
        elected a moment ago): a picture never fails the experiment it watches."""
        attempt = 0
        while True:
            try:
                return self.refresh(finished=finished)
            except InspectError as exc:
                attempt += 1
                if not exc.retriable or attempt >= tries:
                    raise
                time.sleep(0.2 * attempt)

    @property
    def stats(self) -> LoopStats:
        return self._loop.stats if self._loop is not None else LoopStats()

    def start(self, until: Callable[[], bool] | None = None) -> "Dashboard":
        """Show the live widget and refresh it in the background (static mode: nothing to
        show until the end). With ``until``, finish on its own once ``until()`` is true."""
        if self._closed:
            raise RuntimeError("this dashboard was stopped; create a new one")
        if self._loop is not None:
            return self
        try:
            self._refresh_patiently()
        except InspectError as exc:  # shown as "retrying"; the loop or the final snapshot asks again
            self._on_error(exc)
        if self.live:
            from IPython.display import display

            self._handle = display(self.widget, display_id=True)
        self._loop = Loop(self.refresh, self.interval_s, self._on_error, until=until,
                          on_end=self._finish if until is not None else None)
        if self.live or until is not None:
            self._loop.start()
        return self

    def watch(self, experiment: threading.Thread) -> "Dashboard":
        """Live until ``experiment`` (a started thread) ends, then the static picture;
        returns at once, so the notebook stays usable meanwhile."""
        return self.start(until=lambda: not experiment.is_alive())

    def run(self, experiment: Callable, *args, **kwargs):
        """Run ``experiment(*args, **kwargs)`` in a background thread with the dashboard
        live; return its result (or raise its exception) once it and the dashboard end."""
        outcome: dict = {}

        def target() -> None:
            try:
                outcome["result"] = experiment(*args, **kwargs)
            except BaseException as exc:  # re-raised in the caller's thread below
                outcome["error"] = exc

        thread = threading.Thread(target=target, name="labkit-experiment", daemon=True)
        self.start()
        thread.start()
        try:
            thread.join()
        finally:
            self.stop()
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("result")

    def stop(self) -> None:
        """Stop refreshing, take a final snapshot and show the static picture. Idempotent."""
        if self._loop is not None:
            self._loop.stop()
        self._finish()

    def _finish(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._refresh_patiently(finished=True)
        except Exception as exc:  # the broker may be gone at the end of a fault lesson
            self.error = exc
        finally:
            self.source.close()
            with _active_lock:
                if _active.get(self.key) is self:
                    del _active[self.key]
        try:
            if self.snapshot is not None:
                self._show_final()
        finally:
            self._done.set()

    def _show_final(self) -> None:
        from IPython.display import display

        picture = self.static()
        if self._handle is not None:
            self._handle.update(picture)
        elif self._loop is not None:
            display(picture)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the dashboard has finished (e.g. after ``watch``); False on timeout."""
        return self._done.wait(timeout_s)

    def __enter__(self) -> "Dashboard":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------ static picture

    def static(self) -> StaticPicture:
        """The current state as a PNG picture (taking a snapshot first if there is none)."""
        snap = self.snapshot if self.snapshot is not None else self.refresh()
        # No topic name in the text form: lessons may use fresh names; nbval compares text.
        title = ", ".join(TITLES[v] for v in self.views)
        return StaticPicture(png_bytes(figure(snap, self.views)), title)

    def to_png(self, path: str | Path) -> Path:
        return self.static().save(path)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget if self.live and not self._closed else self.static())


def offsets_dashboard(bootstrap: str, topic: str, **kwargs) -> Dashboard:
    """Per partition: log start, LSO, high watermark, group offsets, live consumer position."""
    return Dashboard(bootstrap, topic, views=("offsets",), **kwargs)


def log_strip(bootstrap: str, topic: str, **kwargs) -> Dashboard:
    """One cell per offset: committed / open / aborted data, COMMIT / ABORT markers, duplicates."""
    return Dashboard(bootstrap, topic, views=("log",), **kwargs)


def counters(bootstrap: str, topic: str, audit: Callable[[], object], **kwargs) -> Dashboard:
    """produced / delivered / duplicated / lost, from the caller's audit function."""
    return Dashboard(bootstrap, topic, views=("counters",), audit=audit, **kwargs)


def producer_table(bootstrap: str, topic: str, **kwargs) -> Dashboard:
    """Producer id, epoch, last sequence and open transaction, per partition."""
    return Dashboard(bootstrap, topic, views=("producers",), **kwargs)
