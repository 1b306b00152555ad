#!/usr/bin/env python3
"""torch_llama_bench.py — the PyTorch side of gtrain's GPU benchmark.

Trains a Hugging Face transformers LlamaForCausalLM, built from a config (random init, random token
ids), for a few optimizer steps on one GPU and prints ONE JSON line: tokens/s, step time, peak
memory. gtrain's own numbers come from its metrics JSONL (tok_per_s, step_ms, mem_peak_bytes) for the
same shape; bench tables put the two side by side.

What runs, per step: forward + cross-entropy loss (labels = inputs, transformers shifts them),
backward, torch.optim.AdamW(fused=True) step, zero_grad(set_to_none=True). Attention is
attn_implementation="sdpa" (PyTorch's fused flash/memory-efficient kernels). With --checkpoint,
model.gradient_checkpointing_enable() recomputes every decoder layer in backward (gtrain's
memory.recompute=full).

Precision (--precision):
  amp   fp32 parameters, gradients and AdamW state, bf16 compute under torch.autocast. This is the
        like-for-like comparison with gtrain's bf16 mode (bf16 working weights and activations, fp32
        master weights, gradients and moments).
  bf16  the whole model in bf16 (parameters, gradients and AdamW state): less memory than gtrain
        keeps, shown for reference.

Timing: --warmup steps are run first and not timed; then each of --steps steps is timed between
torch.cuda.synchronize() calls; step_ms is the median, tokens_per_s = batch*seq / median step.
peak_mem_bytes is torch.cuda.max_memory_allocated() over the whole run (model, optimizer state and
the activation peak), peak_reserved_bytes the caching allocator's reservation.

Example:
  python3 bench/torch_llama_bench.py --dim 2048 --layers 16 --heads 16 --kv-heads 16 --ffn 5632 \
      --vocab 32000 --seq 2048 --batch 4 --steps 10 --checkpoint
"""
import argparse
import json
import statistics
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--dim", type=int, default=2048, help="hidden size")
    p.add_argument("--layers", type=int, default=16, help="decoder layers")
    p.add_argument("--heads", type=int, default=16, help="attention heads")
    p.add_argument("--kv-heads", type=int, default=16, help="key/value heads (GQA when < heads)")
    p.add_argument("--ffn", type=int, default=5632, help="MLP intermediate size")
    p.add_argument("--vocab", type=int, default=32000, help="vocabulary size")
    p.add_argument("--seq", type=int, default=2048, help="sequence length")
    p.add_argument("--batch", type=int, default=4, help="sequences per step")
    p.add_argument("--steps", type=int, default=10, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--checkpoint", action="store_true", help="recompute every layer in backward")
    p.add_argument("--precision", choices=("amp", "bf16"), default="amp")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def model_flops_per_token(a, n_params_no_embed):
    """Training FLOPs per token: 6 * (non-embedding params incl. LM head) + causal attention
    12 * layers * seq * dim / 2 (QK^T and PV, forward + backward, half the matrix being masked).
    Source: Kaplan et al. 2020 (6N), PaLM appendix B (attention term), halved for causal masking."""
    return 6 * n_params_no_embed + 6 * a.layers * a.seq * a.dim


def main(argv=None):
    a = parse_args(argv)
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, LlamaConfig

    if not torch.cuda.is_available():
        print(json.dumps({"impl": "torch", "error": "no CUDA device"}))
        return 2
    torch.manual_seed(a.seed)
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False  # bf16 compute only; no TF32 for stray fp32 matmuls

    config = LlamaConfig(
        vocab_size=a.vocab,
        hidden_size=a.dim,
        intermediate_size=a.ffn,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        max_position_embeddings=a.seq,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        attention_dropout=0.0,
        use_cache=False,
    )
    with device:
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    if a.precision == "bf16":
        model = model.to(torch.bfloat16)
    model.train()
    if a.checkpoint:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    n_params = sum(p.numel() for p in model.parameters())
    n_embed = model.get_input_embeddings().weight.numel()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            fused=True)

    gen = torch.Generator(device=device)
    gen.manual_seed(a.seed)

    def step():
        x = torch.randint(0, a.vocab, (a.batch, a.seq), device=device, generator=gen)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=(a.precision == "amp")):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    losses = []
    for _ in range(a.warmup):
        losses.append(float(step()))
    torch.cuda.synchronize()

    times_ms = []
    for _ in range(a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times_ms.append((time.perf_counter() - t0) * 1e3)
        losses.append(float(loss))

    step_ms = statistics.median(times_ms) if times_ms else float("nan")
    tokens = a.batch * a.seq
    tok_s = tokens / (step_ms / 1e3) if times_ms else float("nan")
    flops_tok = model_flops_per_token(a, n_params - n_embed)
    result = {
        "impl": "torch",
        "precision": a.precision,
        "checkpoint": bool(a.checkpoint),
        "dim": a.dim, "layers": a.layers, "heads": a.heads, "kv_heads": a.kv_heads, "ffn": a.ffn,
        "vocab": a.vocab, "seq": a.seq, "batch": a.batch, "steps": a.steps, "warmup": a.warmup,
        "params": n_params,
        "tokens_per_step": tokens,
        "step_ms": round(step_ms, 3),
        "step_ms_mean": round(statistics.fmean(times_ms), 3) if times_ms else None,
        "tokens_per_s": round(tok_s, 1),
        "model_tflops": round(flops_tok * tok_s / 1e12, 2) if times_ms else None,
        "peak_mem_bytes": torch.cuda.max_memory_allocated(),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
