"""Print pyproject.toml's dependencies (and the named extras') as a requirements file.

The images install the project's dependencies in a layer keyed on pyproject.toml alone, before the
sources are copied, so a source change rebuilds only the project's own install (seconds), not its
dependencies (minutes). Stdlib only: it runs in the image's bare build venv.

    python pyproject-requirements.py pyproject.toml [extra ...] > requirements.txt
"""

from __future__ import annotations

import sys
import tomllib


def requirements(pyproject: str, extras: list[str]) -> list[str]:
    """The build backend's requirements, the dependencies, then each extra's, in file order."""
    with open(pyproject, "rb") as f:
        data = tomllib.load(f)
    reqs = list(data["build-system"]["requires"])
    reqs += data["project"]["dependencies"]
    optional = data["project"].get("optional-dependencies", {})
    for extra in extras:
        reqs += optional[extra]
    return reqs


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1], sys.argv[2:])))
