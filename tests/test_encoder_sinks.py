"""docs/capture.md's MPNet/MiniLM sink comparison is rendered from its committed result file."""

from __future__ import annotations

import json

from case_studies import encoder_sinks


def test_the_table_equals_the_committed_results(capsys):
    assert encoder_sinks.main(["table", "--check"]) == 0, capsys.readouterr().err


def test_the_results_name_both_models_and_their_provenance():
    result = json.loads(encoder_sinks.RESULT.read_text(encoding="utf-8"))
    assert list(result["models"]) == list(encoder_sinks.MODELS)
    for name, m in result["models"].items():
        layers = {"minilm-l6": 6, "mpnet-base": 12}[name]
        assert len(m["first_share"]) == len(m["end_share"]) == len(m["top_key"]) == layers
        assert all(0 < v < 1 for v in m["first_share"] + m["end_share"])
        assert m["capture_path"] == ("eager+hooks" if name == "mpnet-base" else m["capture_path"])
    prov = result["provenance"]
    assert set(prov["assets"]) == {"austen", *encoder_sinks.MODELS}
    assert set(prov["token_sha256"]) == {f"{n}/emma" for n in encoder_sinks.MODELS}


def test_a_stale_table_is_reported(tmp_path, monkeypatch, capsys):
    doc = tmp_path / "capture.md"
    text = encoder_sinks.DOC.read_text(encoding="utf-8").replace("| `mpnet-base` | 12 |", "| x |")
    doc.write_text(text, encoding="utf-8")
    monkeypatch.setattr(encoder_sinks, "DOC", doc)
    monkeypatch.setattr(encoder_sinks, "ROOT", tmp_path)
    assert encoder_sinks.main(["table", "--check"]) == 1
    assert "differs" in capsys.readouterr().err
    assert encoder_sinks.main(["table"]) == 0  # rewrites the block
    assert encoder_sinks.main(["table", "--check"]) == 0
