"""``specgate backends bundle``: an offline install of vLLM and specgate for another machine.

An air-gapped GPU host (no package index, no model hub) already has most of what vLLM needs
(CUDA's torch, transformers, ...). The bundle holds exactly the rest, as wheels for the host's
Python and platform, plus specgate's own wheel and the sources of the local models:

- pip resolves (``pip install --dry-run --report``, pip's own resolver; pip >= 23.1) the
  requirements for the host's interpreter and platform, with the host's installed versions
  (``--have``, ``pip list --format=freeze`` output) as constraints, so the resolver picks what
  the host has wherever vLLM accepts it;
- every resolved package the host already has at that version is left out; the rest is
  downloaded (``pip download --no-deps``, pinned, with the hashes from the report);
- ``manifest.json`` records the target, every file with its size and sha256, and what was left
  to the host; ``requirements.txt`` and ``INSTALL.md`` give the install commands
  (``pip install --no-index --find-links wheels -r requirements.txt`` in a venv made with
  ``--system-site-packages``, so the host's torch is used).

Resolution and download need the package index; nothing here runs vLLM or imports torch.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.markers import UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from backends.vllm_env import sha256_file

LogFn = Callable[[str], None]

#: The CUDA vLLM this project ran on a GPU (``shared/notes/gpu-h200.md``): it pins torch 2.11.0.
DEFAULT_VLLM = "vllm==0.26.0"
#: Version fixes learnt on a host (same note): xgrammar 0.2.9 needs a newer apache-tvm-ffi than
#: vLLM 0.26 pins (0.1.10); 0.2.7 works.
DEFAULT_EXTRA = ("xgrammar==0.2.7",)
#: Converts the GGUF of the local models (``backends/convert.py``) on the host.
MODEL_TOOLS = ("gguf>=0.10",)
MANIFEST = "manifest.json"
FORMAT_VERSION = 1


class BundleError(RuntimeError):
    """A bundle step failed: the message names the step, the command and pip's last lines."""


@dataclass(frozen=True)
class Target:
    """The host's interpreter and platform, as pip's cross-platform options spell them.

    ``glibc`` is the host's C library version (``ldd --version``): wheels tagged
    ``manylinux_2_N`` for every N from 17 to its minor version install there.
    """

    python_version: str = "3.12"
    arch: str = "x86_64"
    glibc: str = "2.39"

    def platforms(self) -> list[str]:
        """pip ``--platform`` tags, newest first (pip matches tags exactly, PEP 600)."""
        try:
            major, minor = (int(p) for p in self.glibc.split(".")[:2])
        except ValueError:
            raise BundleError(f"--glibc {self.glibc!r}: expected a version like 2.39") from None
        if major != 2 or minor < 17:
            raise BundleError(
                f"glibc {self.glibc}: manylinux wheels are tagged for glibc 2.17 to 2.N; "
                "expected a version like 2.39"
            )
        tags = [f"manylinux_2_{n}_{self.arch}" for n in range(minor, 16, -1)]
        return [*tags, f"manylinux2014_{self.arch}", f"manylinux1_{self.arch}"]

    def check(self) -> None:
        """Raise BundleError unless ``python_version`` is ``X.Y`` or ``X.Y.Z`` of Python 3 and
        ``glibc`` gives manylinux tags (:meth:`platforms`): found before pip runs, in one
        line, instead of in pip's usage text or as "no matching distribution"."""
        if not re.fullmatch(r"3\.\d+(\.\d+)?", self.python_version):
            raise BundleError(
                f"--python-version {self.python_version!r}: expected the host's Python 3 as "
                "X.Y or X.Y.Z, like 3.12 (python3 --version there)"
            )
        self.platforms()

    def markers(self) -> dict[str, str]:
        """The PEP 508 marker environment of the host (CPython on Linux), for evaluating a
        package's ``Requires-Dist`` lines without running there. ``python_version`` may be
        ``X.Y`` or ``X.Y.Z``; with ``X.Y`` the full version is taken as ``X.Y.0``. The keys a
        wheel's metadata practically never tests (``platform_release``, ``platform_version``)
        are empty, not this machine's."""
        parts = self.python_version.split(".")
        full = ".".join([*parts, "0"][:3]) if len(parts) < 3 else self.python_version
        return {
            "python_version": ".".join(parts[:2]),
            "python_full_version": full,
            "implementation_name": "cpython",
            "implementation_version": full,
            "platform_python_implementation": "CPython",
            "os_name": "posix",
            "sys_platform": "linux",
            "platform_system": "Linux",
            "platform_machine": self.arch,
            "platform_release": "",
            "platform_version": "",
        }

    def pip_options(self) -> list[str]:
        """The options that make pip resolve and download for this target, binaries only."""
        opts = ["--only-binary=:all:", "--python-version", self.python_version]
        opts += ["--implementation", "cp"]
        for tag in self.platforms():
            opts += ["--platform", tag]
        return opts


@dataclass(frozen=True)
class Resolved:
    """One package of pip's resolution: canonical name, version, wheel URL and sha256;
    ``requires`` its ``Requires-Dist`` lines and ``extras`` the extras the requirements named
    for it directly (pip's ``requested_extras``: set only for the packages asked for; those
    reached through another package's ``name[extra]`` are found by :func:`host_conflicts`)."""

    name: str
    version: str
    url: str
    sha256: str | None
    requires: tuple[str, ...] = ()
    extras: tuple[str, ...] = ()


#: Hard requirements of vLLM 0.26 (CUDA) that a server of a dense model (Llama, Qwen) on a
#: Hopper GPU never imports: Blackwell FlashAttention-4 and CuTe-DSL kernels, MLA/sparse
#: attention for DeepSeek-style models, Mamba kernels, video decoding, the CUDA compiler
#: wheels (FlashInfer's JIT finds the host's nvcc). 585 MiB of the 977 MiB a full bundle
#: takes; a bundle made with ``--exclude-unused`` installs with ``--no-deps``.
UNUSED_ON_DENSE = (
    "nvidia-cutlass-dsl",
    "nvidia-cutlass-dsl-libs-base",
    "nvidia-cutlass-dsl-libs-cu12",
    "nvidia-cutlass-dsl-libs-cu13",
    "quack-kernels",
    "humming-kernels",
    "tilelang",
    "z3-solver",
    "tokenspeed-triton",
    "tokenspeed-mla",
    "pynvvideocodec",
    "torchcodec",
    "nvidia-nvvm",
    "nvidia-cuda-nvcc",
    "nvidia-cuda-crt",
    "nvidia-cuda-nvdisasm",
    "nvidia-cuda-cccl",
)


@dataclass
class BundlePlan:
    """What a bundle holds: ``bundled`` is downloaded, ``from_host`` is left to the host,
    ``excluded`` (name -> version) was resolved but left out on purpose (``--exclude``)."""

    requirements: list[str]
    bundled: list[Resolved] = field(default_factory=list)
    from_host: dict[str, str] = field(default_factory=dict)  # name -> host version
    excluded: dict[str, str] = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)  # host_conflicts(), as sentences


def read_have(lines: Iterable[str]) -> dict[str, str | None]:
    """Parse ``pip list --format=freeze`` (or ``pip freeze``) output of the host.

    Returns ``{canonical name: version}``; a line with a bare name maps to None (present,
    version unknown: treated as compatible). Comments, blank lines, ``-e``/``@`` lines are
    skipped. Raises BundleError naming the line for anything else.
    """
    have: dict[str, str | None] = {}
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-") or " @ " in line:
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise BundleError(f"--have line {number}: {raw.strip()!r}: {exc}") from None
        pins = [s.version for s in req.specifier if s.operator in ("==", "===")]
        have[canonicalize_name(req.name)] = pins[0] if pins else None
    return have


def constraints(have: dict[str, str | None], prefer_host: Iterable[str] = ()) -> list[str]:
    """``name==version`` constraint lines for the resolver, except the ``prefer_host`` names
    (resolved freely, yet still taken from the host: see :func:`split_resolution`)."""
    skip = {canonicalize_name(n) for n in prefer_host}
    return [f"{n}=={v}" for n, v in sorted(have.items()) if v and n not in skip]


def parse_report(report: dict[str, Any]) -> list[Resolved]:
    """The packages of a ``pip install --dry-run --report`` document (report version 1), each
    with its ``Requires-Dist`` lines and requested extras (:class:`Resolved`)."""
    out = []
    for item in report.get("install", []):
        meta, info = item["metadata"], item.get("download_info", {})
        hashes = info.get("archive_info", {}).get("hashes", {})
        out.append(
            Resolved(
                name=canonicalize_name(meta["name"]),
                version=meta["version"],
                url=info.get("url", ""),
                sha256=hashes.get("sha256"),
                requires=tuple(meta.get("requires_dist") or ()),
                extras=tuple(item.get("requested_extras") or ()),
            )
        )
    return out


def split_resolution(
    resolved: list[Resolved], have: dict[str, str | None], prefer_host: Iterable[str] = ()
) -> tuple[list[Resolved], dict[str, str]]:
    """Divide a resolution into (to bundle, left to the host as ``{name: host version}``).

    Left to the host: a package the host has at the resolved version, one it has at an
    unknown version (a bare name in ``--have``), and every ``prefer_host`` name it has
    (the operator vouches for it; its version may differ from the resolver's).
    """
    prefer = {canonicalize_name(n) for n in prefer_host}
    bundled, from_host = [], {}
    for pkg in resolved:
        if pkg.name in have:
            host = have[pkg.name]
            if host is None or host == pkg.version or pkg.name in prefer:
                from_host[pkg.name] = host or "present"
                continue
        bundled.append(pkg)
    return bundled, from_host


def _applies(req: Requirement, env: dict[str, str], extras: Iterable[str]) -> bool:
    """Whether ``req``'s marker holds on the host for a package installed with ``extras``;
    a marker that cannot be evaluated (a version compared with a non-version) does not."""
    if req.marker is None:
        return True
    try:
        return any(req.marker.evaluate({**env, "extra": e}) for e in ("", *extras))
    except (UndefinedComparison, UndefinedEnvironmentName):
        return False


def _requirements(pkg: Resolved) -> Iterator[Requirement]:
    for line in pkg.requires:
        try:
            yield Requirement(line)
        except InvalidRequirement:
            continue


def installed_extras(resolved: Iterable[Resolved], target: Target) -> dict[str, set[str]]:
    """Per package, every extra it is installed with: the ones asked for (pip's
    ``requested_extras``) and the ones another installed package's requirement names
    (``uvicorn[standard]`` from ``fastapi[standard]``), followed until nothing is added."""
    env = target.markers()
    by_name = {p.name: p for p in resolved}
    extras = {p.name: {str(canonicalize_name(e)) for e in p.extras} for p in by_name.values()}
    changed = True
    while changed:
        changed = False
        for pkg in by_name.values():
            for req in _requirements(pkg):
                name = canonicalize_name(req.name)
                if name not in extras or not req.extras or not _applies(req, env, extras[pkg.name]):
                    continue
                wanted = {str(canonicalize_name(e)) for e in req.extras} - extras[name]
                if wanted:
                    extras[name] |= wanted
                    changed = True
    return extras


def host_conflicts(
    resolved: Iterable[Resolved],
    bundled: Iterable[Resolved],
    from_host: dict[str, str],
    target: Target,
) -> list[str]:
    """Bundled packages whose own requirement excludes the version left to the host.

    The bundle is installed in front of the host's packages, so such a package meets the
    host's version at import time, where it may refuse it: vLLM 0.26 pins numba 0.65.0, which
    raises ImportError under the host's numpy 2.5 (``--prefer-host numpy``; the twelfth GPU
    run, docs/benchmarks.md section 7). ``resolved``: the whole resolution (for the extras
    each package is installed with, :func:`installed_extras`); ``bundled``: what the bundle
    installs; ``from_host``: name -> the host's version (:func:`split_resolution`).

    Returns one sentence per conflict, naming the bundled package, its requirement and the
    host's version. Skipped: requirements whose markers do not hold on ``target`` (other
    Pythons, platforms, extras not installed), hosts' versions that are unknown (a bare name
    in ``--have``, "present") or not PEP 440. Only this direction is checked: what the host's
    own packages require of a bundled one is not in a freeze list. Raises nothing.
    """
    env = target.markers()
    extras = installed_extras(resolved, target)
    found = []
    for pkg in bundled:
        for req in _requirements(pkg):
            name = canonicalize_name(req.name)
            host = from_host.get(name)
            try:
                if host is None or req.specifier.contains(Version(host), prereleases=True):
                    continue
            except InvalidVersion:
                continue
            if not _applies(req, env, extras.get(pkg.name, ())):
                continue
            found.append(
                f"bundled {pkg.name} {pkg.version} requires {name}{req.specifier}, and the host "
                f"keeps {name} {host}: it may fail to import there"
            )
    return found


#: pip 23.2 (a fresh venv's on Python 3.11) refuses a cross-platform ``--dry-run`` ("requires
#: a different Python: 3.11.7 not in '>=3.12'"); pip 26.3 resolves it.
MIN_PIP = (24, 0)


def check_pip(python: str) -> None:
    """Raise BundleError unless ``python -m pip`` is at least :data:`MIN_PIP`."""
    proc = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, text=True)
    match = re.match(r"pip (\d+)\.(\d+)", proc.stdout)
    if match is None or tuple(map(int, match.groups())) < MIN_PIP:
        found = proc.stdout.split(" from ")[0].strip() or proc.stderr.strip() or "no pip"
        raise BundleError(
            f"{found}: the bundle needs pip >= {MIN_PIP[0]}.{MIN_PIP[1]} to resolve for another "
            f"Python; run: {python} -m pip install -U pip"
        )


def run_pip(python: str, args: Sequence[str], what: str, *, log: LogFn) -> None:
    """Run ``python -m pip ARGS``; raises BundleError with the command and pip's last lines."""
    cmd = [python, "-m", "pip", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("WARNING: Location")]
        tail = "\n  ".join(lines[-12:])
        raise BundleError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n  {tail}")


def resolve(
    requirements: Sequence[str],
    target: Target,
    pins: Sequence[str],
    *,
    python: str = sys.executable,
    log: LogFn = print,
) -> list[Resolved]:
    """pip's resolution of ``requirements`` for ``target`` under the ``pins`` constraints.

    Nothing is installed (``--dry-run`` into an empty ``--target``); wheel metadata comes
    from the index (PEP 658) where it serves it. Raises BundleError when pip cannot resolve,
    e.g. a host version that vLLM does not accept (then name it in ``prefer_host`` or let the
    bundle carry another version by leaving it out of ``--have``).
    """
    with tempfile.TemporaryDirectory(prefix="specgate-bundle-") as tmp:
        report, cons = Path(tmp) / "report.json", Path(tmp) / "constraints.txt"
        cons.write_text("".join(f"{p}\n" for p in pins), encoding="utf-8")
        log(f"resolving {' '.join(requirements)} for Python {target.python_version}")
        args = ["install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report)]
        args += [*target.pip_options(), "--target", str(Path(tmp) / "empty")]
        args += ["-c", str(cons), *requirements]
        try:
            run_pip(python, args, "resolution", log=log)
        except BundleError as exc:
            if pins and "ResolutionImpossible" in str(exc):
                words = {canonicalize_name(w) for w in re.findall(r"[A-Za-z0-9._-]+", str(exc))}
                named = [p for p in pins if canonicalize_name(p.split("==")[0]) in words]
                which = f" ({', '.join(named)} among them)" if named else ""
                raise BundleError(
                    f"{exc}\n  --have pins {len(pins)} host versions{which}: where vLLM does not "
                    "accept the host's version of a package named above, --prefer-host NAME "
                    "keeps the host's anyway, or leaving it out of --have lets the bundle carry "
                    "another"
                ) from None
            raise
        return parse_report(json.loads(report.read_text(encoding="utf-8")))


def download(
    packages: Sequence[Resolved],
    target: Target,
    wheels: Path,
    *,
    python: str = sys.executable,
    log: LogFn = print,
) -> None:
    """``pip download --no-deps`` every package, pinned with ``--require-hashes`` where the
    report gave a hash. Raises BundleError."""
    wheels.mkdir(parents=True, exist_ok=True)
    hashed = all(p.sha256 for p in packages)
    lines = [
        f"{p.name}=={p.version}" + (f" --hash=sha256:{p.sha256}" if hashed else "")
        for p in packages
    ]
    with tempfile.TemporaryDirectory(prefix="specgate-bundle-") as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text("\n".join(lines) + "\n", encoding="utf-8")
        log(f"downloading {len(packages)} wheels into {wheels}")
        args = ["download", "--no-deps", "--quiet", "--progress-bar", "off", "-d", str(wheels)]
        args += [*target.pip_options(), *(["--require-hashes"] if hashed else []), "-r", str(req)]
        run_pip(python, args, "download", log=log)


def build_own_wheel(
    source: Path, wheels: Path, *, python: str = sys.executable, log: LogFn
) -> Path:
    """specgate's own wheel from the checkout at ``source`` (pure Python, any platform)."""
    log(f"building specgate's wheel from {source}")
    before = set(wheels.glob("specgate-*.whl"))
    for old in before:
        old.unlink()
    run_pip(
        python, ["wheel", "--no-deps", "--quiet", "-w", str(wheels), str(source)], "wheel", log=log
    )
    built = sorted(wheels.glob("specgate-*.whl"))
    if not built:
        raise BundleError(f"pip wheel wrote no specgate-*.whl into {wheels}")
    return built[-1]


_SAFE = re.compile(r"^[A-Za-z0-9._+-]+$")


def write_bundle_files(
    out: Path,
    plan: BundlePlan,
    target: Target,
    own_wheel: Path | None,
    model_files: Sequence[Path],
) -> dict[str, Any]:
    """Write ``requirements.txt``, ``manifest.json`` and ``INSTALL.md``; return the manifest.

    Every file under ``out/wheels`` and ``out/downloads`` is listed with size and sha256.
    """
    reqs = [f"{p.name}=={p.version}" for p in sorted(plan.bundled, key=lambda p: p.name)]
    if own_wheel is not None:
        reqs.append(f"specgate @ file:./wheels/{own_wheel.name}")
    (out / "requirements.txt").write_text("\n".join(reqs) + "\n", encoding="utf-8")
    files: list[dict[str, Any]] = []
    for folder in ("wheels", "downloads"):
        for path in sorted((out / folder).glob("*")):
            if path.is_file() and _SAFE.match(path.name):
                files.append(
                    {
                        "path": f"{folder}/{path.name}",
                        "bytes": path.stat().st_size,
                        "sha256": sha256_file(path),
                    }
                )
    manifest = {
        "format": FORMAT_VERSION,
        "target": {"python": target.python_version, "platforms": target.platforms()},
        "requirements": plan.requirements,
        "bundled": {p.name: p.version for p in plan.bundled},
        "from_host": plan.from_host,
        "excluded": plan.excluded,
        "host_conflicts": plan.conflicts,
        "models": [p.name for p in model_files],
        "files": files,
        "bytes": sum(f["bytes"] for f in files),
    }
    tmp = out / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    tmp.replace(out / MANIFEST)
    (out / "INSTALL.md").write_text(install_text(target, plan, model_files), encoding="utf-8")
    return manifest


def install_text(target: Target, plan: BundlePlan, model_files: Sequence[Path]) -> str:
    """The operator's install steps for the bundle (Markdown)."""
    no_deps = "--no-deps " if plan.excluded else ""
    excluded = (
        f"\nLeft out on purpose (`--exclude`): {', '.join(sorted(plan.excluded))}; so the install\n"
        "skips pip's dependency check (`--no-deps`) and `pip check` names them as missing.\n"
        if plan.excluded
        else ""
    )
    conflicts = "".join(f"- {line}\n" for line in plan.conflicts)
    if conflicts:
        conflicts = (
            "\nBundled packages that meet a host version their requirements exclude (check them"
            f" first):\n{conflicts}"
        )
    notes = excluded + conflicts
    models = (
        "\n# the local models' sources: prepare builds the model folders from them offline\n"
        'mkdir -p "$SPECGATE_CACHE_DIR/downloads"\n'
        'cp downloads/* "$SPECGATE_CACHE_DIR/downloads/"\n'
        "SPECGATE_VLLM_PYTHON=$VENV/bin/python $VENV/bin/specgate models prepare\n"
        if model_files
        else ""
    )
    return f"""# Installing this bundle offline

Made for CPython {target.python_version} on {target.platforms()[0]} (or newer glibc), beside
{len(plan.from_host)} packages the host already has (`manifest.json`: `from_host`).{notes}
In this folder:

```bash
VENV=/opt/specgate   # any path
export SPECGATE_CACHE_DIR=/var/cache/specgate
python3 -m venv --system-site-packages "$VENV"   # the host's torch, transformers, ... stay visible
"$VENV/bin/pip" install --no-index {no_deps}--find-links wheels -r requirements.txt
"$VENV/bin/pip" check || true   # lists any host package whose version a bundled one dislikes
{models}SPECGATE_VLLM_PYTHON=$VENV/bin/python $VENV/bin/specgate up --config CONFIG.yaml
```

Where `python3` is itself a virtual environment (its torch is then invisible to a venv made
from it), install with `pip install --no-index --no-deps --target DIR ...` instead and export
`PYTHONPATH=DIR` with `SPECGATE_VLLM_PYTHON=$(command -v python3)`: `scripts/gpu/stack.sh`
does this on the H200 host.

`SPECGATE_VLLM_PYTHON` makes `specgate up` and `specgate models prepare` use this
interpreter for vLLM instead of building their own CPU virtual environment.
Check the files first: `sha256sum` against `manifest.json`'s `files`.
"""


def check_output(out: Path) -> None:
    """Create ``out/wheels``; BundleError naming ``-o`` when that cannot be done (a file, a
    read-only place), before anything is resolved or downloaded."""
    try:
        (out / "wheels").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BundleError(f"-o {out}: cannot write there: {exc}") from None


def make_bundle(
    out: Path,
    *,
    requirements: Sequence[str],
    target: Target,
    have: dict[str, str | None],
    prefer_host: Sequence[str] = (),
    exclude: Sequence[str] = (),
    source: Path | None = None,
    model_files: Sequence[Path] = (),
    python: str = sys.executable,
    log: LogFn = print,
) -> dict[str, Any]:
    """Resolve, download and describe a bundle in ``out``; return its manifest.

    ``source`` is a specgate checkout whose wheel joins the bundle (None: leave it out);
    ``model_files`` are copied to ``out/downloads``; ``exclude`` names resolved packages to
    leave out (e.g. :data:`UNUSED_ON_DENSE`). An earlier bundle in ``out`` is reused:
    wheels already there are not fetched again (pip skips them), stale ones are removed.
    Raises BundleError.
    """
    target.check()
    check_output(out)
    check_pip(python)
    missing_host = [n for n in prefer_host if canonicalize_name(n) not in have]
    if missing_host:
        raise BundleError(f"--prefer-host {', '.join(missing_host)}: not in --have")
    if not have:
        log("warning: --have lists no host packages: everything is bundled, torch included")
    resolved = resolve(requirements, target, constraints(have, prefer_host), python=python, log=log)
    bundled, from_host = split_resolution(resolved, have, prefer_host)
    drop = {canonicalize_name(n) for n in exclude}
    excluded = {p.name: p.version for p in bundled if p.name in drop}
    bundled = [p for p in bundled if p.name not in drop]
    conflicts = host_conflicts(resolved, bundled, from_host, target)
    for line in conflicts:
        log(f"warning: {line}")
    plan = BundlePlan(list(requirements), bundled, from_host, excluded, conflicts)
    wheels, downloads = out / "wheels", out / "downloads"
    download(bundled, target, wheels, python=python, log=log)
    wanted = {(p.name, p.version) for p in bundled}
    for whl in wheels.glob("*.whl"):
        name, version = whl.name.split("-")[:2]
        if (canonicalize_name(name), version) not in wanted and not whl.name.startswith(
            "specgate-"
        ):
            whl.unlink()
    own = build_own_wheel(source, wheels, python=python, log=log) if source else None
    downloads.mkdir(parents=True, exist_ok=True)
    for path in model_files:
        if not (downloads / path.name).is_file():
            shutil.copy2(path, downloads / path.name)
    manifest = write_bundle_files(out, plan, target, own, model_files)
    log(
        f"bundle in {out}: {len(bundled)} wheels to install, {len(from_host)} packages left "
        f"to the host, {manifest['bytes'] / 2**20:.0f} MiB"
    )
    return manifest
