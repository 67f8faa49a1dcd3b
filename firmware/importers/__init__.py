"""Model importers: a model file to a :class:`firmware.graph.Graph`.

:func:`load_model` picks the importer by the file's contents (a TFLite flatbuffer carries the
identifier ``TFL3``) or its suffix. Every importer refuses what it cannot translate exactly
before doing any work, with a :class:`ModelError` naming the node, its operator and what is
supported.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["ModelError", "load_model", "FORMATS"]

#: File suffixes and the importer module that reads them.
FORMATS = {".tflite": "tflite", ".onnx": "onnx"}


class ModelError(ValueError):
    """The model cannot be imported: the message names the node, the operator and what is
    supported (or what is wrong with the file)."""


def load_model(path, **options):
    """The :class:`firmware.graph.Graph` of the model at ``path`` (``.tflite``, ``.onnx``)."""
    import importlib

    path = Path(path)
    try:
        head = path.read_bytes()[:8]
    except OSError as error:
        raise ModelError(f"{path}: cannot read the model file ({error.strerror})") from None
    kind = "tflite" if head[4:8] == b"TFL3" else FORMATS.get(path.suffix.lower())
    if kind is None:
        raise ModelError(f"{path}: not a model file this project reads; allowed: TFLite "
                         f"flatbuffers (.tflite) and ONNX models (.onnx)")
    module = importlib.import_module(f"firmware.importers.{kind}")
    return module.load(path, **options)
