"""The tiny model builder: seeded, idempotent, no download."""

import hashlib
import json

from inferwatch.serving.tiny_model import build_tiny_model, is_built


def digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_build_is_deterministic_and_idempotent(tmp_path):
    a = build_tiny_model(tmp_path / "a")
    b = build_tiny_model(tmp_path / "b")
    assert digest(a) == digest(b)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(digest(a))
    config = json.loads((a / "config.json").read_text())
    assert config["hidden_size"] // config["num_attention_heads"] == 64  # vLLM's CPU attention needs >= 64

    before = digest(a)
    weights = (a / "model.safetensors").stat()
    assert build_tiny_model(tmp_path / "a") == a
    again = (a / "model.safetensors").stat()
    assert (again.st_ino, again.st_mtime_ns) == (weights.st_ino, weights.st_mtime_ns)  # nothing rewritten
    assert digest(a) == before


def test_stale_or_partial_build_is_rebuilt(tmp_path):
    folder = build_tiny_model(tmp_path)
    (folder / "inferwatch-build.json").write_text("{}")
    assert not is_built(folder)
    assert build_tiny_model(tmp_path) == folder and is_built(folder)
    assert not list(folder.parent.glob(".*"))  # no staging folders left behind


def test_tokenizer_round_trips_any_text(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path))
    text = "Ünïcødé 🚀 and plain words"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|assistant|>\n")
