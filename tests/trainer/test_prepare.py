"""Preparing the default model (workers/trainer/prepare.py): reused when built, a clear error and nothing
half-written when a step fails. The conversion itself runs in tests/model/test_real_model.py's fixture."""

import importlib.metadata
import json

import pytest

from workers import base_models
from workers.trainer import prepare


def _complete(folder, **marker):
    folder.mkdir(parents=True)
    (folder / base_models.MARKER_FILE).write_text(json.dumps(
        {"model": base_models.DEFAULT.key, "format": prepare.FORMAT, "gguf_sha256": prepare.GGUF_SHA256,
         "rope": base_models.DEFAULT.rope, **marker}))


def test_a_built_folder_is_reused_without_reading_the_package(tmp_path, monkeypatch):
    _complete(tmp_path / base_models.DEFAULT.key)
    monkeypatch.setattr(prepare, "locate_gguf", lambda: pytest.fail("the package was read again"))
    assert prepare.prepare_default_model(cache_dir=tmp_path, say=print) == tmp_path / base_models.DEFAULT.key
    assert base_models.describe(tmp_path / base_models.DEFAULT.key) is base_models.SMOLLM2


def test_a_missing_package_says_how_to_install_it(tmp_path, monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "files", missing)
    with pytest.raises(prepare.PrepareError, match="requirements/model.txt"):
        prepare.prepare_default_model(cache_dir=tmp_path, say=print)
    assert list(tmp_path.iterdir()) == []


def _fake_gguf(tmp_path, monkeypatch, content: bytes):
    gguf = tmp_path / "pkg" / prepare.GGUF_NAME
    gguf.parent.mkdir()
    gguf.write_bytes(content)
    monkeypatch.setattr(prepare, "locate_gguf", lambda: gguf)
    return gguf


def test_a_file_with_another_checksum_is_refused(tmp_path, monkeypatch):
    _fake_gguf(tmp_path, monkeypatch, b"not the model")
    cache = tmp_path / "cache"
    with pytest.raises(prepare.PrepareError, match="SHA-256"):
        prepare.prepare_default_model(cache_dir=cache, say=print)
    assert not cache.exists() or list(cache.iterdir()) == []


def _writes_marker(gguf, out, spec):
    """A stand-in conversion: only the marker a finished one writes."""
    (out / base_models.MARKER_FILE).write_text(json.dumps(
        {"model": spec.key, "format": prepare.FORMAT, "gguf_sha256": prepare.GGUF_SHA256, "rope": spec.rope}))


def test_a_failed_conversion_leaves_nothing_behind_and_an_older_format_is_rebuilt(tmp_path, monkeypatch):
    content = b"stand-in weights"
    _fake_gguf(tmp_path, monkeypatch, content)
    monkeypatch.setattr(prepare, "GGUF_SHA256", prepare.sha256_of(tmp_path / "pkg" / prepare.GGUF_NAME))
    cache = tmp_path / "cache"
    _complete(cache / base_models.DEFAULT.key, format=prepare.FORMAT - 1)

    def broken(gguf, out, spec):
        (out / "model.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(prepare, "convert", broken)
    with pytest.raises(prepare.PrepareError, match="disk full"):
        prepare.prepare_default_model(cache_dir=cache, say=print)
    assert list(cache.iterdir()) == []

    monkeypatch.setattr(prepare, "convert", _writes_marker)
    lines = []
    folder = prepare.prepare_default_model(cache_dir=cache, say=lines.append)
    assert list(cache.iterdir()) == [folder] and folder.name == base_models.DEFAULT.key
    assert lines[0].startswith("Preparing smollm2-135m-instruct") and lines[-1].startswith("Prepared")


@pytest.mark.parametrize("rope", [None, {**base_models.DEFAULT.rope, "factor": 4.0}])
def test_a_folder_prepared_with_another_rope_is_prepared_again(tmp_path, monkeypatch, rope):
    """The rope is in the folder's config, so a folder written before the description's rope changed (or
    before the marker recorded it) would serve other positions than the trainer computes."""
    content = b"stand-in weights"
    _fake_gguf(tmp_path, monkeypatch, content)
    monkeypatch.setattr(prepare, "GGUF_SHA256", prepare.sha256_of(tmp_path / "pkg" / prepare.GGUF_NAME))
    cache = tmp_path / "cache"
    _complete(cache / base_models.DEFAULT.key, rope=rope)
    converted = []
    monkeypatch.setattr(prepare, "convert", lambda gguf, out, spec: converted.append(spec) or _writes_marker(
        gguf, out, spec))
    prepare.prepare_default_model(cache_dir=cache, say=print)
    assert converted == [base_models.DEFAULT]
