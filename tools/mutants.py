#!/usr/bin/env python3
"""Mutation check: apply curated bugs one at a time to a copy of the repository and run the fast tests.

Each mutant in ``tools/mutants.yaml`` is an exact ``find`` snippet (it must occur exactly once in
its file, or the whole run stops: the list cannot silently rot) and its ``replace``. For every
mutant the script copies a snapshot of the repository into a fresh temporary directory, applies
the edit there and runs

    <python> -m pytest -x -q -p no:cacheprovider -m "not integration and not compile"

in that directory with ``PYTHONPATH=<copy>``, so that the mutated copy of ``lorekv`` is imported
and not the editable install (verified before anything runs, and again inside every pytest run
by a small guard plugin). A non-zero pytest exit kills the mutant; exit 0 means it survived; a
run past ``--timeout`` counts as killed by timeout and is reported separately.

The working tree is never modified: a snapshot is taken once at start-up (so edits made to the
checkout while the check runs do not mix into it), the unmutated snapshot must pass the suite
(the baseline), and every mutant is copied from that snapshot.

Usage:
    python tools/mutants.py                      # run everything, print the summary
    python tools/mutants.py --out docs/reference/testing-mutants.md
    python tools/mutants.py --only issue7-decoding-positions-not-advanced,p-uniform-no-recent
    python tools/mutants.py --module lorekv.policies --jobs 2
    python tools/mutants.py --list               # validate the list and print it
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LIST = ROOT / "tools" / "mutants.yaml"
DEFAULT_PYTHON = ROOT / ".venv" / "bin" / "python"

# What a copy holds. Required entries must exist; optional ones are copied when present (tests
# may read the docs or the README, e.g. executed tutorials).
COPY_REQUIRED = ("lorekv", "tests", "pyproject.toml", "evaluations")
COPY_OPTIONAL = ("docs", "README.md", "CONTRIBUTING.md", "mkdocs.yml", "tools")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".hypothesis")

GUARD_MODULE = "_mutants_guard"
GUARD_EXIT = 97  # the guard's exit status: the run would test the wrong lorekv, abort everything
GUARD_SOURCE = textwrap.dedent(
    '''\
    """pytest plugin written by tools/mutants.py: abort unless lorekv comes from this copy."""
    import os
    from pathlib import Path


    def pytest_configure(config):
        import lorekv

        root = Path(os.environ["LOREKV_MUTANTS_ROOT"]).resolve()
        where = Path(lorekv.__file__).resolve()
        if root not in where.parents:
            import pytest

            pytest.exit(f"mutants guard: lorekv imported from {where}, not from the copy {root}", returncode=97)
    '''
)

FIELDS = ("id", "file", "find", "replace", "why")
ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]*$")


class ListError(Exception):
    """The mutation list is malformed or out of date with the code."""


@dataclasses.dataclass(frozen=True)
class Mutant:
    id: str
    file: str
    find: str
    replace: str
    why: str

    @property
    def module(self) -> str:
        """Dotted module name of the mutated file, e.g. ``lorekv.hf.rollout``."""
        return ".".join(Path(self.file).with_suffix("").parts)


@dataclasses.dataclass
class Result:
    mutant: Mutant
    status: str  # killed | survived | timeout | baseline
    seconds: float
    first_failure: str = ""
    tail: str = ""


# ---------------------------------------------------------------------------------------------
# The list


def load_mutants(path: Path, root: Path) -> list[Mutant]:
    """Parse and validate the whole list against the code under ``root``; raise ListError on any problem."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ListError(f"{path}: cannot read: {exc}") from exc
    entries = data.get("mutants") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries:
        raise ListError(f"{path}: expected a non-empty list under 'mutants:'")
    problems: list[str] = []
    mutants: list[Mutant] = []
    seen: set[str] = set()
    texts: dict[str, str] = {}
    for i, entry in enumerate(entries):
        where = f"entry {i}" + (f" ({entry.get('id')})" if isinstance(entry, dict) and entry.get("id") else "")
        if not isinstance(entry, dict):
            problems.append(f"{where}: not a mapping")
            continue
        missing = [f for f in FIELDS if not isinstance(entry.get(f), str)]
        extra = sorted(set(entry) - set(FIELDS))
        if missing or extra:
            problems.append(f"{where}: missing/non-string fields {missing}, unknown fields {extra}")
            continue
        m = Mutant(**{f: entry[f] for f in FIELDS})
        if not ID_PATTERN.match(m.id):
            problems.append(f"{where}: id must be a lowercase slug (a-z, 0-9, -)")
        if m.id in seen:
            problems.append(f"{where}: duplicate id")
        seen.add(m.id)
        if not m.find:
            problems.append(f"{where}: empty find")
        if m.find == m.replace:
            problems.append(f"{where}: replace equals find (not a mutation)")
        if "\n" in m.why.strip():
            problems.append(f"{where}: why must be one line")
        rel = Path(m.file)
        if rel.is_absolute() or ".." in rel.parts or rel.parts[0] not in COPY_REQUIRED:
            problems.append(f"{where}: file must be a relative path under {', '.join(COPY_REQUIRED[:2])}")
            continue
        if m.file not in texts:
            try:
                texts[m.file] = (root / m.file).read_text()
            except OSError as exc:
                problems.append(f"{where}: cannot read {m.file}: {exc}")
                continue
        count = texts[m.file].count(m.find) if m.find else 0
        if count != 1:
            problems.append(f"{where}: find occurs {count} times in {m.file} (must be exactly once): {m.find!r}")
        elif m.file.endswith(".py"):
            try:  # a mutant that does not even compile would be "killed" for the wrong reason
                compile(texts[m.file].replace(m.find, m.replace, 1), m.file, "exec")
            except SyntaxError as exc:
                problems.append(f"{where}: the mutated {m.file} does not compile: {exc}")
        mutants.append(m)
    if problems:
        raise ListError(f"{path}: {len(problems)} problem(s):\n  " + "\n  ".join(problems))
    return mutants


def select(mutants: list[Mutant], only: str | None, module: str | None) -> list[Mutant]:
    chosen = mutants
    if only:
        wanted = [w.strip() for w in only.split(",") if w.strip()]
        known = {m.id for m in mutants}
        unknown = [w for w in wanted if w not in known]
        if unknown:
            raise ListError(f"--only: unknown mutant id(s): {', '.join(unknown)}")
        chosen = [m for m in chosen if m.id in wanted]
    if module:
        keys = [k.strip() for k in module.split(",") if k.strip()]

        def matches(m: Mutant) -> bool:
            return any(
                m.module == k or m.module.startswith(k + ".") or m.file == k or m.file.startswith(k.rstrip("/") + "/")
                for k in keys
            )

        chosen = [m for m in chosen if matches(m)]
        if not chosen:
            raise ListError(f"--module {module!r} matches no mutant")
    return chosen


# ---------------------------------------------------------------------------------------------
# Copies and runs


def snapshot(root: Path, dest: Path) -> None:
    """Copy the parts of the repository the tests need into ``dest`` (which must not exist)."""
    dest.mkdir(parents=True)
    for name in COPY_REQUIRED + COPY_OPTIONAL:
        src = root / name
        if not src.exists():
            if name in COPY_REQUIRED:
                raise FileNotFoundError(f"{src} is missing")
            continue
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=IGNORE)
        else:
            shutil.copy2(src, dest / name)
    (dest / f"{GUARD_MODULE}.py").write_text(GUARD_SOURCE)


def child_env(copy: Path, threads: int) -> dict[str, str]:
    env = dict(os.environ)
    # PYTHONPATH comes before site-packages on sys.path, and setuptools' editable finder for
    # lorekv is appended to the end of sys.meta_path, so the copy wins (checked at start-up).
    env["PYTHONPATH"] = str(copy)
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["LOREKV_MUTANTS_ROOT"] = str(copy)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    env.pop("PYTEST_ADDOPTS", None)
    return env


def check_identity(python: str, copy: Path, threads: int) -> None:
    """Abort unless ``import lorekv`` in the children resolves to the copy."""
    proc = subprocess.run(
        [python, "-c", "import lorekv; print(lorekv.__file__)"],
        cwd=copy,
        env=child_env(copy, threads),
        capture_output=True,
        text=True,
        timeout=120,
    )
    where = proc.stdout.strip()
    if proc.returncode != 0 or not where or copy.resolve() not in Path(where).resolve().parents:
        raise SystemExit(
            f"identity check failed: the test process imports lorekv from {where or '?'} instead of the copy "
            f"{copy}\n{proc.stderr[-2000:]}"
        )


def pytest_command(python: str, hypothesis_seed: int | None) -> list[str]:
    cmd = [
        python,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        GUARD_MODULE,
        "-m",
        "not integration and not compile",
    ]
    if hypothesis_seed is not None:
        cmd.append(f"--hypothesis-seed={hypothesis_seed}")
    return cmd


def test_files_nearest_first(root: Path, mutated: str) -> list[str]:
    """Every test file under ``root/tests``, those that mirror the mutated file first.

    ``lorekv/hf/cache.py`` puts ``tests/hf/`` first (the deepest folder of ``tests`` that mirrors the
    file's package), ``lorekv/pipeline.py`` the files named ``tests/test_pipeline*.py``; then the files
    at the root of ``tests`` (the pipeline and the presets end to end, where a component's paper rule
    is tested); then the rest in pytest's own order. A killed mutant then usually fails within its own
    tests instead of after the whole suite before them; a surviving one runs every test all the same.
    (pytest folds a folder given beside its parent into the parent, so the files are listed one by one.)
    """
    tests = root / "tests"
    files = sorted(p.relative_to(root).as_posix() for p in tests.rglob("test_*.py"))
    package = Path(mutated).parent.parts[1:]  # lorekv/<package...>/<module>.py
    mirror = ""
    for depth in range(len(package), 0, -1):
        if (tests.joinpath(*package[:depth])).is_dir():
            mirror = "tests/" + "/".join(package[:depth]) + "/"
            break
    stem = f"tests/test_{Path(mutated).stem}"
    near = [f for f in files if (mirror and f.startswith(mirror)) or (not mirror and f.startswith(stem))]
    whole = [f for f in files if f.count("/") == 1 and f not in near]  # the pipeline and the presets, end to end
    return near + whole + [f for f in files if f not in near and f not in whole]


_FAILURE_LINE = re.compile(r"^(FAILED|ERROR) (\S+)")


def first_failure(output: str) -> str:
    """The first failing/erroring test id from pytest's short summary, else the last line."""
    for line in output.splitlines():
        match = _FAILURE_LINE.match(line)
        if match:
            return match.group(2)
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


_PROCS: set[subprocess.Popen] = set()
_PROCS_LOCK = threading.Lock()


def run_suite(copy: Path, cmd: list[str], threads: int, timeout: float) -> tuple[str, float, str]:
    """Run the suite in ``copy``; return (killed | survived | timeout, seconds, output)."""
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=copy,
        env=child_env(copy, threads),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, so a timeout kills everything it started
    )
    with _PROCS_LOCK:
        _PROCS.add(proc)
    try:
        out, _ = proc.communicate(timeout=timeout)
        if proc.returncode == GUARD_EXIT:
            raise SystemExit(f"mutants: the guard found the tests importing the wrong lorekv in {copy}:\n{out[-2000:]}")
        status = "survived" if proc.returncode == 0 else "killed"
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, _ = proc.communicate()
        status = "timeout"
    finally:
        with _PROCS_LOCK:
            _PROCS.discard(proc)
    return status, time.monotonic() - start, out or ""


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_mutant(m: Mutant, pristine: Path, work: Path, cmd: list[str], threads: int, timeout: float) -> Result:
    copy = work / m.id
    shutil.copytree(pristine, copy)
    try:
        target = copy / m.file
        text = target.read_text()
        if text.count(m.find) != 1:  # validated at start-up; the snapshot cannot have changed
            raise ListError(f"{m.id}: find no longer unique in the snapshot of {m.file}")
        target.write_text(text.replace(m.find, m.replace, 1))
        status, seconds, out = run_suite(copy, [*cmd, *test_files_nearest_first(copy, m.file)], threads, timeout)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    failure = "" if status == "survived" else ("(timeout)" if status == "timeout" else first_failure(out))
    return Result(m, status, seconds, failure, out[-3000:])


# ---------------------------------------------------------------------------------------------
# Reports


def per_module(results: list[Result]) -> list[tuple[str, int, int, int, int]]:
    """(module, mutants, killed, killed by timeout, survived) per mutated file, sorted by path."""
    rows: dict[str, list[int]] = {}
    for r in results:
        row = rows.setdefault(r.mutant.file, [0, 0, 0, 0])
        row[0] += 1
        row[1] += r.status == "killed"
        row[2] += r.status == "timeout"
        row[3] += r.status == "survived"
    return [(name, *rows[name]) for name in sorted(rows)]


def issue_line(results: list[Result], prefix: str = "issue7-") -> str:
    """'issue7-* mutants: k of n killed' (empty when none ran)."""
    tagged = [r for r in results if r.mutant.id.startswith(prefix)]
    if not tagged:
        return ""
    killed = sum(r.status != "survived" for r in tagged)
    return f"{prefix}* mutants (bugs that once survived): {killed} of {len(tagged)} killed"


def share(killed: int, total: int) -> str:
    return f"{100.0 * killed / total:.0f}%" if total else "-"


def summary_lines(results: list[Result], wall: float) -> list[str]:
    rows = per_module(results)
    width = max([len("module"), *(len(r[0]) for r in rows)])
    lines = [f"{'module':<{width}}  mutants  killed  timeout  survived  share killed"]
    for name, n, k, t, s in rows:
        lines.append(f"{name:<{width}}  {n:>7}  {k:>6}  {t:>7}  {s:>8}  {share(k + t, n):>12}")
    n, k, t, s = (sum(r[i] for r in rows) for i in range(1, 5))
    lines.append(f"{'total':<{width}}  {n:>7}  {k:>6}  {t:>7}  {s:>8}  {share(k + t, n):>12}")
    survivors = [r.mutant.id for r in results if r.status == "survived"]
    timeouts = [r.mutant.id for r in results if r.status == "timeout"]
    lines.append("")
    if issue_line(results):
        lines.append(issue_line(results))
    lines.append(f"surviving ({len(survivors)}): " + (", ".join(survivors) if survivors else "none"))
    if timeouts:
        lines.append(f"killed by timeout ({len(timeouts)}): " + ", ".join(timeouts))
    lines.append(f"wall clock: {wall / 60:.1f} min")
    return lines


def md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(results: list[Result], wall: float, jobs: int, seed: int | None) -> str:
    rows = per_module(results)
    stamp = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    n, k, t, s = (sum(r[i] for r in rows) for i in range(1, 5))
    out = [
        "# Mutation check",
        "",
        "Generated by `make mutants` (`tools/mutants.py`, list in `tools/mutants.yaml`): each mutant is one "
        "deliberate, realistic bug applied to a temporary copy of the repository, then the fast test suite "
        '(`pytest -x -m "not integration and not compile"`) runs against it. '
        "A mutant is *killed* when some test fails, "
        "*survives* when the whole suite passes. A surviving mutant is a bug the tests would not catch.",
        "",
        f"Run: {stamp}; {n} mutants, {k + t} killed ({share(k + t, n)}), {s} surviving; "
        f"{wall / 60:.1f} min wall clock with {jobs} parallel job(s)"
        + (f", hypothesis seed {seed}." if seed is not None else ", random hypothesis seed."),
        "",
        *([issue_line(results) + ".", ""] if issue_line(results) else []),
        "## Per module",
        "",
        "| module | mutants | killed | survived | share killed |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, n_, k_, t_, s_ in rows:
        killed = f"{k_ + t_}" + (f" ({t_} by timeout)" if t_ else "")
        out.append(f"| `{name}` | {n_} | {killed} | {s_} | {share(k_ + t_, n_)} |")
    killed = f"{k + t}" + (f" ({t} by timeout)" if t else "")
    out.append(f"| **total** | {n} | {killed} | {s} | {share(k + t, n)} |")
    out += [
        "",
        "## Every mutant",
        "",
        "| id | file | why | result | first failing test |",
        "|---|---|---|---|---|",
    ]
    label = {"killed": "killed", "timeout": "killed (timeout)", "survived": "**survived**"}
    for r in results:
        failing = f"`{md_cell(r.first_failure)}`" if r.first_failure else ""
        out.append(f"| `{r.mutant.id}` | `{r.mutant.file}` | {md_cell(r.mutant.why)} | {label[r.status]} | {failing} |")
    out.append("")
    return "\n".join(out)


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------------------------------------
# Main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--list-file", type=Path, default=DEFAULT_LIST, help="the mutation list (tools/mutants.yaml)")
    p.add_argument("--only", metavar="ID[,ID]", help="run only these mutant ids")
    p.add_argument(
        "--module", metavar="MOD[,MOD]", help="run only mutants of these modules (lorekv.policies, lorekv/hf/cache.py)"
    )
    p.add_argument("--list", action="store_true", help="validate the list, print it and exit")
    p.add_argument("--out", type=Path, metavar="FILE", help="also write the report as Markdown to FILE (atomically)")
    p.add_argument("--jobs", type=int, default=2, help="mutants run in parallel (default 2)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per suite run before it counts as killed")
    p.add_argument("--python", default=str(DEFAULT_PYTHON if DEFAULT_PYTHON.exists() else sys.executable))
    p.add_argument(
        "--hypothesis-seed",
        type=int,
        default=0,
        help="pass --hypothesis-seed to pytest so runs are reproducible (default 0; -1: random)",
    )
    p.add_argument("--skip-baseline", action="store_true", help="do not run the unmutated suite first")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error("--jobs must be >= 1")
    if args.hypothesis_seed < 0:
        args.hypothesis_seed = None
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        mutants = load_mutants(args.list_file, ROOT)
        chosen = select(mutants, args.only, args.module)
    except ListError as exc:
        print(f"mutants: {exc}", file=sys.stderr)
        return 2

    if args.list:
        for m in chosen:
            print(f"{m.id:<48} {m.file:<34} {m.why}")
        print(f"\n{len(chosen)} of {len(mutants)} mutants; every find snippet occurs exactly once.")
        return 0

    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    cmd = pytest_command(args.python, args.hypothesis_seed)
    wall_start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="lorekv-mutants-"))

    def on_signal(signum, frame):  # noqa: ARG001
        with _PROCS_LOCK:
            for proc in list(_PROCS):
                kill_group(proc)
        shutil.rmtree(work, ignore_errors=True)
        raise SystemExit(130)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        pristine = work / "_pristine"
        snapshot(ROOT, pristine)
        # Re-validate against the snapshot: the checkout may change while this runs.
        try:
            load_mutants(args.list_file, pristine)
        except ListError as exc:
            print(f"mutants: the snapshot differs from the checkout: {exc}", file=sys.stderr)
            return 2
        check_identity(args.python, pristine, threads)
        print(f"mutants: {len(chosen)} mutants, {args.jobs} job(s), {threads} thread(s) each; copies in {work}")
        print("mutants: identity check ok (the tests import lorekv from the temporary copy)", flush=True)

        if not args.skip_baseline:
            base = work / "_baseline"
            shutil.copytree(pristine, base)
            status, seconds, out = run_suite(base, cmd, threads, args.timeout)
            shutil.rmtree(base, ignore_errors=True)
            if status != "survived":
                print(out[-6000:], file=sys.stderr)
                print(
                    f"mutants: the unmutated suite is not green ({status}, first failure: {first_failure(out)}); "
                    "fix it before checking mutants",
                    file=sys.stderr,
                )
                return 1
            print(f"mutants: baseline green in {seconds:.1f}s", flush=True)

        results: dict[str, Result] = {}
        order = {m.id: i for i, m in enumerate(chosen)}
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = {pool.submit(run_mutant, m, pristine, work, cmd, threads, args.timeout): m for m in chosen}
            for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
                r = future.result()
                results[r.mutant.id] = r
                detail = f"  {r.first_failure}" if r.first_failure else ""
                print(f"[{done:>3}/{len(chosen)}] {r.status:<8} {r.mutant.id} ({r.seconds:.0f}s){detail}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    ordered = sorted(results.values(), key=lambda r: order[r.mutant.id])
    wall = time.monotonic() - wall_start
    print()
    print("\n".join(summary_lines(ordered, wall)))
    if args.out:
        out_path = args.out if args.out.is_absolute() else Path.cwd() / args.out
        write_atomic(out_path, markdown(ordered, wall, args.jobs, args.hypothesis_seed))
        print(f"report written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
