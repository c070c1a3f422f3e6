"""``${NAME}`` and ``${NAME:-default}`` in cluster files (pytest_kimi/config/variables.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pytest_kimi.config import ConfigError, load_cluster
from tests.unit.clusterfile import BASE, L_NODE_N2, L_SERVER, edit, write

MODEL = "  model_path: /models/m\n"
L_MODEL = L_SERVER + 1


def _load(tmp_path: Path, text: str, **environ: str):
    return load_cluster(write(tmp_path, text), environ=environ)


def _error(tmp_path: Path, text: str, **environ: str) -> tuple[Path, str]:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_cluster(path, environ=environ)
    return path, str(info.value)


def test_a_set_variable_is_expanded_inside_text(tmp_path: Path) -> None:
    text = edit(MODEL, "  model_path: ${MODELS}/kimi-k3\n")
    cluster = _load(tmp_path, text, MODELS="/data/models")
    assert cluster.server.model_path == "/data/models/kimi-k3"
    assert cluster.variables == {"MODELS": "/data/models"}


def test_the_default_stands_in_for_an_unset_variable(tmp_path: Path) -> None:
    text = edit(MODEL, "  python: ${VENV:-.venv-sglang-0.5.23}/bin/python\n" + MODEL)
    cluster = _load(tmp_path, text)
    assert cluster.server.python == ".venv-sglang-0.5.23/bin/python"
    assert cluster.variables == {"VENV": ".venv-sglang-0.5.23"}
    # set, the variable wins over the default, even when it is empty
    assert _load(tmp_path, text, VENV="/opt/v").server.python == "/opt/v/bin/python"
    assert _load(tmp_path, text, VENV="").server.python == "/bin/python"


def test_a_whole_reference_is_read_as_yaml_reads_a_value(tmp_path: Path) -> None:
    # quoted, as a flow mapping needs: still a number once expanded
    text = BASE
    for node in ("n1", "n2"):
        text = edit(f"{{name: {node}, host: 127.0.0.1, gpus: 8}}",
                    f"{{name: {node}, host: '${{HOST}}', gpus: '${{GPUS:-8}}'}}",
                    text)  # fmt: skip
    cluster = _load(tmp_path, text, HOST="10.0.0.2")
    assert [n.gpus for n in cluster.nodes[:2]] == [8, 8]  # numbers, so the checks pass
    assert cluster.nodes[1].host == "10.0.0.2"


def test_references_in_lists_and_flags(tmp_path: Path) -> None:
    flags = "    chunked-prefill-size: ${CP}\n    served-model-name: kimi-${TAG}\n"
    text = edit("    chunked-prefill-size: 8192\n", flags)
    cluster = _load(tmp_path, text, CP="4096", TAG="k3")
    # a flag's value is text: the reference stays what it was (4096 on the command line)
    assert cluster.server.args["chunked-prefill-size"] == "4096"
    assert cluster.server.args["served-model-name"] == "kimi-k3"


def test_double_dollar_is_a_literal(tmp_path: Path) -> None:
    text = edit(MODEL, "  model_path: /models/$${NOT_A_VARIABLE}\n")
    cluster = _load(tmp_path, text)
    assert cluster.server.model_path == "/models/${NOT_A_VARIABLE}"
    assert cluster.variables == {}


def test_an_unset_variable_without_default_names_file_line_field_and_variable(
    tmp_path: Path,
) -> None:
    text = edit(MODEL, "  model_path: ${KIMI_MODELS}/m\n")
    path, message = _error(tmp_path, text)
    assert message.startswith(f"{path}:{L_MODEL}: field 'server.model_path': ")
    assert "${KIMI_MODELS} is not set" in message
    assert "${KIMI_MODELS:-VALUE}" in message


def test_an_unset_variable_in_a_list_names_its_item(tmp_path: Path) -> None:
    text = edit("{name: n2, host: 127.0.0.1, gpus: 8}", "{name: n2, host: '${N2_HOST}', gpus: 8}")
    path, message = _error(tmp_path, text)
    assert message.startswith(f"{path}:{L_NODE_N2}: field 'nodes[1].host': ")
    assert "${N2_HOST}" in message


def test_a_malformed_reference_is_refused(tmp_path: Path) -> None:
    path, message = _error(tmp_path, edit(MODEL, "  model_path: /m/${1BAD}\n"))
    assert message.startswith(f"{path}:{L_MODEL}: field 'server.model_path': ")
    assert "'${1BAD}' is not a variable reference" in message


def test_a_secret_looking_variable_is_refused_without_showing_its_value(tmp_path: Path) -> None:
    text = edit(MODEL, MODEL + "  env: {HF_TOKEN: '${HF_TOKEN}'}\n")
    _, message = _error(tmp_path, text, HF_TOKEN="hf_very_secret_value")
    assert "looks like a secret" in message and "env_from_local: [HF_TOKEN]" in message
    assert "hf_very_secret_value" not in message


def test_the_cpu_sglang_cluster_takes_its_venv_from_the_environment() -> None:
    path = Path(__file__).resolve().parents[2] / "clusters" / "cpu-sglang.yaml"
    default = load_cluster(path, environ={})
    assert default.server.python == ".venv-sglang-0.5.23/bin/python"
    assert default.variables == {"KIMI_SGLANG_VENV": ".venv-sglang-0.5.23",
                                 "KIMI_ROUTER_PYTHON": "current"}  # fmt: skip
    assert default.router.python == sys.executable  # the project's smg
    chosen = load_cluster(path, environ={"KIMI_SGLANG_VENV": "/opt/sglang-0.5.9"})
    assert chosen.server.python == "/opt/sglang-0.5.9/bin/python"
    tp2 = chosen.layout("tp2")
    assert (tp2.tp, chosen.nodes_per_replica_of(tp2), chosen.replicas_of(tp2)) == (2, 2, 2)


@pytest.mark.parametrize("name", ["TOKENIZER_PATH", "MAX_TOTAL_TOKENS", "PRIVATE_REGISTRY",
                                  "KEYRING_DIR"])  # fmt: skip
def test_names_that_only_contain_secret_letters_are_not_refused(tmp_path: Path, name) -> None:
    cluster = _load(tmp_path, edit(MODEL, f"  model_path: ${{{name}}}\n"), **{name: "/m"})
    assert cluster.server.model_path == "/m"


@pytest.mark.parametrize("name", ["HF_TOKEN", "DB_PASSWORD", "OPENAI_API_KEY",
                                  "AWS_SECRET_ACCESS_KEY", "SSH_PRIVATE_KEY"])  # fmt: skip
def test_secret_names_are_refused(tmp_path: Path, name) -> None:
    _, message = _error(tmp_path, edit(MODEL, f"  model_path: ${{{name}}}\n"), **{name: "v"})
    assert "looks like a secret" in message


def test_a_text_field_keeps_the_text_as_it_was(tmp_path: Path) -> None:
    flags = "    revision: '${R}'\n    x: '${V}'\n"
    text = edit("    chunked-prefill-size: 8192\n", flags)
    text = edit(MODEL, MODEL + "  env: {E: '${V}'}\n", text)
    cluster = _load(tmp_path, text, R="0123", V="1.10")
    assert cluster.server.args == {"revision": "0123", "x": "1.10"}
    assert cluster.server.env == {"E": "1.10"}


def test_a_number_field_reads_a_decimal_number_and_names_anything_else(tmp_path: Path) -> None:
    text = edit("{name: n1, host: 127.0.0.1, gpus: 8}", "{name: n1, host: 127.0.0.1, gpus: '${G}'}")
    path, message = _error(tmp_path, text, G="010")  # not 8 (octal), not 10: a leading zero
    assert message.startswith(f"{path}:4: field 'nodes[0].gpus': ") and "'010'" in message
    text = edit("  replicas: 2\n", "  replicas: ${R}\n")
    assert _load(tmp_path, text, R="2").replicas == 2


def test_a_port_takes_a_number_or_its_word(tmp_path: Path) -> None:
    text = edit("  node: n1\n", "  node: n1\n  port: ${P}\n")
    assert _load(tmp_path, text, P="31000").router.port == 31000
    assert _load(tmp_path, text, P="auto").router.port is None


@pytest.mark.parametrize("value", ["/m/${A", "/m/${A:-${B}}", "${A:-x}${"])
def test_references_that_are_not_are_refused(tmp_path: Path, value: str) -> None:
    path, message = _error(tmp_path, edit(MODEL, f"  model_path: '{value}'\n"), A="a")
    assert message.startswith(f"{path}:{L_MODEL}: field 'server.model_path': ")
