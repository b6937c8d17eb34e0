"""The public surface: every advertised name resolves, and `import ddpguard` stays light."""

import subprocess
import sys

import pytest

import ddpguard


@pytest.mark.parametrize("name", [n for n in ddpguard.__all__ if n != "__version__"])
def test_public_name_resolves(name):
    assert getattr(ddpguard, name) is not None


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        ddpguard.nope  # noqa: B018


def test_import_does_not_load_torch():
    code = "import sys, ddpguard; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", out.stderr
