"""kvlab.labs: what a check() cell shows, the switch that shows or hides solutions, and the one shape
(run, check, solution) every lab step and exercise of the notebooks has."""

from pathlib import Path

import jupytext
import pytest

from kvlab import labs
from kvlab.labs import CheckLine, CheckResult, ExerciseError, Solution, compare, set_solutions, solutions_enabled
from kvlab.labs.check import _fmt

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


@pytest.fixture(autouse=True)
def _no_override(monkeypatch):
    """Each test starts from the environment variable alone (no set_solutions override left over)."""
    monkeypatch.delenv("KVLAB_SOLUTIONS", raising=False)
    set_solutions(None)
    yield
    set_solutions(None)


def test_compare_is_exact_and_keeps_both_values():
    line = compare("tokens", 1_890, 331_315, hint="collect first")
    assert (line.ok, line.given, line.expected, line.hint) == (False, 1_890, 331_315, "collect first")
    assert compare("tokens", 7, 7).ok
    assert not compare("bytes", 7, 8).ok


def test_line_text_shows_the_given_value_or_the_difference_and_hint():
    assert compare("pool", 331_315, 331_315).text() == "✔ pool: 331,315"
    wrong = compare("pool", 1_890, 331_315, hint="gc first").text()
    assert wrong == "✘ pool: you gave 1,890, the model says 331,315 — gc first"
    assert compare("f", 0.123456, 0.5).text().startswith("✘ f: you gave 0.1235, the model says 0.5")
    assert compare("ok?", False, True).text() == "✘ ok?: you gave False, the model says True"  # bool, not 0/1
    assert CheckLine("peak", False, None, None, "predict it").text() == "✘ peak: no answer yet — predict it"
    assert "'abc'" in compare("name", "abc", "abd").text()


def test_result_passes_only_when_every_line_is_ok():
    good, bad = compare("a", 1, 1), compare("b", 1, 2, hint="h")
    assert CheckResult("t", (good,)).ok
    mixed = CheckResult("t", (good, bad), note="a note")
    assert not mixed.ok and mixed.wrong == (bad,)
    assert not CheckResult("nothing checked").ok  # no lines is not a pass
    text = mixed.text()
    assert text.splitlines()[0] == "NOT YET · t"
    assert "  ✘ b: you gave 1, the model says 2 — h" in text.splitlines() and text.endswith("  a note")
    assert str(mixed) == repr(mixed) == text
    assert CheckResult("t", (good,)).text().startswith("PASS · t")


def test_html_has_the_css_classes_the_browser_reads_and_escapes_text():
    html_fail = CheckResult("<t>", (compare("x<y", 1, 2),))._repr_html_()
    assert "class='kvlab-check kvlab-check-fail'" in html_fail and "NOT YET" in html_fail
    assert "&lt;t&gt;" in html_fail and "x&lt;y" in html_fail and "<t>" not in html_fail
    html_pass = CheckResult("t", (compare("x", 1, 1),), note="n & m")._repr_html_()
    assert "kvlab-check-pass" in html_pass and "PASS" in html_pass and "n &amp; m" in html_pass


def test_raise_if_wrong_is_for_tests_and_instructors():
    passing = CheckResult("t", (compare("x", 1, 1),))
    assert passing.raise_if_wrong() is passing
    with pytest.raises(ExerciseError, match="you gave 1, the model says 2"):
        CheckResult("t", (compare("x", 1, 2),)).raise_if_wrong()
    assert issubclass(ExerciseError, AssertionError)


@pytest.mark.parametrize("value, enabled", [("1", True), ("true", True), (" YES ", True), ("On", True),
                                             ("0", False), ("", False), ("no", False), ("off", False),
                                             ("2", False)])
def test_solutions_follow_the_environment_variable(monkeypatch, value, enabled):
    monkeypatch.setenv("KVLAB_SOLUTIONS", value)
    assert solutions_enabled() is enabled


def test_set_solutions_overrides_the_environment_until_reset(monkeypatch):
    assert not solutions_enabled()  # default: hidden
    monkeypatch.setenv("KVLAB_SOLUTIONS", "1")
    set_solutions(False)
    assert not solutions_enabled()
    set_solutions(None)
    assert solutions_enabled()
    monkeypatch.setenv("KVLAB_SOLUTIONS", "0")
    set_solutions(True)
    assert solutions_enabled()


def test_solution_is_hidden_by_default_and_shown_when_enabled():
    sol = Solution("the fix", "x = max(0, a - b)  # <b>")
    hidden_html, hidden_text = sol._repr_html_(), repr(sol)
    assert "kvlab-solution-hidden" in hidden_html and "KVLAB_SOLUTIONS=1" in hidden_html
    assert "max(0" not in hidden_html and "max(0" not in hidden_text and "KVLAB_SOLUTIONS=1" in hidden_text
    set_solutions(True)
    shown = sol._repr_html_()
    assert "class='kvlab-solution'" in shown and "x = max(0, a - b)  # &lt;b&gt;" in shown
    assert repr(sol) == "Solution · the fix\nx = max(0, a - b)  # <b>"


def test_fmt_numbers_for_learners():
    assert _fmt(43_373_240_320) == "43,373,240,320"
    assert _fmt(True) == "True"
    assert _fmt(1234.5678) == "1,235"
    assert _fmt(None) == "None"
    assert CheckLine("n", True, given=3).text() == "✔ n: 3"


# ---- one shape for every lab step and exercise ----------------------------------------------------

LABS = labs.all_labs()


def _stub_namespace(stem: str, names) -> dict:
    """What the notebook's own cells give the learner to start from: the cells that define ``names``, run."""
    namespace: dict = {}
    for cell in jupytext.read(NOTEBOOKS / f"{stem}.py").cells:
        if cell.cell_type == "code" and any(f"{name} =" in cell.source or f"def {name}(" in cell.source
                                            for name in names):
            exec(cell.source, namespace)
    return {name: namespace[name] for name in names if name in namespace}


def test_every_notebook_with_a_check_cell_has_its_labs_registered():
    """A notebook that calls ``.check(`` is in NOTEBOOK_LABS (and nothing else is), and it imports its module."""
    with_checks = {p.stem for p in NOTEBOOKS.glob("*.py") if ".check(" in p.read_text()}
    assert with_checks == set(labs.NOTEBOOK_LABS)
    for stem, module in labs.NOTEBOOK_LABS.items():
        source = (NOTEBOOKS / f"{stem}.py").read_text()
        package, name = module.rsplit(".", 1)
        assert f"from {package} import {name} as " in source, stem


@pytest.mark.parametrize("key", list(LABS))
def test_each_lab_has_run_check_and_a_hidden_solution(key):
    lab = LABS[key]
    assert isinstance(lab, labs.Lab) and key.endswith(f".{lab.key}") and lab.title
    assert callable(lab.run) and callable(lab.check)
    assert isinstance(lab.solution, Solution) and "hidden" in repr(lab.solution)


@pytest.mark.slow
@pytest.mark.parametrize("key", list(LABS))
def test_the_notebooks_stub_is_not_yet_and_the_solution_passes(key):
    """The names the solution defines are the names the notebook's cell asks the learner for; what the notebook
    starts from does not pass the check, the solution does."""
    lab, stem = LABS[key], key.split(".")[0]
    answer = lab.answer()
    stub = _stub_namespace(stem, answer)
    assert set(stub) == set(answer), f"{stem} defines {sorted(stub)}, the solution {sorted(answer)}"
    result = lab.check(stub[lab.function]) if isinstance(lab, labs.Exercise) else lab.check(**stub)
    assert not result.ok and result.text().startswith("NOT YET"), result.text()
    solved = lab.check_solution()
    assert solved.ok, solved.text()


@pytest.mark.parametrize("key", list(LABS))
def test_the_solution_needs_no_name_its_notebook_does_not_define(key):
    """Pasted into its notebook, the solution runs: every name it reads (``MiB`` in notebook 00) is a builtin,
    defined by the solution itself, or imported or assigned in the notebook."""
    import ast
    import builtins

    lab, stem = LABS[key], key.split(".")[0]
    tree = ast.parse(lab.solution.code)
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    defined = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    defined |= {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    defined |= {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}
    notebook = ast.parse((NOTEBOOKS / f"{stem}.py").read_text())
    defined |= {(a.asname or a.name).split(".")[0] for n in ast.walk(notebook)
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    defined |= {n.id for n in ast.walk(notebook) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    missing = sorted(read - defined - set(dir(builtins)))
    assert not missing, f"{key}'s solution reads {missing}, which {stem} never defines"
