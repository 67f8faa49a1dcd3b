"""bench/models.py: its MobileNet-style graph runs on the ISA simulator exactly as its integer
reference, and its link counts agree with firmware.linkrate's own count of the same batch
programs (an independent count: the compiled network's batches, their answers from a device
of their own). Fast: the ISA simulator only."""

from __future__ import annotations

import json

import numpy as np

from bench import models
from firmware.compiler import compile_network
from firmware.graph import AveragePool2D, Conv2D
from firmware.linkrate import board_for, link_rate
from firmware.runtime.graph import run_graph
from firmware.transports.isa import IsaSimDevice
from hdl.isa import Func
from hdl.presets import get_config


def test_mobilenet_style_runs_as_its_reference():
    graph, inputs = models.mobilenet_style(seed=0, images=3)
    convs = [op for op in graph.ops if isinstance(op, Conv2D)]
    # What the graph is for: TFLite's asymmetric SAME padding with a stride, depthwise (one
    # with depth multiplier 2), pointwise, ReLU6, a global average pool.
    assert any(op.stride == (2, 2) and op.padding == (0, 1, 0, 1) for op in convs)
    assert any(op.groups > 1 and op.weight.shape[3] == 2 * op.groups for op in convs)
    assert any(op.weight.shape[:2] == (1, 1) for op in convs)
    assert any(op.requant.func == Func.CLAMP for op in convs)
    pool = next(op for op in graph.ops if isinstance(op, AveragePool2D))
    assert pool.kernel == graph.tensors[pool.inputs[0]].shape[1:3]
    reference = graph.reference(inputs, collect=True)
    # The scales use the int8 range: no layer's output is one value.
    assert all(len(np.unique(reference[op.outputs[0]])) > 8 for op in graph.ops)
    result = run_graph(graph, inputs, device="isa", config=get_config("default"))
    assert np.array_equal(result.outputs["logits"], reference["logits"])
    for name, value in result.tensors.items():
        assert np.array_equal(value, reference[name]), name


def test_mlp_counts_agree_with_linkrate():
    config = get_config("default")
    model = models.load("digits-mlp", 20)
    f = models.measure(model, config)
    assert f["images"] == 20 and f["segments"] == 1
    assert f["operators"] == {"chain": len(model.graph.ops), "patches": 0, "host": 0}

    # linkrate's count of the compiled network's batches, with their answers from a device
    # of their own, as a freshly opened serial device would exchange them.
    compiled = compile_network(model.graph, config)
    x = model.inputs["input"]
    batches = list(compiled.batches(x))
    setup = compiled.setup_program()
    dev = IsaSimDevice(config)
    dev.send(setup[0])
    dev.receive(setup[1])
    outputs = []
    for b in batches:
        dev.send(b.beats)
        outputs.append(dev.receive(b.output_beats))
    rate = link_rate(batches, config=config, board=board_for(config), setup=setup,
                     outputs=outputs)
    assert rate.exact and rate.images == 20
    assert f["programs"] * 20 == len(batches)
    assert f["to_device"] * 20 == rate.to_board
    assert f["from_device"] * 20 == rate.acks + rate.beat_frames_low
    assert f["setup_to_device"] == rate.setup_to_board
    assert f["instruction_beats"] * 20 == sum(b.instructions for b in batches)
    assert f["output_beats"] * 20 == rate.output_beats
    assert f["data_beats"] * 20 == sum(len(b.beats) - b.instructions for b in batches)
    # No cycles on the ISA simulator; the counter counts the batches' instructions (and the
    # HALT of the program that cleared it).
    assert f["cycles"] is None and f["utilisation"] is None
    assert 0 <= f["instructions"] * 20 - sum(b.instructions for b in batches) <= 1
    assert f["shape_bound"] == compiled.bound()


def test_main_writes_results_by_commit(tmp_path, capsys):
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"0000000": {"commit": "0000000", "models": {}}}))
    assert models.main(["--no-rtl", "--models", "hello_world_int8,mobilenet-style",
                        "--images", "2", "--json", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert "0000000" in doc                 # earlier commits' entries are kept
    key = models.commit() + ("-dirty" if models.dirty() else "")
    entry = doc[key]
    assert entry["date"] and entry["board"] == "ULX3S"
    table = capsys.readouterr().out
    assert "| mobilenet-style |" in table
    assert "mobilenet-style" in entry["models"]
    if models.MODELS_DIR.exists():
        assert "hello_world_int8" in entry["models"]


def _entry(commit: str, date: str, to_device: float, cycles: float | None) -> dict:
    figures = {"images": 4, "macs": 100, "operators": {"chain": 3, "patches": 1, "host": 2},
               "programs": 1.5, "instructions": 80.0, "to_device": to_device,
               "from_device": 500.0, "rtl_images": None if cycles is None else 4,
               "cycles": cycles, "utilisation": None if cycles is None else 0.25,
               "shape_bound": None}
    return {"commit": commit, "date": date, "board": "ULX3S", "max_beats": 16,
            "models": {"m": figures}}


def test_report_renders_before_and_after():
    from bench import report

    doc = {"0ld0000": _entry("0ld0000", "2026-01-02 00:00 UTC", 1.0, None),
           report.MODELS_BEFORE: _entry(report.MODELS_BEFORE, "2026-01-01 00:00 UTC",
                                        2000.0, 400.0),
           "new0000": _entry("new0000", "2026-01-03 00:00 UTC", 1500.0, 300.0),
           "new0000-dirty": _entry("new0000-dirty", "2026-01-04 00:00 UTC", 1.0, None)}
    before, after = report.models_before_after(doc)
    # After: the latest commit other than before's; uncommitted code's only without one.
    assert before["commit"] == report.MODELS_BEFORE and after["commit"] == "new0000"
    page = "\n".join(report._models_markdown(doc))
    assert "## Models on chip: what crosses the link" in page
    assert (f"| m | before `{report.MODELS_BEFORE}` | 4 | 3 / 1 / 2 | 1.50 | 80 | 2,000 | 500 "
            f"| 400 | 25.0 % | - |") in page
    assert ("|  | after `new0000` | 4 | 3 / 1 / 2 | 1.50 (same) | 80 (same) | 1,500 (-25 %) "
            "| 500 (same) | 300 (-25 %) | 25.0 % | - |") in page
    assert "No before/after" in "\n".join(report._models_markdown({}))
