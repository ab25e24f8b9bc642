"""Vendor seams: each pinned to the versions it was verified on, each failing with a clear message
on any other version (docs/ARCHITECTURE.md, "Vendor seams")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cliptrack.adapters import _compat
from cliptrack.adapters._compat import UnsupportedVersionError, parse_version
from cliptrack.adapters._compat import megatron as megatron_compat
from cliptrack.adapters._compat import tinker as tinker_compat

REPO = Path(__file__).resolve().parents[1]


def test_versions_parse_from_release_strings():
    assert parse_version("0.38.0") == (0, 38, 0)
    assert parse_version("0.16.1rc2") == (0, 16, 1)
    assert parse_version("v1.2") == (1, 2)
    with pytest.raises(ValueError, match="cannot read a version number from 'dev'"):
        parse_version("dev")


def test_the_bounds_are_checked_at_both_ends():
    _compat.check_version("pkg", "0.38.0", (0, 38), (0, 39), "x")
    _compat.check_version("pkg", "0.38.9", (0, 38), (0, 39), "x")
    for found in ("0.37.9", "0.39.0", "1.0", "nightly"):
        with pytest.raises(UnsupportedVersionError, match=f"pkg {found} is not supported"):
            _compat.check_version("pkg", found, (0, 38), (0, 39), "x")


# ---- tinker -------------------------------------------------------------------------------------


def test_installed_tinker_is_a_supported_version():
    """Pinned: upgrading tinker past the verified range fails here first."""
    tinker_compat.check_supported()
    assert (
        tinker_compat.MINIMUM
        <= parse_version(tinker_compat.installed_version())
        < tinker_compat.SUPPORTED_BELOW
    )


def test_tinker_seam_refuses_an_unsupported_version_by_name(monkeypatch):
    monkeypatch.setattr(tinker_compat, "installed_version", lambda: "0.41.2")
    message = (
        r"tinker 0\.41\.2 is not supported by cliptrack \(supported: tinker>=0\.38,<0\.39\); cliptrack relies on "
        r"tinker\.types\._pydantic_types\.tensor_data\.TensorData and tinker\.proto\.tinker_public_pb2"
    )
    with pytest.raises(UnsupportedVersionError, match=message):
        tinker_compat.tensor_data_model()
    with pytest.raises(UnsupportedVersionError, match=message):
        tinker_compat.proto_module()
    # the wire code reaches the private API only through the seam
    from cliptrack.adapters.miles import output_from_json, output_to_proto

    payload = {
        "loss_fn_outputs": [{"loss_tokens": {"data": [3], "dtype": "int64", "shape": [1]}}],
        "metrics": {},
    }
    with pytest.raises(UnsupportedVersionError, match=message):
        output_from_json(payload)
    with pytest.raises(UnsupportedVersionError, match=message):
        output_to_proto(payload)


def test_no_module_but_the_seam_touches_tinkers_private_api():
    offenders = []
    for path in (REPO / "adapters").rglob("*.py"):
        if path.parent.name == "_compat":
            continue
        text = path.read_text()
        if "_pydantic_types" in text or "tinker_public_pb2 as" in text or "from tinker.proto" in text:
            offenders.append(str(path.relative_to(REPO)))
    assert offenders == []


# ---- megatron-core --------------------------------------------------------------------------------


def test_installed_megatron_core_is_a_supported_version():
    """Pinned: upgrading megatron-core past the verified range fails here first."""
    pytest.importorskip("megatron.core")
    megatron_compat.check_supported()
    found = megatron_compat.installed_version()
    assert found is not None
    assert megatron_compat.MINIMUM <= parse_version(found) < megatron_compat.SUPPORTED_BELOW


def test_megatron_seam_refuses_an_unsupported_version_by_name(monkeypatch):
    pytest.importorskip("megatron.core")
    monkeypatch.setattr(megatron_compat, "installed_version", lambda: "0.18.0")
    message = (
        r"megatron-core 0\.18\.0 is not supported by cliptrack \(supported: megatron-core>=0\.16\.1,<0\.17\); "
        r"cliptrack relies on parallel_state"
    )
    with pytest.raises(UnsupportedVersionError, match=message):
        megatron_compat.parallel_state()
    # reduce_losses looks up its groups through the seam
    import torch
    from cliptrack.adapters import megatron as mg

    lp = torch.zeros(3)
    report = mg.make_loss_func("ppo", {"sampling_logprobs": lp, "advantages": torch.ones(3)})(lp)[2]
    with pytest.raises(UnsupportedVersionError, match=message):
        mg.reduce_losses([report])


def test_megatron_seam_without_megatron_core_is_silent():
    code = (
        "import sys; sys.modules['megatron'] = None; sys.modules['megatron.core'] = None\n"
        "from cliptrack.adapters._compat import megatron as m\n"
        "assert m.parallel_state() is None\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]
