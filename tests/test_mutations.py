"""The deliberate breaks of ``tests/mutations/`` stay plantable: each patch names what it
breaks and the tests of ``make test`` that catch it, and still applies to the tree (``make
mutations`` plants each in a scratch worktree and runs the fast tier; this only checks that
it could)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The runner (tests/mutations/run.py, a script) as a module of its own name.
_spec = importlib.util.spec_from_file_location("mutations_run",
                                              ROOT / "tests" / "mutations" / "run.py")
mutations = sys.modules["mutations_run"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mutations)

PATCHES = mutations.patches()


def _git_checkout() -> bool:
    done = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=ROOT,
                          capture_output=True, text=True)
    return done.returncode == 0 and done.stdout.strip() == "true"


def test_at_least_thirty_across_hdl_and_firmware():
    touched = {m.name: {line.split()[2][2:].split("/")[0]
                        for line in m.path.read_text().splitlines()
                        if line.startswith("diff --git")} for m in PATCHES}
    assert len(PATCHES) >= 30, f"{len(PATCHES)} mutation patches"
    assert all(len(folders) == 1 for folders in touched.values()), touched
    folders = [next(iter(f)) for f in touched.values()]
    assert folders.count("hdl") >= 15 and folders.count("firmware") >= 5, folders


@pytest.mark.skipif(not _git_checkout(), reason="not a git checkout (git apply needs one)")
@pytest.mark.parametrize("mutation", PATCHES, ids=[m.name for m in PATCHES])
def test_patch_applies(mutation):
    """The patch applies to the tree as it is (``git apply --check``), and each test it
    names exists."""
    done = subprocess.run(["git", "apply", "--check", str(mutation.path)], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, (f"{mutation.path.name} no longer applies: "
                                  f"{done.stderr.strip()}; remake it against the tree")
    for target in mutation.caught_by:
        path = ROOT / target.split("::")[0]
        assert path.is_file(), f"{mutation.name}: Caught-by names {target}, which is not there"
        if "::" in target:
            name = target.split("::")[1].split("[")[0]
            assert f"def {name}(" in path.read_text(), \
                f"{mutation.name}: no test {name} in {path.name}"


def test_header_is_required(tmp_path):
    bad = tmp_path / "x.patch"
    bad.write_text("diff --git a/x b/x\n")
    with pytest.raises(ValueError, match="no Mutation or Caught-by line"):
        mutations.load(bad)
