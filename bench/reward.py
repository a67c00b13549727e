"""Benchmark: the reward side in one command — the code sandbox, then the reward service.

Runs `bench/reward_code.py` (sandbox vs naive subprocess vs bare spawn, and the security corpus)
and `bench/reward_service.py` (math and code through gRPC + Celery vs in-process), each writing
its figures into `bench/results/reward.json`. Usage: `.venv/bin/python bench/reward.py`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    for script in ("reward_code.py", "reward_service.py"):
        done = subprocess.run([sys.executable, str(HERE / script)], check=False)
        if done.returncode != 0:
            return done.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
