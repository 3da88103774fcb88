"""Dashboards that update live while an experiment runs, and the same picture static.

    from labkit import widgets
    dash = widgets.Dashboard(bootstrap, topic, audit=audit, position=position)
    dash.run(experiment)          # live in JupyterLab; a PNG in executed notebooks

Views: "counters", "offsets", "log", "producers" (or one each with offsets_dashboard,
log_strip, counters, producer_table). ``dash.static()`` / ``dash.to_png(path)`` render the
current state; ``figure(snapshot, views)`` draws any Snapshot with matplotlib.
``ReplicaBoard`` shows a partition's leader, ISR and broker processes while a failure
experiment (``labkit.experiments.failover``) kills and freezes brokers.
"""
from labkit.widgets.dashboard import (ALL_VIEWS, Dashboard, counters, log_strip,
                                      offsets_dashboard, producer_table)
from labkit.widgets.live import LoopStats, live_frontend
from labkit.widgets.replicas import ReplicaBoard
from labkit.widgets.model import STATE_STYLE, Counts, ProducerRow, Snapshot, Track
from labkit.widgets.source import Source
from labkit.widgets.static import StaticPicture, figure

__all__ = ["ALL_VIEWS", "Dashboard", "counters", "log_strip", "offsets_dashboard",
           "producer_table", "ReplicaBoard", "LoopStats", "live_frontend", "STATE_STYLE", "Counts",
           "ProducerRow", "Snapshot", "Track", "Source", "StaticPicture", "figure"]
