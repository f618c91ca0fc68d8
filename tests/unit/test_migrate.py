"""2024-style vLLM commands -> the --speculative-config form and a backend profile."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest
import yaml

from backends.migrate import DROPPED, SPEC_FLAGS, MigrationError, migrate, profile_yaml
from cli.main import main
from contracts.launch_profile import build_argv
from tests.fakes.vllm_python import VLLM_PYTHON, run_in_vllm

API = "python -m vllm.entrypoints.openai.api_server"
LEGACY = tuple(SPEC_FLAGS) + tuple(DROPPED)

#: (old command, new command, profile, action per old flag, warnings)
CASES: list[tuple[str, str, dict[str, Any], list[tuple[str, str]], int]] = [
    (
        f"{API} --model meta-llama/Llama-3.1-8B-Instruct --speculative-model "
        "meta-llama/Llama-3.2-1B-Instruct --num-speculative-tokens 5 --use-v2-block-manager "
        "--gpu-memory-utilization 0.9",
        f"{API} --model meta-llama/Llama-3.1-8B-Instruct --speculative-config "
        """'{"method":"draft_model","model":"meta-llama/Llama-3.2-1B-Instruct",\
"num_speculative_tokens":5}' --gpu-memory-utilization 0.9""",
        {
            "speculation": {
                "method": "draft_model",
                "num_speculative_tokens": 5,
                "model": "meta-llama/Llama-3.2-1B-Instruct",
            },
            "gpu_memory_utilization": 0.9,
        },
        [
            ("--model", "kept"),
            ("--speculative-model", "migrated"),
            ("--num-speculative-tokens", "migrated"),
            ("--use-v2-block-manager", "dropped"),
            ("--gpu-memory-utilization", "kept"),
        ],
        0,
    ),
    (
        f'{API} --model meta-llama/Llama-3.1-70B-Instruct --speculative-model "[ngram]" '
        "--num-speculative-tokens 5 --ngram-prompt-lookup-max 4 --use-v2-block-manager",
        f"{API} --model meta-llama/Llama-3.1-70B-Instruct --speculative-config "
        """'{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4}'""",
        {"speculation": {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}},
        [
            ("--model", "kept"),
            ("--speculative-model", "migrated"),
            ("--num-speculative-tokens", "migrated"),
            ("--ngram-prompt-lookup-max", "migrated"),
            ("--use-v2-block-manager", "dropped"),
        ],
        0,
    ),
    (
        f"{API} --model meta-llama/Llama-3.1-8B-Instruct --speculative-model "
        "yuhuili/EAGLE-LLaMA3-Instruct-8B --speculative-draft-tensor-parallel-size 1 "
        "--num-speculative-tokens 4",
        f"{API} --model meta-llama/Llama-3.1-8B-Instruct --speculative-config "
        """'{"method":"eagle","draft_tensor_parallel_size":1,\
"model":"yuhuili/EAGLE-LLaMA3-Instruct-8B","num_speculative_tokens":4}'""",
        {
            "speculation": {
                "method": "eagle",
                "num_speculative_tokens": 4,
                "model": "yuhuili/EAGLE-LLaMA3-Instruct-8B",
                "draft_tensor_parallel_size": 1,
            }
        },
        [
            ("--model", "kept"),
            ("--speculative-model", "migrated"),
            ("--speculative-draft-tensor-parallel-size", "migrated"),
            ("--num-speculative-tokens", "migrated"),
        ],
        0,
    ),
    (
        f"{API} --model meta-llama/Llama-3.1-70B-Instruct --tensor-parallel-size 2 "
        "--speculative-model meta-llama/Llama-3.1-8B-Instruct "
        "--speculative-draft-tensor-parallel-size 1 --num-speculative-tokens 4 "
        "--use-v2-block-manager",
        f"{API} --model meta-llama/Llama-3.1-70B-Instruct --tensor-parallel-size 2 "
        """--speculative-config '{"method":"draft_model","draft_tensor_parallel_size":1,\
"model":"meta-llama/Llama-3.1-8B-Instruct","num_speculative_tokens":4}'""",
        {
            "speculation": {
                "method": "draft_model",
                "num_speculative_tokens": 4,
                "model": "meta-llama/Llama-3.1-8B-Instruct",
                "draft_tensor_parallel_size": 1,
            },
            "tensor_parallel_size": 2,
        },
        [
            ("--model", "kept"),
            ("--tensor-parallel-size", "kept"),
            ("--speculative-model", "migrated"),
            ("--speculative-draft-tensor-parallel-size", "migrated"),
            ("--num-speculative-tokens", "migrated"),
            ("--use-v2-block-manager", "dropped"),
        ],
        0,
    ),
    (
        f"{API} --model meta-llama/Llama-3.1-8B-Instruct --speculative-model "
        "meta-llama/Llama-3.2-1B-Instruct --speculative-model-quantization int8 "
        "--num-speculative-tokens 5",
        f"{API} --model meta-llama/Llama-3.1-8B-Instruct --speculative-config "
        """'{"method":"draft_model","model":"meta-llama/Llama-3.2-1B-Instruct",\
"num_speculative_tokens":5,"quantization":"int8"}'""",
        {
            "speculation": {
                "method": "draft_model",
                "num_speculative_tokens": 5,
                "model": "meta-llama/Llama-3.2-1B-Instruct",
                "quantization": "int8",
            }
        },
        [
            ("--model", "kept"),
            ("--speculative-model", "migrated"),
            ("--speculative-model-quantization", "migrated"),
            ("--num-speculative-tokens", "migrated"),
        ],
        1,  # int8 is not a quantization method current vLLM knows
    ),
]


@pytest.mark.parametrize(
    ("old", "new", "fields", "actions", "warnings"),
    CASES,
    ids=["draft-1b", "ngram-70b", "eagle-8b", "draft-70b-tp2", "draft-int8"],
)
def test_real_2024_commands(
    old: str, new: str, fields: dict[str, Any], actions: list[tuple[str, str]], warnings: int
) -> None:
    result = migrate(old)
    assert shlex.join(result.argv) == new
    assert not any(a.split("=")[0] in LEGACY for a in result.argv)
    model = shlex.split(old)[4]
    assert yaml.safe_load(profile_yaml(result.profile)) == {
        "model": model,
        "served_model_name": model,
        "host": "0.0.0.0",
        "port": 8000,
        **fields,
    }
    assert [(c.flag, c.action) for c in result.changes] == actions
    assert len(result.warnings) == warnings
    # The profile renders the same speculative config as the migrated command.
    argv = build_argv(result.profile)
    spec_arg = result.argv[result.argv.index("--speculative-config") + 1]
    assert argv[argv.index("--speculative-config") + 1] == spec_arg


def test_vllm_serve_form_underscores_equals_and_unknown_flags() -> None:
    old = (
        "vllm serve facebook/opt-6.7b --seed 42 -tp 1 --speculative_model=facebook/opt-125m "
        "--use-v2-block-manager --num_speculative_tokens 5 --enforce-eager "
        "--spec-decoding-acceptance-method typical_acceptance_sampler"
    )
    result = migrate(old)
    assert result.argv == [
        *["vllm", "serve", "facebook/opt-6.7b", "--seed", "42", "-tp", "1"],
        "--speculative-config",
        '{"method":"draft_model","model":"facebook/opt-125m","num_speculative_tokens":5}',
        "--enforce-eager",
    ]
    assert result.profile.extra_args == ["--seed", "42", "--enforce-eager"]
    assert result.profile.tensor_parallel_size == 1
    assert [str(c) for c in result.changes if c.action in ("passed", "dropped")] == [
        "passed   --seed 42: not a speculative flag: kept as is (profile extra_args)",
        "dropped  --use-v2-block-manager: block manager v2 is the only one since vLLM 0.6.2",
        "passed   --enforce-eager: not a speculative flag: kept as is (profile extra_args)",
        "dropped  --spec-decoding-acceptance-method typical_acceptance_sampler: current vLLM "
        "uses rejection sampling only",
    ]


def test_eagle3_detected_by_name_and_no_speculation() -> None:
    spec = migrate(
        f"{API} --model m --speculative-model yuhuili/EAGLE3-LLaMA3.1-Instruct-8B "
        "--num-speculative-tokens 3 --port 9000 --served-model-name s"
    )
    assert spec.profile.speculation.method == "eagle3"
    assert (spec.profile.port, spec.profile.served_model_name) == (9000, "s")
    plain = migrate(["vllm", "serve", "m", "--use-v2-block-manager"])
    assert plain.argv == ["vllm", "serve", "m"]
    assert not plain.profile.speculation.speculative


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("python train.py --model m", "not a vLLM server command"),
        (f"{API} --port 8000", "names no model"),
        (f"{API} --model m --num-speculative-tokens 5", "without --speculative-model"),
        (f"{API} --model m --speculative-model d", "needs num_speculative_tokens"),
        (f"{API} --model m --speculative-model d --num-speculative-tokens x", "invalid value"),
        (f"{API} --model m --speculative-model", "needs a value"),
        (f"{API} --model m --port 0", "invalid server settings"),
    ],
)
def test_errors(command: str, message: str) -> None:
    with pytest.raises(MigrationError, match=message):
        migrate(command)


def test_cli_prints_command_profile_and_changes(capsys: pytest.CaptureFixture[str]) -> None:
    old = shlex.split(CASES[0][0])
    assert main(["backends", "migrate", "--", *old]) == 0
    out = capsys.readouterr().out
    command = out.split("\n")[1]
    assert command == CASES[0][1]
    assert "served_model_name: meta-llama/Llama-3.1-8B-Instruct" in out
    assert "# dropped  --use-v2-block-manager: block manager v2" in out
    assert main(["backends", "migrate", CASES[4][0]]) == 0  # one quoted string works too
    assert "# warning: draft quantization 'int8'" in capsys.readouterr().out
    assert main(["backends", "migrate", "--", "ls", "-l"]) == 1
    assert "not a vLLM server command" in capsys.readouterr().err


#: Parses each argv with vLLM's own OpenAI-server parser; prints speculative_config as JSON.
PARSE_WITH_VLLM = """
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.launchers.cli_args import make_arg_parser
out = []
for argv in json.loads(sys.argv[1]):
    parser = make_arg_parser(FlexibleArgumentParser())
    try:
        out.append(parser.parse_args(argv).speculative_config)
    except SystemExit as exc:
        out.append(f"exit {exc.code}")
print(json.dumps(out))
"""


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="vLLM environment not prepared")
def test_migrated_commands_parse_with_real_vllm() -> None:
    """vLLM's real parser (no server started) accepts every migrated argv, rejects the old."""
    migrated = [migrate(old).argv[3:] for old, *_ in CASES]
    old = shlex.split(CASES[0][0])[3:]
    parsed = run_in_vllm(PARSE_WITH_VLLM, [*migrated, old], timeout_s=180)
    expected = [json.loads(argv[argv.index("--speculative-config") + 1]) for argv in migrated]
    assert parsed[:-1] == expected
    assert parsed[-1] == "exit 2"  # --speculative-model is gone from current vLLM
