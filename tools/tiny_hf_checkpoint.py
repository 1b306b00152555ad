#!/usr/bin/env python3
"""A small LLaMA checkpoint in the Hugging Face layout, to try model.init and chat fine-tuning on a CPU.

    python tools/tiny_hf_checkpoint.py OUT [--vocab N] [--seed S] [--text FILE...]

Writes into the directory OUT:
  tokenizer.json         a byte-level BPE of N tokens (default 512) trained on the text files (default:
                         the fortunes of /usr/share/games/fortunes), with LLaMA-3's chat tokens
                         <|begin_of_text|>, <|start_header_id|>, <|end_header_id|>, <|eot_id|>
  tokenizer_config.json  BOS <|begin_of_text|>, EOS <|eot_id|> and a LLaMA-3 style chat template
  config.json            LlamaForCausalLM with configs/tiny.ini's shapes (dim 128, 4 blocks, 4 query and 2
                         key/value heads, ffn 352, max_seq_len 256, untied) and vocab_size N
  model.safetensors      fp32 weights drawn as transformers initialises them (N(0, 0.02), unit norms)
  chat.jsonl             conversations made of consecutive fortunes: "messages" lists (system, user,
                         assistant, user, assistant) and "prompt"/"response" records

Needs the Python packages tokenizers, numpy and safetensors (the venv of tools/setup-venv.sh); not
transformers, which loads the result (tests/data/hf_data_test.py checks that it does). Run with gtrain:
configs/tiny.ini model.init=OUT model.vocab_size=N (README.md, "Your own data").
"""
import argparse
import glob
import json
import os
import sys

SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                 "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
                 "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
TINY = dict(dim=128, ffn_dim=352, n_layers=4, n_heads=4, n_kv_heads=2, max_seq_len=256)  # configs/tiny.ini


def fortune_files():
    return sorted(f for f in glob.glob("/usr/share/games/fortunes/*")
                  if os.path.isfile(f) and not f.endswith((".dat", ".u8")))


def fortunes(files):
    """The documents of fortune files: the text between lines that are a single '%'."""
    docs = []
    for f in files:
        cur = []
        for line in open(f, encoding="utf-8", errors="replace", newline=""):
            if line.rstrip("\r\n") == "%":
                if cur:
                    docs.append("".join(cur))
                cur = []
            else:
                cur.append(line)
        if cur:
            docs.append("".join(cur))
    return docs


def train_tokenizer(files, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train(files, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def write_checkpoint(out, tok, seed, dim, ffn_dim, n_layers, n_heads, n_kv_heads, max_seq_len):
    """config.json, model.safetensors, tokenizer.json and tokenizer_config.json (with the chat template)."""
    import numpy as np
    from safetensors.numpy import save_file
    os.makedirs(out, exist_ok=True)
    vocab = tok.get_vocab_size()
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIAL[0], "eos_token": SPECIAL[3],
                   "chat_template": CHAT_TEMPLATE}, f, indent=1)
    hd = dim // n_heads
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": dim,
                   "intermediate_size": ffn_dim, "num_hidden_layers": n_layers, "num_attention_heads": n_heads,
                   "num_key_value_heads": n_kv_heads, "head_dim": hd, "vocab_size": vocab,
                   "max_position_embeddings": max_seq_len, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                   "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
                   "attention_dropout": 0.0, "bos_token_id": tok.token_to_id(SPECIAL[0]),
                   "eos_token_id": tok.token_to_id(SPECIAL[3]), "torch_dtype": "float32"}, f, indent=1)
    rng = np.random.default_rng(seed)
    w = {}

    def mat(name, rows, cols):
        w[name] = (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)

    mat("model.embed_tokens.weight", vocab, dim)
    for i in range(n_layers):
        p = "model.layers.%d." % i
        for n, r, c in (("self_attn.q_proj", n_heads * hd, dim), ("self_attn.k_proj", n_kv_heads * hd, dim),
                        ("self_attn.v_proj", n_kv_heads * hd, dim), ("self_attn.o_proj", dim, n_heads * hd),
                        ("mlp.gate_proj", ffn_dim, dim), ("mlp.up_proj", ffn_dim, dim), ("mlp.down_proj", dim, ffn_dim)):
            mat(p + n + ".weight", r, c)
        w[p + "input_layernorm.weight"] = np.ones(dim, np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(dim, np.float32)
    w["model.norm.weight"] = np.ones(dim, np.float32)
    mat("lm_head.weight", vocab, dim)
    save_file(w, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})


def write_chat(path, docs):
    """Conversations from consecutive documents: messages lists and prompt/response records, alternately."""
    with open(path, "w") as f:
        for i in range(0, len(docs) - 3, 3):
            if i % 2:
                f.write(json.dumps({"prompt": docs[i][:200], "response": docs[i + 1][:200]}) + "\n")
            else:
                f.write(json.dumps({"messages": [{"role": "system", "content": "be brief"},
                                                 {"role": "user", "content": docs[i][:120]},
                                                 {"role": "assistant", "content": docs[i + 1][:120]},
                                                 {"role": "user", "content": "and?"},
                                                 {"role": "assistant", "content": docs[i + 2][:120]}]}) + "\n")


def main():
    p = argparse.ArgumentParser(description="a small LLaMA checkpoint in the Hugging Face layout (see the top "
                                            "of this file)")
    p.add_argument("out")
    p.add_argument("--vocab", type=int, default=512, help="tokenizer size, > 260 (default 512)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--text", nargs="+", help="text files to train the tokenizer on (default: the fortunes)")
    a = p.parse_args()
    files = a.text or fortune_files()
    if not files or a.vocab <= 256 + len(SPECIAL):
        print("tiny_hf_checkpoint.py: %s" % ("no text files (install the fortunes package or give --text)"
                                            if not files else "--vocab must be above 260"), file=sys.stderr)
        sys.exit(2)
    tok = train_tokenizer(files, a.vocab)
    write_checkpoint(a.out, tok, a.seed, **TINY)
    write_chat(os.path.join(a.out, "chat.jsonl"), fortunes(files)[:3000])
    print("%s: LLaMA %s, vocab %d; chat.jsonl" % (a.out, ", ".join("%s %d" % kv for kv in TINY.items()),
                                                  tok.get_vocab_size()))


if __name__ == "__main__":
    main()
