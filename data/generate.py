"""Regenerate data/payments.csv and data/clicks.csv (fixed seeds: the files never change).

    python data/generate.py
"""
from __future__ import annotations

from pathlib import Path

from labkit.pipelines.data import generate, generate_clicks, write_csv

HERE = Path(__file__).resolve().parent
SEED = 2026


def main() -> None:
    write_csv(HERE / "payments.csv", generate(300, seed=SEED, prefix="pay"))
    write_csv(HERE / "clicks.csv", generate_clicks(400, seed=SEED))


if __name__ == "__main__":
    main()
