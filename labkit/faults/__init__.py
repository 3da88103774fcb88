"""Faults, made on purpose: named crash points in client code, and a network fault proxy."""
