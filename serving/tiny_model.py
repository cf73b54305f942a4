"""Build a tiny, randomly initialised Llama that vLLM can serve without any download.

The model exists so that the whole stack (gateway, vLLM's metrics and traces) can run for
real on a laptop or CI box. Its weights are random, so its text is gibberish; what matters
is that vLLM loads it through the same code path as a real Llama checkpoint.

The build is seeded and writes into a versioned folder, so the same files come out every
time and a second call is a no-op.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

# Bump when anything below changes what is written, so stale caches are rebuilt.
BUILD_VERSION = 1
SEED = 20261130
DEFAULT_NAME = "tiny-llama"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# A few sentences are enough for a byte-level BPE to learn merges; every byte stays
# encodable thanks to the byte-level alphabet, so any prompt tokenizes.
TRAINING_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Observability for large language models starts with time to first token.",
    "Prometheus scrapes metrics; Grafana draws them; Alertmanager pages the on-call engineer.",
    "Inter-token latency and time per output token describe how a stream feels to a user.",
    "GPU memory, power, clocks and temperature tell whether the hardware is healthy.",
    "Drift shows up as longer prompts, shorter answers and lower model confidence.",
    "Hello! How can I help you today? Please summarise this document in three sentences.",
    "0123456789 + - * / = ( ) [ ] { } < > , . ; : ! ? ' \" @ # $ % ^ & _ | ~",
]


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the model. head_dim must be 64+: vLLM's CPU attention rejects 16."""

    vocab_size: int = 512
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024


def default_cache_dir() -> Path:
    root = os.environ.get("INFERWATCH_CACHE_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inferwatch"


def model_dir(cache_dir: Path | None = None, name: str = DEFAULT_NAME) -> Path:
    return (cache_dir or default_cache_dir()) / "models" / f"{name}-v{BUILD_VERSION}"


def _marker(spec: TinyModelSpec) -> dict:
    return {"build_version": BUILD_VERSION, "seed": SEED, "spec": asdict(spec)}


def is_built(path: Path, spec: TinyModelSpec = TinyModelSpec()) -> bool:
    marker = path / "inferwatch-build.json"
    try:
        return json.loads(marker.read_text()) == _marker(spec)
    except (OSError, ValueError):
        return False


def build_tiny_model(
    cache_dir: Path | None = None,
    name: str = DEFAULT_NAME,
    spec: TinyModelSpec = TinyModelSpec(),
    force: bool = False,
) -> Path:
    """Return the model folder, building it first if it is missing or stale.

    Files are written to a temporary sibling folder and renamed into place, so an
    interrupted build never leaves a half-written model that looks complete.
    """
    target = model_dir(cache_dir, name)
    if not force and is_built(target, spec):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        _write_tokenizer(staging, spec)
        _write_model(staging, spec)
        (staging / "inferwatch-build.json").write_text(json.dumps(_marker(spec), indent=2))
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _write_tokenizer(path: Path, spec: TinyModelSpec) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAINING_TEXT * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=spec.max_position_embeddings,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)


def _write_model(path: Path, spec: TinyModelSpec) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",  # type: ignore[call-arg]  # the name in config.json that vLLM 0.32 reads
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)  # type: ignore[arg-type]  # transformers types .to() for devices only
    model.save_pretrained(path, safe_serialization=True)


ADAPTER_NAME = "tiny-lora"
ADAPTER_RANK = 8
ADAPTER_TARGETS = ("q_proj", "v_proj")


def build_tiny_adapter(base: Path, name: str = ADAPTER_NAME, force: bool = False) -> Path:
    """A LoRA adapter of the tiny model, in PEFT's layout (what vLLM's ``--lora-modules``
    loads), next to the model it adapts; rebuilt with it.

    Its B matrices are random, not PEFT's zeros, so the adapter changes what the model says:
    a request served without it would answer differently.
    """
    target = base.parent / f"{base.name}-{name}"
    marker = {"base": json.loads((base / "inferwatch-build.json").read_text()), "rank": ADAPTER_RANK,
              "targets": list(ADAPTER_TARGETS)}
    try:
        if not force and json.loads((target / "inferwatch-build.json").read_text()) == marker:
            return target
    except (OSError, ValueError):
        pass
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        _write_adapter(staging, base)
        (staging / "inferwatch-build.json").write_text(json.dumps(marker, indent=2))
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _write_adapter(path: Path, base: Path) -> None:
    import torch
    from safetensors.torch import save_file

    config = json.loads((base / "config.json").read_text())
    hidden, heads, kv_heads = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    out = {"q_proj": hidden, "v_proj": hidden // heads * kv_heads}
    generator = torch.Generator().manual_seed(SEED + 1)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module in ADAPTER_TARGETS:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(ADAPTER_RANK, hidden, generator=generator) * 0.1
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out[module], ADAPTER_RANK, generator=generator) * 0.1
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(base),
        "r": ADAPTER_RANK, "lora_alpha": 2 * ADAPTER_RANK, "lora_dropout": 0.0, "bias": "none",
        "target_modules": list(ADAPTER_TARGETS), "fan_in_fan_out": False, "modules_to_save": None,
    }, indent=2))
