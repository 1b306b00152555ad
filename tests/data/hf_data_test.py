#!/usr/bin/env python3
"""End-to-end tests of gtrain's data path with real tokenizers and other shard formats.

Run by tests/data.cmake with GTRAIN_HF_PYTHON (a Python with `tokenizers`, e.g. /opt/gtrain-venv);
they do not skip: a missing package is a failure. One scenario per call:

tokenizer_prep_train_sample_roundtrip
    trains a byte-level BPE tokenizer (3000 tokens) on the fortunes text with the `tokenizers`
    library, prepares it with tools/prep_tokenized.py into several train shards and a validation
    shard (the same bytes with 1 and 2 workers), checks that every document comes back: shard ids ->
    text is the document and text -> ids is the shard's ids; trains gtrain 4 steps on the globs and
    samples with --tokenizer: the printed text is the decoding of the sampled ids, which start with
    the separator and the prompt's encoding. Without the tokenizer, gtrain-sample refuses the
    3000-token model (exit 2).
prep_jsonl_4byte_ids_bos_separator
    JSONL input with --text-field, a 70,000-token tokenizer with a BOS token: 4-byte ids, BOS before
    every document; a record that is not JSON or lacks the field, and a missing input, exit 2 naming
    file and line, leaving nothing behind.
llmc_shard_is_trained_on
    writes an llm.c shard (256 x int32 header, magic 20240520, u16 tokens) in a few lines and trains
    gtrain on it; the start-up line names it with its token count.
shards_same_samples_any_world_size
    a corpus prepared into several shards: 1 rank x grad_accum 2 and 2 ranks x 1 train on the same
    samples: the losses of every step agree within 1e-5 relative.
blend_same_samples_any_world_size
    data.train = "web.*.bin:0.6, code.bin:0.4": the realised mix is printed, 1 rank x grad_accum 2 and
    2 ranks x 1 give the same losses, and with two validation sources each one's val_loss.NAME equals
    the val_loss of a run validating on that source alone; resumed from its step-2 state file, a run
    draws what it drew uninterrupted.
chat_loss_mask_matches_transformers
    a small checkpoint and tokenizer with a chat template (saved by transformers); chat JSONL (messages
    lists and prompt/response records) -> shards + masks with --format chat; the counted tokens of a
    conversation are its assistant turns; gtrain's step-1 loss and gradient norm equal transformers'
    with labels -100 on the masked tokens over the whole global batch at world sizes 1, 2 and 4 and
    micro-batch splits 8x1, 1x4, 1x2 (different counted tokens per micro-batch), and step 2 agrees;
    bad records exit 2 naming file and line. The checkpoint is tools/tiny_hf_checkpoint.py's (at smaller
    shapes), written without transformers, which is imported in a thread meanwhile and loads it back.
bad_shards_and_globs_exit_2
    gtrain exits 2 with one line naming the file for a bad magic, a truncated llm.c shard, a glob
    matching nothing, and a shard made for a larger vocabulary than the model's.
"""
import argparse
import glob
import json
import os
import shutil
import struct
import subprocess
import sys

MASK64 = (1 << 64) - 1


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def run(cmd, expect_rc=0, env=None, **kw):
    e = dict(os.environ, OMP_NUM_THREADS="1")
    e.update(env or {})
    p = subprocess.run(cmd, capture_output=True, env=e, **kw)
    out, err = p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
    if p.returncode != expect_rc:
        fail("%s\nexited %d, expected %d\nstdout:\n%s\nstderr:\n%s" % (" ".join(cmd), p.returncode, expect_rc,
                                                                     out[-3000:], err[-3000:]))
    return p, out, err


def corpus_files():
    files = sorted(f for f in glob.glob("/usr/share/games/fortunes/*")
                   if os.path.isfile(f) and not f.endswith((".dat", ".u8")))
    check(files, "no fortunes text in /usr/share/games/fortunes (tools/setup-debian.sh installs fortunes)")
    return files


def train_tokenizer(path, files, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(files, trainer)
    tok.save(path)
    return tok


def read_shard(path):
    raw = open(path, "rb").read()
    magic, version, tb, count, vocab, reserved = struct.unpack("<8sIIQII", raw[:32])
    check(magic == b"GTRNTOK\0" and version == 1 and reserved == 0, "%s: not a gtrain shard header" % path)
    check(len(raw) == 32 + tb * count, "%s: size does not match the header" % path)
    fmt = "<%d%s" % (count, "H" if tb == 2 else "I")
    return list(struct.unpack(fmt, raw[32:])), vocab, tb


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def documents(files, sep_line):
    """The documents of text files split at lines equal to sep_line (docs/data-format.md)."""
    docs = []
    for f in files:
        cur = []
        for line in open(f, encoding="utf-8", newline=""):
            if line.rstrip("\r\n") == sep_line:
                if cur:
                    docs.append("".join(cur))
                cur = []
            else:
                cur.append(line)
        if cur:
            docs.append("".join(cur))
    return docs


def tiny_ini(path, vocab, train, val, steps, extra=""):
    open(path, "w").write("""[model]
dim = 32
n_layers = 2
n_heads = 2
n_kv_heads = 1
vocab_size = %d
ffn_dim = 96
max_seq_len = 64
[train]
seq_len = 32
micro_batch = 4
precision = fp32
steps = %d
warmup_steps = 1
lr = 1e-2
[data]
train = %s
val = %s
val_every = %d
val_batches = 2
%s""" % (vocab, steps, train, val, steps, extra))


def prep(args, tokenizer, prefix, files, *extra):
    cmd = [sys.executable, args.prep_tool, "--tokenizer", tokenizer, "-o", prefix] + list(extra) + files
    return run(cmd)


# ------------------------------------------------------------------------------------------------ scenarios

def tokenizer_prep_train_sample_roundtrip(args):
    files = corpus_files()
    tok = train_tokenizer("tokenizer.json", files, 3000)
    vocab = tok.get_vocab_size()
    check(vocab == 3000, "the BPE trainer made %d tokens, not 3000" % vocab)
    eot = tok.token_to_id("<|endoftext|>")

    common = ["--doc-sep", "%", "--val-fraction", "0.05", "--shard-tokens", "150000", "--seed", "3"]
    _, out, err = prep(args, "tokenizer.json", "w2/corpus", files, "--workers", "2", *common)
    check("EOS '<|endoftext|>' (id %d) after each document" % eot in err, "prep did not name the separator:\n" + err)
    check("tokens/s" in err and "ETA" in err, "no progress line with tokens/s and ETA:\n" + err)
    _, _, _ = prep(args, "tokenizer.json", "w1/corpus", files, "--workers", "1", *common)
    train_shards = sorted(glob.glob("w2/corpus.train.*.bin"))
    val_shards = sorted(glob.glob("w2/corpus.val.*.bin"))
    check(len(train_shards) >= 3 and len(val_shards) >= 1,
          "expected several train shards and a validation shard, got %s %s" % (train_shards, val_shards))
    for p in train_shards + val_shards:
        q = p.replace("w2/", "w1/")
        check(open(p, "rb").read() == open(q, "rb").read(), "%s differs between 1 and 2 workers" % p)

    # every document comes back, in order, in the split the documented hash gives it
    streams = {}
    for split, shards in (("train", train_shards), ("val", val_shards)):
        ids = []
        for p in shards:
            t, v, tb = read_shard(p)
            check(v == 3000 and tb == 2, "%s: vocab %d, token_bytes %d (expected 3000, 2)" % (p, v, tb))
            check(len(t) <= 150000, "%s: %d tokens, more than --shard-tokens" % (p, len(t)))
            ids += t
        check(ids and ids[-1] == eot, "%s does not end with the EOS separator" % split)
        docs, cur = [], []
        for i in ids:
            if i == eot:
                docs.append(cur)
                cur = []
            else:
                cur.append(i)
        streams[split] = docs
    want = documents(files, "%")
    seed_mix = mix64(3)
    split_of = ["val" if mix64((seed_mix + (d + 1) * 0x9E3779B97F4A7C15) & MASK64) < 0.05 * 2.0 ** 64 else "train"
                for d in range(len(want))]
    for split in ("train", "val"):
        mine = [d for d, s in zip(want, split_of) if s == split]
        got = streams[split]
        check(len(got) == len(mine), "%s: %d documents in the shards, %d expected" % (split, len(got), len(mine)))
        for k, (text, ids) in enumerate(zip(mine, got)):
            back = tok.decode(ids, skip_special_tokens=False)
            check(back == text, "%s document %d: ids -> text differs from the input:\n%r\n%r" % (split, k, back, text))
            check(tok.encode(back, add_special_tokens=False).ids == ids,
                  "%s document %d: ids -> text -> ids does not come back unchanged" % (split, k))
    n_tokens = sum(len(read_shard(p)[0]) for p in train_shards)
    print("tokenizer: %d documents, %d train shards (%d tokens), %d val shards, round trip exact" %
          (len(want), len(train_shards), n_tokens, len(val_shards)))

    # train on the globs, then sample with the tokenizer
    tiny_ini("run.ini", 3000, "w2/corpus.train.*.bin", "w2/corpus.val.*.bin", 4, "[checkpoint]\ndir = ck\n")
    _, out, err = run([args.gtrain, "run.ini"])
    want_line = "gtrain: train data %d files, %s tokens: w2/corpus.train.000000.bin" % (len(train_shards),
                                                                                    "{:,}".format(n_tokens))
    check(want_line in out, "no start-up line %r in:\n%s" % (want_line, out))
    check("gtrain: validation data w2/corpus.val.000000.bin" in out, "no validation start-up line:\n" + out)
    check("val_loss" in out, "no validation loss:\n" + out)
    state = "ck/step_00000004.h5"
    sample = [args.sample, state, "--tokenizer", "tokenizer.json", "--python", sys.executable,
              "--prompt", "The meaning of life", "--tokens", "40", "--seed", "5", "--temperature", "1.0"]
    _, text, _ = run(sample)
    _, ids_line, _ = run(sample + ["--ids"])
    ids = [int(x) for x in ids_line.split()]
    prompt_ids = tok.encode("The meaning of life", add_special_tokens=False).ids
    check(ids[0] == eot and ids[1:1 + len(prompt_ids)] == prompt_ids,
          "--ids does not start with the separator and the prompt's ids: %s" % ids[:12])
    gen = ids[1 + len(prompt_ids):]
    check(len(gen) == 40 and all(0 <= i < 3000 for i in gen), "not 40 generated ids in [0, 3000): %s" % gen)
    check(text == "The meaning of life" + tok.decode(gen, skip_special_tokens=False),
          "gtrain-sample's text is not the prompt followed by the decoding of its ids:\n%r" % text)
    _, _, err = run([args.sample, state, "--tokens", "5"], expect_rc=2)
    check("--tokenizer" in err and "3000" in err, "the refusal does not ask for --tokenizer:\n" + err)
    print("sample: %r" % text[:120])


def write_llmc(path, tokens, claim=None):
    """llm.c's format: a 256 x int32 header (magic, version, token count), then u16 tokens."""
    header = [20240520, 1, len(tokens) if claim is None else claim] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(tokens), *tokens))


def llmc_shard_is_trained_on(args):
    text = b"".join(open(f, "rb").read() for f in corpus_files()[:3])
    write_llmc("train.bin", list(text[:60000]))
    write_llmc("val.bin", list(text[60000:70000]))
    tiny_ini("run.ini", 256, "train.bin", "val.bin", 3)
    _, out, _ = run([args.gtrain, "run.ini"])
    check("gtrain: train data train.bin (60,000 tokens, llm.c shard)" in out, "no llm.c start-up line:\n" + out)
    check("step 3/3" in out and "val_loss" in out, "training did not finish:\n" + out)
    print("llm.c shard: trained\n" + "\n".join(l for l in out.splitlines() if l.startswith(("step", "gtrain: train"))))


def shards_same_samples_any_world_size(args):
    files = corpus_files()[:6]
    train_tokenizer("tokenizer.json", files, 1000)
    prep(args, "tokenizer.json", "corpus", files, "--doc-sep", "%", "--val-fraction", "0", "--shard-tokens", "20000",
         "--workers", "2")
    shards = sorted(glob.glob("corpus.train.*.bin"))
    check(len(shards) >= 4, "expected several shards, got %s" % shards)
    losses = {}
    for world, accum in ((1, 2), (2, 1)):
        name = "w%d" % world
        tiny_ini(name + ".ini", 1000, "corpus.train.*.bin", "", 6)
        cmd = [args.mpiexec, args.np_flag, str(world)] + args.mpi_flags.split() + [
            args.gtrain, name + ".ini", "train.grad_accum=%d" % accum, "log.metrics=%s.jsonl" % name,
            "data.val_every=0"]
        run(cmd, env={"OMPI_MCA_rmaps_base_oversubscribe": "1"})
        losses[name] = [json.loads(l)["loss"] for l in open(name + ".jsonl") if '"loss"' in l]
    a, b = losses["w1"], losses["w2"]
    check(len(a) == len(b) == 6, "not 6 steps each: %s %s" % (a, b))
    for step, (x, y) in enumerate(zip(a, b), 1):
        check(abs(x - y) <= 1e-5 * abs(x), "step %d: loss %.9g at 1 rank, %.9g at 2 ranks" % (step, x, y))
    print("world size: %d shards; losses at 1 and 2 ranks agree: %s" % (len(shards), ["%.6f" % x for x in a]))


def blend_same_samples_any_world_size(args):
    """A weighted blend: the realised mix is printed, 1 and 2 ranks train on the same samples, and each
    validation source's loss (val_loss.NAME) equals the validation loss of a run validating on that
    source alone."""
    text = b"".join(open(f, "rb").read() for f in corpus_files()[:4])
    write_llmc("web.000.bin", list(text[:30000]))
    write_llmc("web.001.bin", list(text[30000:50000]))
    write_llmc("code.bin", [(b + 7) % 256 for b in text[50000:56000]])
    os.makedirs("val", exist_ok=True)
    write_llmc("val/web.bin", list(text[60000:66000]))
    write_llmc("val/code.bin", [(b + 7) % 256 for b in text[66000:72000]])
    blend = "web.*.bin:0.6, code.bin:0.4"
    runs = {}
    for name, world, accum, val in (("w1", 1, 2, "val/web.bin, val/code.bin"), ("w2", 2, 1, "val/web.bin, val/code.bin"),
                                    ("web", 1, 2, "val/web.bin"), ("code", 1, 2, "val/code.bin")):
        tiny_ini(name + ".ini", 256, blend, val, 4)
        cmd = [args.mpiexec, args.np_flag, str(world)] + args.mpi_flags.split() + [
            args.gtrain, name + ".ini", "train.grad_accum=%d" % accum, "log.metrics=%s.jsonl" % name]
        _, out, _ = run(cmd, env={"OMPI_MCA_rmaps_base_oversubscribe": "1"})
        runs[name] = [json.loads(l) for l in open(name + ".jsonl")]
        if name == "w1":
            check("train data blend of 2 sources, realised mix over samples 0..31 (32): web " in out and
                  "(weight 60.00%, 2 files, 50,000 tokens), code " in out, "no realised mix line:\n" + out)
            print([l for l in out.splitlines() if "blend" in l][0])
    loss = {k: [r["loss"] for r in v if "loss" in r] for k, v in runs.items()}
    check(len(loss["w1"]) == 4 and all(abs(x - y) <= 1e-5 * abs(x) for x, y in zip(loss["w1"], loss["w2"])),
          "losses at 1 and 2 ranks differ: %s %s" % (loss["w1"], loss["w2"]))
    v1 = [r for r in runs["w1"] if "val_loss" in r][-1]
    v2 = [r for r in runs["w2"] if "val_loss" in r][-1]
    check("val_loss.web" in v1 and "val_loss.code" in v1, "no per-source validation losses: %s" % v1)
    for src in ("web", "code"):
        alone = [r for r in runs[src] if "val_loss" in r][-1]
        check("val_loss.%s" % src not in alone, "one validation source has a per-source loss: %s" % alone)
        for v in (v1, v2):
            check(abs(v["val_loss." + src] - alone["val_loss"]) <= 1e-5 * alone["val_loss"],
                  "val_loss.%s %.9g != the run validating on %s alone, %.9g" % (src, v["val_loss." + src], src,
                                                                                 alone["val_loss"]))
    check(abs(v1["val_loss"] - v1["val_loss.code"]) > 1e-3, "web and code validation losses should differ: %s" % v1)
    # a resume that changes nothing: the run of 4 steps again from its own step-2 state file draws what
    # the uninterrupted run drew (the cursor is the only state)
    tiny_ini("res.ini", 256, blend, "", 4, "[checkpoint]\ndir = ck_res\nevery = 2\n")
    run([args.gtrain, "res.ini", "train.grad_accum=2", "log.metrics=res.jsonl"])
    _, out, _ = run([args.gtrain, "res.ini", "train.grad_accum=2", "checkpoint.dir=ck_res2",
                     "checkpoint.resume=ck_res/step_00000002.h5", "log.metrics=res2.jsonl"])
    check("realised mix over samples 16..31 (16)" in out, "the resumed run's mix line:\n" + out)
    res = [r["loss"] for r in (json.loads(l) for l in open("res.jsonl")) if "loss" in r]
    res2 = [r["loss"] for r in (json.loads(l) for l in open("res2.jsonl")) if "loss" in r]
    check(len(res2) == 2 and res2 == res[2:] and all(abs(x - y) <= 1e-6 * abs(y) for x, y in zip(res, loss["w1"])),
          "resumed losses %s differ from the uninterrupted run's %s (%s)" % (res2, res, loss["w1"]))
    print("blend: losses at 1 and 2 ranks agree %s; %s" % (["%.6f" % x for x in loss["w1"]], v1))


def tiny_hf_tool(args):
    """tools/tiny_hf_checkpoint.py (beside the prep tool), imported: the README's small checkpoint."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("tiny_hf_checkpoint",
                                                  os.path.join(os.path.dirname(args.prep_tool), "tiny_hf_checkpoint.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def chat_loss_mask_matches_transformers(args):
    """Chat JSONL -> shards + masks with the checkpoint's own chat template; gtrain's loss and gradient norm
    at step 1 equal transformers' with labels -100 on the masked tokens over the whole global batch at
    world sizes 1, 2 and 4 (micro-batch splits 8x1, 1x4, 1x2: the counted tokens per micro-batch differ),
    and the losses of the next step agree. torch and transformers (most of the test's time) are imported
    in a thread while the shards are made and gtrain runs."""
    import threading
    import numpy as np
    mods = {}

    def import_reference():
        import torch
        import transformers
        transformers.LlamaForCausalLM, transformers.AutoTokenizer  # the lazy modules themselves
        mods.update(torch=torch, transformers=transformers)

    importer = threading.Thread(target=import_reference)
    importer.start()
    # the checkpoint of tools/tiny_hf_checkpoint.py (config.json, safetensors, tokenizer with a chat template,
    # conversations), written without transformers, at smaller shapes
    tool = tiny_hf_tool(args)
    files = corpus_files()[:4]
    tok = tool.train_tokenizer(files, 400)
    vocab = tok.get_vocab_size()
    tool.write_checkpoint("ckpt", tok, 5, dim=32, ffn_dim=96, n_layers=2, n_heads=2, n_kv_heads=1, max_seq_len=64)
    tool.write_chat("chat.jsonl", documents(files, "%")[:400])
    run([sys.executable, args.prep_tool, "--tokenizer", "ckpt/tokenizer.json", "-o", "chat", "--format", "chat",
         "--val-fraction", "0.1", "--workers", "1", "--shard-tokens", "6000", "chat.jsonl"])
    for bad, msg in (('{"messages": [{"role": "user", "content": "hi"}]}', "bad.jsonl:2: no assistant message"),
                     ('{"text": "hi"}', "bad.jsonl:2: neither a \"messages\" list nor"),
                     ('{"messages": [{"role": "user"}]}', "bad.jsonl:2: a message that is not")):
        open("bad.jsonl", "w").write('{"prompt": "a", "response": "b"}\n' + bad + "\n")
        _, _, err = run([sys.executable, args.prep_tool, "--tokenizer", "ckpt/tokenizer.json", "-o", "bad",
                         "--format", "chat", "--val-fraction", "0", "--workers", "1", "bad.jsonl"], expect_rc=2)
        check(msg in err and not glob.glob("bad.train*"), "bad record: stderr lacks %r:\n%s" % (msg, err))
    shards = sorted(glob.glob("chat.train.*.bin"))
    check(len(shards) >= 2 and all(os.path.exists(p[:-4] + ".mask") for p in shards), "no masks beside %s" % shards)
    ids = np.concatenate([np.array(read_shard(p)[0]) for p in shards])
    mask = np.concatenate([np.frombuffer(open(p[:-4] + ".mask", "rb").read()[32:], dtype=np.uint8) for p in shards])
    check(len(ids) == len(mask) and 0 < mask.sum() < len(mask), "mask: %d of %d" % (mask.sum(), len(mask)))
    # gtrain: step 1's loss (before any update) against transformers on the same global batch
    T, G = 32, 8
    ini = """[model]
dim = 32
n_layers = 2
n_heads = 2
n_kv_heads = 1
vocab_size = %d
ffn_dim = 96
max_seq_len = 64
norm_eps = 1e-5
rope_theta = 10000
tie_word_embeddings = false
init = ckpt
[train]
seq_len = %d
steps = 2
lr = 3e-3
warmup_steps = 1
seed = 1337
precision = fp32
device = cpu
[data]
train = chat.train.*.bin
val = chat.val.*.bin
val_every = 2
val_batches = 4
loss_mask = on
""" % (vocab, T)
    open("chat.ini", "w").write(ini)
    losses = {}
    # one micro-batch of all 8 samples; 8 and 4 micro-batches of one sample each (their counted tokens differ)
    splits = ((1, 8, 1), (2, 1, 4), (4, 1, 2))
    for world, B, A in splits:
        name = "w%d_b%d_a%d" % (world, B, A)
        cmd = [args.mpiexec, args.np_flag, str(world)] + args.mpi_flags.split() + [
            args.gtrain, "chat.ini", "train.micro_batch=%d" % B, "train.grad_accum=%d" % A, "log.metrics=%s.jsonl" % name]
        run(cmd, env={"OMPI_MCA_rmaps_base_oversubscribe": "1"})
        losses[name] = [json.loads(l) for l in open(name + ".jsonl")]
    # the samples of step 1: gtrain's sampler (one unweighted pool: docs/data-format.md)
    counts = [len(read_shard(p)[0]) for p in shards]
    nwin = [max(0, c - T) for c in counts]
    starts, cum = [], np.cumsum([0] + counts)
    for sidx in range(G):
        k = mix64((mix64(1337) + (sidx + 1) * 0x9E3779B97F4A7C15) & MASK64) % sum(nwin)  # train.seed 1337
        i = 0
        while k >= nwin[i]:
            k -= nwin[i]
            i += 1
        starts.append(cum[i] + k)
    per_micro = [int(mask[s + 1:s + T + 1].sum()) for s in starts]
    check(len(set(per_micro)) > 1, "the samples of step 1 all count %s tokens: the splits would not test the "
          "normalisation" % per_micro)
    importer.join()
    check("transformers" in mods, "torch or transformers did not import")
    torch, transformers = mods["torch"], mods["transformers"]
    # the rendering is transformers' own, and exactly the assistant turns are counted
    recs = [json.loads(l) for l in open("chat.jsonl")]
    hf_tok = transformers.AutoTokenizer.from_pretrained("ckpt")
    one = hf_tok.apply_chat_template(recs[0]["messages"], tokenize=False)
    first_doc = hf_tok(one, add_special_tokens=False)["input_ids"]
    val_first = not np.array_equal(ids[:len(first_doc)], first_doc)  # the first record may be in validation
    if not val_first:
        counted = hf_tok.decode([t for t, m in zip(first_doc, mask[:len(first_doc)]) if m])
        want = "".join(m["content"].strip() + "<|eot_id|>" for m in recs[0]["messages"] if m["role"] == "assistant")
        check(counted == want, "counted tokens of the first conversation: %r, expected %r" % (counted, want))
    model = transformers.LlamaForCausalLM.from_pretrained("ckpt", attn_implementation="eager").float()
    inp = torch.tensor(np.stack([ids[s:s + T + 1] for s in starts]).astype(np.int64))
    labels = inp.clone()
    labels[torch.tensor(np.stack([mask[s:s + T + 1] for s in starts]) == 0)] = -100
    labels[:, 0] = -100  # position 0 is never a target
    out = model(input_ids=inp, labels=labels)
    out.loss.backward()
    ref = float(out.loss.detach())
    ref_norm = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters())))
    # every split: step 1's loss and its gradient norm before clipping against transformers' loss and
    # gradient of that mean, and step 2 (after an update with that gradient) against the one micro-batch run
    base = [r["loss"] for r in losses["w1_b8_a1"] if "loss" in r]
    for name, recs_ in losses.items():
        l = [r["loss"] for r in recs_ if "loss" in r]
        n1 = [r["grad_norm"] for r in recs_ if "loss" in r][0]
        check(abs(l[0] - ref) <= 1e-5 * abs(ref), "%s: step-1 loss %.9g, transformers (labels -100 on the masked "
              "tokens) %.9g" % (name, l[0], ref))
        check(abs(n1 - ref_norm) <= 1e-4 * ref_norm, "%s: step-1 gradient norm %.9g, transformers %.9g"
              % (name, n1, ref_norm))
        check(len(l) == 2 and abs(l[1] - base[1]) <= 1e-5 * abs(base[1]),
              "%s: losses %s differ from 1 rank x 8: %s" % (name, l, base))
    # validation batches are micro-batches: the same micro_batch, the same validation loss at any world size
    va = [r["val_loss"] for r in losses["w2_b1_a4"] if "val_loss" in r]
    vb = [r["val_loss"] for r in losses["w4_b1_a2"] if "val_loss" in r]
    check(va and vb and va[-1] is not None and abs(va[-1] - vb[-1]) <= 1e-5 * abs(vb[-1]),
          "val_loss %s at 2 ranks, %s at 4 ranks" % (va, vb))
    print("chat: %d shards, %d of %d tokens counted (step 1's samples count %s); step-1 loss gtrain %.9g, "
          "transformers %.9g; gradient norm transformers %.9g; the same step-1 loss and gradient norm and step-2 "
          "loss at %s" % (len(shards), int(mask.sum()), len(mask), per_micro, base[0], ref, ref_norm, sorted(losses)))


def bad_shards_and_globs_exit_2(args):
    os.makedirs("data", exist_ok=True)
    write_llmc("good.bin", list(range(200)))
    with open("badmagic.bin", "wb") as f:
        f.write(b"NOTATOKENFILE" + bytes(100))
    write_llmc("trunc.bin", list(range(200)), claim=300)
    with open("bigvocab.bin", "wb") as f:
        f.write(struct.pack("<8sIIQII", b"GTRNTOK\0", 1, 2, 100, 5000, 0) + struct.pack("<100H", *([4000] * 100)))
    cases = [
        ("badmagic.bin", "badmagic.bin: bad magic"),
        ("trunc.bin", "trunc.bin: size mismatch: llm.c header says 300 tokens"),
        ("good.bin,nothing-here.*.bin", "nothing-here.*.bin: the pattern matches no file"),
        ("bigvocab.bin", "bigvocab.bin: token id 4000 is outside [model] vocab_size = 256"),
        ("good.bin:0.5, good.bin:0", "'good.bin:0': weight 0 is not a positive number"),
        ("good.bin:-1", "'good.bin:-1': weight -1 is not a positive number"),
        ("good.bin:0.5, good.bin", "some sources have a weight and some do not"),
        ("good.bin:1, nothing-here.*.bin:1", "nothing-here.*.bin: the pattern matches no file"),
    ]
    tiny_ini("run.ini", 256, "good.bin", "", 1)
    for spec, msg in cases:
        _, _, err = run([args.gtrain, "run.ini", "data.train=" + spec], expect_rc=2)
        check(msg in err, "data.train=%s: stderr lacks %r:\n%s" % (spec, msg, err))
        check(len(err.strip().splitlines()) == 1, "more than one line for data.train=%s:\n%s" % (spec, err))
    _, _, err = run([args.gtrain, "run.ini", "data.val=bad*.bin,trunc.bin"], expect_rc=2)
    check("badmagic.bin: bad magic" in err, "data.val: stderr lacks the bad file:\n" + err)
    print("bad inputs: exit 2, one line naming the file, for %d cases" % (len(cases) + 1))


def prep_jsonl_4byte_ids_bos_separator(args):
    """JSONL with a named text field, a tokenizer with a BOS token and 70,000 tokens: 4-byte ids, BOS
    before every document; bad records exit 2 naming the file and line."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    words = ["w%d" % i for i in range(69990)]
    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>"] + words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save("wide.json")
    docs = ["w1 w2 w69000", "w68000 w5", "w7"]
    with open("in.jsonl", "w") as f:
        for d in docs:
            f.write(json.dumps({"id": 1, "body": d}) + "\n\n")
    _, _, err = prep(args, "wide.json", "wide", ["in.jsonl"], "--text-field", "body", "--val-fraction", "0",
                     "--workers", "2")
    check("BOS '<s>' (id 1) before each document" in err, "no BOS separator chosen:\n" + err)
    ids, v, tb = read_shard("wide.train.000000.bin")
    check(tb == 4 and v == 69993, "token_bytes %d, vocab %d (expected 4 and 69993)" % (tb, v))
    want = []
    for d in docs:
        want += [1] + [vocab[w] for w in d.split()]
    check(ids == want, "ids %s, expected %s" % (ids, want))
    check(not os.path.exists("wide.val.000000.bin"), "--val-fraction 0 wrote a validation shard")
    # a failed run with the same prefix (a bad record after a shard was finished, an empty input)
    # leaves the earlier run's shards as they were
    with open("first_good.jsonl", "w") as f:  # more records than one chunk (4096): shards finish before the error
        f.write('{"body": "w1 w2 w3 w4 w5"}\n' * 5000)
    with open("later_bad.jsonl", "w") as f:
        f.write('{"body": w2}\n')
    before = open("wide.train.000000.bin", "rb").read()
    open("empty.txt", "w").close()
    for extra in (["--text-field", "body", "--shard-tokens", "1000", "--workers", "1",
                   "first_good.jsonl", "later_bad.jsonl"], ["empty.txt"]):
        run([sys.executable, args.prep_tool, "--tokenizer", "wide.json", "-o", "wide", "--val-fraction", "0"] + extra,
            expect_rc=2)
        check(sorted(glob.glob("wide.*.bin*")) == ["wide.train.000000.bin"] and
              open("wide.train.000000.bin", "rb").read() == before,
              "%s: a failed run changed the earlier output: %s" % (extra[-1], sorted(glob.glob("wide.*.bin*"))))
    with open("bad.jsonl", "w") as f:
        f.write('{"text": "w1"}\n{"text": w2}\n')
    with open("nofield.jsonl", "w") as f:
        f.write('{"text": "w1"}\n{"txt": "w2"}\n')
    for name, msg in (("bad.jsonl", "bad.jsonl:2: not JSON"), ("nofield.jsonl", "nofield.jsonl:2: no text field 'text'"),
                      ("missing.jsonl", "missing.jsonl: no such file")):
        cmd = [sys.executable, args.prep_tool, "--tokenizer", "wide.json", "-o", "x", "--val-fraction", "0",
               "--workers", "2", name]
        _, _, err = run(cmd, expect_rc=2)
        check(msg in err, "%s: stderr lacks %r:\n%s" % (name, msg, err))
        check(not glob.glob("x.*"), "%s: output left behind: %s" % (name, glob.glob("x.*")))
    # one document and --val-fraction 0.01: it goes to train, validation stays empty -> exit 2, and the
    # train shard still open at that moment (its .tmp file) is removed too
    with open("one.jsonl", "w") as f:
        f.write('{"text": "w1 w2 w3"}\n')
    _, _, err = run([sys.executable, args.prep_tool, "--tokenizer", "wide.json", "-o", "x", "--val-fraction", "0.01",
                     "one.jsonl"], expect_rc=2)
    check("no document went to validation" in err, "one.jsonl: stderr lacks the reason:\n" + err)
    check(not glob.glob("x.*"), "one.jsonl: output left behind: %s" % glob.glob("x.*"))
    print("prep: JSONL, 4-byte ids, BOS before each document; bad records exit 2")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=["tokenizer_prep_train_sample_roundtrip", "prep_jsonl_4byte_ids_bos_separator",
                                        "llmc_shard_is_trained_on", "shards_same_samples_any_world_size",
                                        "bad_shards_and_globs_exit_2", "blend_same_samples_any_world_size",
                                        "chat_loss_mask_matches_transformers"])
    p.add_argument("--gtrain", required=True)
    p.add_argument("--sample")
    p.add_argument("--prep-tool")
    p.add_argument("--mpiexec")
    p.add_argument("--np-flag", default="-n")
    p.add_argument("--mpi-flags", default="")
    p.add_argument("--work", required=True)
    args = p.parse_args()
    for k in ("gtrain", "sample", "prep_tool", "mpiexec"):
        if getattr(args, k):
            setattr(args, k, os.path.abspath(getattr(args, k)) if os.path.exists(getattr(args, k)) else getattr(args, k))
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(os.path.join(args.work, "w1"))
    os.makedirs(os.path.join(args.work, "w2"))
    os.chdir(args.work)
    globals()[args.scenario](args)
    print("%s: ok" % args.scenario)


if __name__ == "__main__":
    main()
