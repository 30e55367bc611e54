"""`python -m speclab.bench gemm` times a forward's products on every path (speclab's kernel in float32
and on its three bfloat16 paths, F.linear, oneDNN on the plain weight and on its packed copy) and writes them
as JSON. A smoke run on the embedded target's shapes; speeds printed, never asserted."""

import json

import pytest

from speclab.bench.cli import main
from speclab.bench.gemm import bf16_kernel_paths, bf16_packing, projection_shapes
from speclab.models import cpu_gemm
from speclab.models.llama import LlamaConfig


@pytest.mark.skipif(not cpu_gemm.available(), reason=f"kernel not built: {cpu_gemm.why_unavailable()}")
def test_bench_gemm_writes_every_path_at_every_row_count(tmp_path, capsys):
    path = tmp_path / "gemm.json"
    main(["gemm", "--target", "target", "--rows", "1", "5", "--rounds", "1", "--json", str(path)])
    report = json.loads(path.read_text())
    got = {(r["dtype"], r["path"], r["rows"]) for r in report["rows"]}
    f32 = {"kernel", "F.linear", "oneDNN", "oneDNN packed"}
    bf16 = ({f"kernel {name}" for name in bf16_kernel_paths()} | {"F.linear"}
            | ({"oneDNN", "oneDNN packed"} if bf16_packing() else set()))
    assert {"kernel best", "kernel widened"} <= bf16
    assert got == {("float32", p, m) for p in f32 for m in (1, 5)} | {("bfloat16", p, m) for p in bf16 for m in (1, 5)}
    for r in report["rows"]:
        assert r["ms"] > 0 and r["gb_per_s"] > 0
        assert r["one_row_products"] == 1.0 if r["rows"] == 1 else r["one_row_products"] > 0
    assert set(report["bf16_path"].values()) <= {"amx", "avx512_bf16", "widened"}
    assert "load average" in capsys.readouterr().out


def test_the_shapes_are_one_forward_s_products():
    cfg = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=176, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    shapes = projection_shapes(cfg)
    assert shapes[:4] == [(64 + 2 * 32, 64), (64, 64), (352, 64), (64, 176)] and len(shapes) == 3 * 4 + 1
    assert shapes[-1] == (100, 64)  # the LM head
