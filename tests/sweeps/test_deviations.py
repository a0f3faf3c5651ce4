"""The paper claims fedbench does not reproduce, declared once (`sweeps/deviations.py`): each declaration names the
paper-size test that measures it, that test checks it (`helpers.deviation_holds`), and its paper's gallery page
lists it (`<!-- deviations: PAPER -->`, written by docs/hooks/reference.py). A measured value that moves fails the
test with "no longer holds as declared", not an assertion that pinned the old value."""
from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest

from helpers import deviation_holds
from sweeps.deviations import DEVIATIONS

ROOT = Path(__file__).resolve().parents[2]


def test_every_declaration_is_complete():
    for key, deviation in DEVIATIONS.items():
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)+", key) and key.startswith(deviation.paper + "-"), key
        assert deviation.measured and all(math.isfinite(value) for value in deviation.measured.values()), key
        assert deviation.tolerance > 0, key
        assert all(text.strip() for text in (deviation.figure, deviation.claim, deviation.reports, deviation.why)), key


def slow(module: ast.Module, function: ast.FunctionDef) -> bool:
    marks = [ast.unparse(node.value) for node in module.body if isinstance(node, ast.Assign)
             and any(isinstance(target, ast.Name) and target.id == "pytestmark" for target in node.targets)]
    marks += [ast.unparse(decorator) for decorator in function.decorator_list]
    return any("pytest.mark.slow" in mark for mark in marks)


@pytest.mark.parametrize("key", sorted(DEVIATIONS))
def test_the_slow_test_a_deviation_names_checks_it(key):
    module, _, name = DEVIATIONS[key].test.partition("::")
    tree = ast.parse((ROOT / module).read_text())
    function = next((node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name), None)
    assert function is not None, f"{key}: no test {DEVIATIONS[key].test}"
    assert slow(tree, function), f"{key}: {DEVIATIONS[key].test} is not a slow (paper-size) test"
    checked = {call.args[0].value for call in ast.walk(function) if isinstance(call, ast.Call)
               and isinstance(call.func, ast.Name) and call.func.id == "deviation_holds"
               and call.args and isinstance(call.args[0], ast.Constant)}
    assert key in checked, f"{DEVIATIONS[key].test} does not check the deviation {key!r} (deviation_holds)"


def test_every_deviation_a_test_checks_is_declared_for_that_test():
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        for key in re.findall(r"deviation_holds\(\s*\"([^\"]+)\"", path.read_text()):
            assert key in DEVIATIONS, f"{path.name} checks an undeclared deviation {key!r}"
            assert DEVIATIONS[key].test.startswith(f"tests/{path.name}::"), (key, DEVIATIONS[key].test)


def test_each_paper_with_deviations_lists_them_on_its_gallery_page():
    listed = {}
    for page in sorted((ROOT / "docs" / "gallery").glob("*.md")):
        for paper in re.findall(r"<!-- deviations: (\S+) -->", page.read_text()):
            listed[paper] = page.stem
    assert listed == {deviation.paper: deviation.paper for deviation in DEVIATIONS.values()}


def test_a_value_that_moves_fails_saying_the_deviation_no_longer_holds(monkeypatch):
    key = "pfedfbe-lasso2-personal-support"
    declared = DEVIATIONS[key]
    monkeypatch.setenv("PYTEST_CURRENT_TEST", f"{declared.test} (call)")
    deviation_holds(key, dict(declared.measured))  # as declared
    deviation_holds(key, {name: value + 0.9 * declared.tolerance for name, value in declared.measured.items()})
    reproduced = {"pFedFBE's personal precision": 1.0, "pFedFBE's personal recall": 1.0}  # the paper's P = R = 1
    with pytest.raises(pytest.fail.Exception, match=f"deviation '{key}' no longer holds as declared .*recall "
                                                    "measured 1, declared 0.802 ± 0.05"):
        deviation_holds(key, reproduced)
    with pytest.raises(AssertionError, match="declares no value"):
        deviation_holds(key, {"pFedFBE's personal F1": 0.79})
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/papers/test_paper_pfedfbe.py::test_lasso_setting_one_global_parameters "
                                              "(call)")
    with pytest.raises(AssertionError, match="is declared as measured by"):
        deviation_holds(key, dict(declared.measured))
