"""Write a tiny Llama-architecture model with random weights and a BPE tokenizer, deterministic from a seed.

Run by the *engine's* interpreter (the virtual environment ``ascend-deploy engine install`` made, which has
``tokenizers``, ``safetensors`` and ``numpy``), never imported by the kit::

    ENGINE_PYTHON make_model.py --out DIR --seed 0 --corpus CORPUS.txt

Writes ``DIR/{config.json, model.safetensors, tokenizer.json, tokenizer_config.json, generation_config.json}``:
a ``LlamaForCausalLM`` of about 0.6 M parameters (hidden 128, 2 layers, 4 query heads, 2 KV heads of 32,
vocabulary 2,048 byte-level BPE tokens trained on ``CORPUS``), in float32. Weights are drawn from a normal
distribution seeded by ``--seed`` and scaled so that greedy decoding has clear margins (a greedy answer is a
function of the prompt, not of rounding); the special tokens' output rows are zero, so greedy decoding never
ends a sequence early. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HIDDEN = 128
INTERMEDIATE = 256
LAYERS = 2
HEADS = 4
KV_HEADS = 2
VOCAB = 2048
MAX_POSITIONS = 4096
SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")
#: A plain chat template: one line per message, then the assistant's turn.
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def train_tokenizer(corpus: str) -> Tokenizer:
    """A byte-level BPE of :data:`VOCAB` tokens trained on ``corpus`` (any text tokenizes, through bytes)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus.splitlines(), trainer=trainer)
    return tokenizer


def weights(seed: int, vocab: int, special_ids: list[int]) -> dict[str, np.ndarray]:
    """The model's tensors by Hugging Face Llama name, float32."""
    rng = np.random.default_rng(seed)
    head_dim = HIDDEN // HEADS

    def normal(*shape: int, std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    tensors = {"model.embed_tokens.weight": normal(vocab, HIDDEN, std=1.0),
               "model.norm.weight": np.ones(HIDDEN, np.float32)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": np.ones(HIDDEN, np.float32),
            p + "post_attention_layernorm.weight": np.ones(HIDDEN, np.float32),
            p + "self_attn.q_proj.weight": normal(HEADS * head_dim, HIDDEN, std=HIDDEN ** -0.5),
            p + "self_attn.k_proj.weight": normal(KV_HEADS * head_dim, HIDDEN, std=HIDDEN ** -0.5),
            p + "self_attn.v_proj.weight": normal(KV_HEADS * head_dim, HIDDEN, std=HIDDEN ** -0.5),
            p + "self_attn.o_proj.weight": normal(HIDDEN, HEADS * head_dim, std=(HEADS * head_dim) ** -0.5),
            p + "mlp.gate_proj.weight": normal(INTERMEDIATE, HIDDEN, std=HIDDEN ** -0.5),
            p + "mlp.up_proj.weight": normal(INTERMEDIATE, HIDDEN, std=HIDDEN ** -0.5),
            p + "mlp.down_proj.weight": normal(HIDDEN, INTERMEDIATE, std=INTERMEDIATE ** -0.5),
        }
    head = normal(vocab, HIDDEN, std=1.0)
    head[special_ids] = 0.0
    tensors["lm_head.weight"] = head
    return tensors


def write_model(out: Path, seed: int, corpus: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(corpus)
    vocab = tokenizer.get_vocab_size()
    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HIDDEN // HEADS, "vocab_size": vocab,
        "max_position_embeddings": MAX_POSITIONS, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float32",
        "bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"], "pad_token_id": ids["<pad>"],
    }
    (out / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"], "pad_token_id": ids["<pad>"]}), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
        "model_max_length": MAX_POSITIONS, "add_bos_token": False, "chat_template": CHAT_TEMPLATE}), encoding="utf-8")
    save_file(weights(seed, vocab, sorted(ids.values())), str(out / "model.safetensors"), metadata={"format": "pt"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus", type=Path, required=True, help="UTF-8 text the tokenizer is trained on")
    args = parser.parse_args()
    write_model(args.out, args.seed, args.corpus.read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
