"""The import contracts of `.importlinter` hold, and they can fail.

The contracts (a layer order over `cascade`'s packages, no cycle between siblings at any depth,
the core never importing a service, the services independent of each other) are checked here on
the real import graph; then an upward import and a cycle are added to a copy of the graph, to show
that each contract notices them. `make lint` runs `lint-imports` for the readable report.
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path

import grimp
import pytest
from importlinter.application.use_cases import read_user_options
from importlinter.configuration import configure
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.independence import IndependenceContract
from importlinter.contracts.layers import LayersContract
from importlinter.domain.contract import Contract

ROOT = Path(__file__).resolve().parents[2]
TYPES: dict[str, type[Contract]] = {
    "layers": LayersContract,
    "acyclic_siblings": AcyclicSiblingsContract,
    "forbidden": ForbiddenContract,
    "independence": IndependenceContract,
}


@cache
def _options() -> tuple[dict[str, object], list[dict[str, object]]]:
    configure()  # import-linter's own settings (its option readers), as `lint-imports` sets them
    options = read_user_options(str(ROOT / ".importlinter"))
    return dict(options.session_options), [dict(c) for c in options.contracts_options]


def _contract(kind: str) -> Contract:
    session, contracts = _options()
    (raw,) = [c for c in contracts if c["type"] == kind]
    fields = {k: v for k, v in raw.items() if k not in ("type", "name", "id")}
    return TYPES[kind](name=str(raw["name"]), session_options=session, contract_options=fields)


@cache
def _graph() -> grimp.ImportGraph:
    session, _ = _options()
    roots = session["root_packages"]
    assert isinstance(roots, list)
    return grimp.build_graph(*roots, include_external_packages=False, cache_dir=None)


def _check(contract: Contract, graph: grimp.ImportGraph) -> bool:
    return contract.check(graph, verbose=False).kept


@pytest.mark.parametrize("kind", sorted(TYPES))
def test_the_package_keeps_each_contract(kind: str) -> None:
    contract = _contract(kind)
    check = contract.check(_graph(), verbose=False)
    assert check.kept, f"{contract.name}: broken ({check.metadata}); run `lint-imports` for the chains"


def test_every_top_level_package_has_a_layer() -> None:
    """The layers contract is exhaustive: a new package must be placed in the order."""
    _, contracts = _options()
    (layers,) = [c for c in contracts if c["type"] == "layers"]
    assert str(layers["exhaustive"]).lower() == "true"


def test_an_upward_import_breaks_the_layers() -> None:
    graph = copy.deepcopy(_graph())
    graph.add_import(importer="cascade.algo.grpo", imported="cascade.runner.loop")
    assert not _check(_contract("layers"), graph)


def test_a_cycle_between_siblings_breaks_the_acyclic_contract() -> None:
    graph = copy.deepcopy(_graph())
    graph.add_import(importer="cascade.engine.hf", imported="cascade.engine.hf_engine")
    assert not _check(_contract("acyclic_siblings"), graph)


def test_the_core_importing_a_service_breaks_the_forbidden_contract() -> None:
    graph = copy.deepcopy(_graph())
    graph.add_import(importer="cascade.config", imported="services.api.main")
    assert not _check(_contract("forbidden"), graph)
