"""The lock covers pyproject.toml, and environment.yml (conda/Binder) installs the lock's exact pins.

requirements/lock.txt is resolved by scripts/lock.sh from pyproject.toml (runtime + test extra) and
requirements/torch-cpu.txt; these tests fail when someone edits one without refreshing the others.
"""

import pathlib
import re

import tomllib
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "lock.txt"
TORCH_CPU = ROOT / "requirements" / "torch-cpu.txt"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._\-]*)==(\S+?)(?:\s|$)")


def _pins(text: str) -> dict[str, str]:
    return {canonicalize_name(m.group(1)): m.group(2) for m in map(PIN.match, text.splitlines()) if m}


def _declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return [Requirement(r) for r in reqs]


def _env_pip_section() -> list[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    return next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)


def test_lock_pins_every_declared_dependency_within_its_range():
    locked = _pins(LOCK.read_text()) | _pins(TORCH_CPU.read_text())
    missing, outside = [], []
    for req in _declared():
        version = locked.get(canonicalize_name(req.name))
        if version is None:
            missing.append(req.name)
        elif not req.specifier.contains(Version(version), prereleases=True):
            outside.append(f"{req.name}=={version} (pyproject.toml wants {req.specifier})")
    assert not missing, f"not in requirements/lock.txt: {missing}; run `bash scripts/lock.sh`"
    assert not outside, f"lock pins outside pyproject.toml's ranges: {outside}; run `bash scripts/lock.sh`"


def test_every_locked_package_is_exact_and_hashed():
    blocks = re.split(r"\n(?=[A-Za-z0-9])", LOCK.read_text())
    packages = [b for b in blocks if PIN.match(b)]
    assert len(packages) > 50
    unhashed = [b.split()[0] for b in packages if "--hash=sha256:" not in b]
    assert not unhashed, f"pins without hashes: {unhashed}"
    loose = [line for line in LOCK.read_text().splitlines()
             if re.match(r"^[A-Za-z0-9]", line) and not PIN.match(line)]
    assert not loose, f"lock lines that are not exact pins: {loose}"


def test_torch_is_pinned_to_the_cpu_build_outside_the_hashed_lock():
    torch = _pins(TORCH_CPU.read_text()).get("torch")
    assert torch is not None and torch.endswith("+cpu"), torch
    assert "torch" not in _pins(LOCK.read_text()), "torch must stay out of the hashed lock (see scripts/lockfile.py)"
    assert "torch" in LOCK.read_text(), "torch's own dependencies are resolved with it (lines '# via torch')"


def test_environment_yml_installs_exactly_the_lock():
    pip_section = _env_pip_section()
    listed = _pins("\n".join(pip_section))
    expected = _pins(LOCK.read_text()) | _pins(TORCH_CPU.read_text())
    assert listed == expected, (
        f"only in environment.yml: {sorted(set(listed.items()) - set(expected.items()))}; "
        f"only in the lock: {sorted(set(expected.items()) - set(listed.items()))}; run `bash scripts/lock.sh`")
    assert "-e ." in pip_section, "environment.yml must install kvlab itself (pip -e .)"


def test_install_scripts_install_from_the_lock():
    install = (ROOT / "scripts" / "install.sh").read_text()
    assert "--require-hashes -r requirements/lock.txt" in install
    assert "-r requirements/torch-cpu.txt" in install
    for script in ("lab.sh", "test.sh"):
        assert "bash scripts/install.sh" in (ROOT / "scripts" / script).read_text(), script
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_python_versions_agree():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python"))
    minimum = project["requires-python"].removeprefix(">=")
    assert tuple(map(int, python.split("=")[1].split("."))) >= tuple(map(int, minimum.split(".")))
    assert "Python 3.11" in LOCK.read_text().splitlines()[1], "the lock is resolved for environment.yml's Python"
