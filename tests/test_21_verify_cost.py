"""`python -m speclab.bench verify-cost` measures a forward over 1..n tokens in decode steps and its
phases, and writes them as JSON. A smoke run on the embedded target; speeds printed, never asserted."""

import json

from speclab.bench.cli import main


def test_verify_cost_writes_costs_in_decode_steps_and_a_phase_profile(tmp_path, capsys):
    path = tmp_path / "verify_cost.json"
    main(["verify-cost", "--dtypes", "float32", "--rounds", "1", "--calls", "1", "--max-new", "3", "--k", "2",
          "--json", str(path)])
    report = json.loads(path.read_text())
    f32 = report["dtypes"]["float32"]
    assert [r["tokens"] for r in f32["rows"]] == [1, 2, 3] and f32["rows"][0]["decode_steps"] == 1.0
    assert all(r["ms"] > 0 and r["decode_steps"] > 0 for r in f32["rows"])
    assert 0 < f32["roofline_fraction"] and f32["weight_bytes"] > 0
    for n in ("1", "3"):
        phases = f32["phases_ms"][n]
        assert set(phases) == {"projections", "attention", "logits", "rest of the layers", "forward",
                               "probabilities", "verification"}
        parts = phases["projections"] + phases["attention"] + phases["logits"] + phases["rest of the layers"]
        assert abs(parts - phases["forward"]) < 1e-6 and phases["projections"] > 0 and phases["attention"] > 0
    assert "decode steps" in capsys.readouterr().out
