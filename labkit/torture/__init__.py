"""Torture: any app under kills and faults, judged by the one audit."""
