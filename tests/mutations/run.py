"""Plant each deliberate break of ``tests/mutations/*.patch`` in a scratch worktree and check
that the fast tier (``make test``) catches it.

Usage::

    python tests/mutations/run.py                 # every patch (make mutations)
    python tests/mutations/run.py NAME ...        # the patches whose names contain NAME
    python tests/mutations/run.py --list          # what each patch breaks, and its guard

A patch is a ``git diff`` of the committed tree, preceded by its header::

    Mutation: raw_stall counts one cycle short on the compact and fast pipelines
    Caught-by: tests/hdl/test_counters_exact.py

``Caught-by`` names the tests (pytest paths or node ids, space-separated) expected to catch
it. For each patch the script resets one scratch worktree (``build/mutations/worktree``, a
detached checkout of ``HEAD``; uncommitted changes are not in it) to ``HEAD``, applies the
patch and runs ``make test`` there with ``ARGS="-x <Caught-by>"``: the fast tier's own
command and marker, limited to those tests. If they pass, it runs the whole fast tier
(``make test ARGS=-x``). The mutation is *caught* if a test of the fast tier fails, and the
table names the first one; a patch whose ``Caught-by`` selects no test of the fast tier is an
error (the guard moved out of ``make test``). The worktree keeps its ``build/`` from patch to
patch, so simulators are rebuilt only for the designs a patch changes.

The table (markdown) is printed and written to ``build/mutations/report.md``; the exit
status is non-zero if any mutation survived or could not be run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
OUT = REPO / "build" / "mutations"
WORKTREE = OUT / "worktree"


@dataclass
class Mutation:
    name: str
    path: Path
    what: str
    caught_by: list[str]


def load(path: Path) -> Mutation:
    """A patch file's header fields; raises ``ValueError`` naming what is missing."""
    fields: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.startswith("diff --git"):
            break
        key, sep, value = line.partition(":")
        if sep and key in ("Mutation", "Caught-by"):
            fields[key] = value.strip()
    missing = [k for k in ("Mutation", "Caught-by") if not fields.get(k)]
    if missing:
        raise ValueError(f"{path.name}: no {' or '.join(missing)} line before the diff "
                         f"(a patch starts with 'Mutation: ...' and 'Caught-by: ...')")
    return Mutation(path.stem, path, fields["Mutation"], fields["Caught-by"].split())


def patches(names: list[str] | None = None) -> list[Mutation]:
    found = [load(p) for p in sorted(HERE.glob("*.patch"))]
    if names:
        found = [m for m in found if any(n in m.name for n in names)]
    return found


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def fresh_worktree() -> None:
    """``WORKTREE`` at ``HEAD``, clean but for its ``build/`` (and the ``.venv`` link)."""
    head = git("rev-parse", "HEAD")
    if not (WORKTREE / ".git").exists():
        OUT.mkdir(parents=True, exist_ok=True)
        git("worktree", "prune")
        git("worktree", "add", "--detach", str(WORKTREE), head)
    git("checkout", "--quiet", "--detach", "--force", head, cwd=WORKTREE)
    git("clean", "-fdxq", "-e", "build/", "-e", ".venv", cwd=WORKTREE)
    venv = WORKTREE / ".venv"
    if not venv.exists():
        venv.symlink_to(REPO / ".venv")


def check_imports() -> None:
    """The worktree's packages, not the editable install's, are what its tests import."""
    out = subprocess.run([str(WORKTREE / ".venv" / "bin" / "python"), "-c",
                          "import hdl, sim, firmware; print(hdl.__file__, sim.__file__, "
                          "firmware.__file__)"],
                         cwd=WORKTREE, check=True, capture_output=True, text=True).stdout
    wrong = [p for p in out.split() if not Path(p).resolve().is_relative_to(WORKTREE)]
    if wrong:
        sys.exit(f"mutations: the worktree imports {wrong}, not its own packages")


def _reason(case: ElementTree.Element) -> str:
    """The first line of a failed test's message that says what was wrong."""
    for tag in ("failure", "error"):
        bad = case.find(tag)
        if bad is not None:
            lines = [line.strip() for line in (bad.get("message") or "").splitlines()]
            found = [line for line in lines if "Error" in line or "seed" in line] or lines
            return (found or ["(no message)"])[0][:160]
    return ""


def fast_tier(args: str, junit: Path) -> tuple[int, list[tuple[str, str]]]:
    """``make test ARGS=...`` in the worktree: (tests run, the failed tests in order, each
    with the first line of its message)."""
    junit.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "PYTEST_ADDOPTS")}
    proc = subprocess.run(["make", "--no-print-directory", "-C", str(WORKTREE), "test",
                           f"ARGS=-p no:cacheprovider -x --junitxml={junit} {args}"],
                          env=env, capture_output=True, text=True)
    if not junit.is_file():
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        raise RuntimeError(f"make test wrote no results (exit {proc.returncode}):\n{tail}")
    run, failed = 0, []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        if case.find("skipped") is not None:
            continue
        run += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append((f"{case.get('classname', '').replace('.', '/')}.py::"
                           f"{case.get('name')}", _reason(case)))
    return run, failed


def check(m: Mutation) -> tuple[str, str, str]:
    """(verdict, detail, why): ``caught`` with the first failing test and its message,
    ``SURVIVED``, or ``ERROR`` with what went wrong."""
    fresh_worktree()
    apply = subprocess.run(["git", "apply", str(m.path)], cwd=WORKTREE, capture_output=True,
                           text=True)
    if apply.returncode:
        return "ERROR", f"does not apply: {apply.stderr.strip()}", ""
    junit = OUT / f"{m.name}.xml"
    try:
        run, failed = fast_tier(" ".join(m.caught_by), junit)
        if run == 0:
            return ("ERROR", f"Caught-by {' '.join(m.caught_by)} selects no test of make test",
                    "")
        if not failed:
            run, failed = fast_tier("", junit)
    except RuntimeError as exc:
        return "ERROR", str(exc), ""
    return ("caught", *failed[0]) if failed else ("SURVIVED", f"{run} tests passed", "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="run the patches whose names contain these")
    parser.add_argument("--list", action="store_true", help="list the patches and exit")
    args = parser.parse_args(argv)
    found = patches(args.names)
    if not found:
        sys.exit(f"mutations: no patch in {HERE} matches {args.names}")
    if args.list:
        for m in found:
            print(f"{m.name:44} {m.what}\n{'':44} caught by {' '.join(m.caught_by)}")
        return 0
    if git("status", "--porcelain", "--untracked-files=no"):
        print("mutations: note: uncommitted changes are not in the worktree (it checks HEAD)",
              file=sys.stderr)
    fresh_worktree()
    check_imports()
    rows, bad = [], 0
    head = git("rev-parse", "--short", "HEAD")
    print(f"mutations: {len(found)} patches on {head}, each against make test", flush=True)
    for m in found:
        start = time.monotonic()
        verdict, detail, why = check(m)
        seconds = time.monotonic() - start
        bad += verdict != "caught"
        print(f"  {m.name:44} {verdict:8} {seconds:6.1f} s  {detail}\n{'':56}{why}",
              flush=True)
        rows.append(f"| `{m.name}` | {m.what} | {verdict}: `{detail}` | {seconds:.0f} s |"
                    if verdict == "caught" else
                    f"| `{m.name}` | {m.what} | **{verdict}**: {detail} | {seconds:.0f} s |")
    fresh_worktree()
    table = "\n".join([f"Mutations at {head}: {len(found) - bad} of {len(found)} caught by "
                       f"make test.", "", "| patch | what it breaks | first failing test | "
                       "time |", "|---|---|---|---|", *rows])
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "report.md").write_text(table + "\n")
    print("\n" + table)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
