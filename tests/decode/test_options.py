"""GpuDecodeOptions: GpuDecodeLoader's keyword options; a misspelt key or a bad value fails at construction."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest
import torch

from lightning_dataperf.decode.loader import GpuDecodeLoader
from lightning_dataperf.decode.options import GpuDecodeOptions


def test_a_misspelt_key_is_named_with_the_valid_ones():
    with pytest.raises(TypeError) as raised:
        GpuDecodeOptions(sise=224)
    message = str(raised.value)
    assert message.startswith("GpuDecodeOptions(sise=...): no such option (sise: did you mean size?)")
    assert message.endswith(
        "the options are " + ", ".join(field.name for field in dataclasses.fields(GpuDecodeOptions))
    )


def test_the_fields_are_the_loaders_keyword_options_with_its_defaults():
    parameters = list(inspect.signature(GpuDecodeLoader.__init__).parameters.values())
    assert [p.name for p in parameters[:3]] == ["self", "loader", "device"]
    loader = {p.name: p.default for p in parameters[3:]}
    assert {field.name: field.default for field in dataclasses.fields(GpuDecodeOptions)} == loader


@pytest.mark.parametrize(
    ("name", "value", "rule"),
    [
        ("lookahead", 0, "at least 1"),
        ("size", 0, "pixels"),
        ("size", 22.4, "pixels"),
        ("dtype", "bfloat16", "torch dtype"),
        ("channels_last", "yes", "True or False"),
        ("mean", (0.5, 0.5), "3 numbers"),
        ("std", (0.2, 0.0, 0.2), "3 numbers"),
        ("on_error", "skip", "'raise', 'zeros'"),
        ("backend", "nvjpg", "'nvjpeg'.*or a backend object"),
        ("decode_threads", 0, "1 or more"),
        ("prepare_ahead", -1, "0 or more"),
    ],
)
def test_a_bad_value_is_refused_saying_what_to_give(name, value, rule):
    with pytest.raises(ValueError, match=rf"^GpuDecodeOptions\({name}={re.escape(repr(value))}\): give .*{rule}"):
        GpuDecodeOptions(**{name: value})


def test_a_backend_object_and_lists_are_taken_the_record_stays_hashable():
    class Backend:
        layout = "hwc"

        def decode(self, *args):
            return True, None

    backend = Backend()
    options = GpuDecodeOptions(size=8, dtype=torch.bfloat16, mean=[0.5, 0.5, 0.5], backend=backend)
    assert options.mean == (0.5, 0.5, 0.5) and options.backend is backend
    assert hash(options) == hash(GpuDecodeOptions(size=8, dtype=torch.bfloat16, mean=(0.5,) * 3, backend=backend))
