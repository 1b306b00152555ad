#!/usr/bin/env python3
"""prep_tokenized.py: text or JSONL -> gtrain token shards, with a Hugging Face tokenizer.json.

    python tools/prep_tokenized.py --tokenizer tokenizer.json -o data/web FILE...

The interpreter is any Python 3 with the `tokenizers` package (pip install tokenizers), e.g. the
venv the tests use, /opt/gtrain-venv/bin/python (tools/setup-venv.sh). Encoding is the `tokenizers`
library's own (the Rust BPE/Unigram/WordPiece of the model's tokenizer.json); this script only
splits the input into documents, adds the separators, spreads the work over processes and writes
shards. docs/data-format.md describes the shard format and how gtrain samples from the shards.

Documents
  - a JSONL file (.jsonl, .ndjson, .json, or --format jsonl): one document per line, its text in the
    field named by --text-field (default "text"); blank lines are skipped;
  - a text file: the whole file is one document, or, with --doc-sep LINE, a line equal to LINE ends
    a document (--doc-sep '%' for fortune files, --doc-sep '' for blank lines). A document over
    --piece-bytes is encoded in pieces cut after a newline (no separator between the pieces).
Each document is encoded without the tokenizer's own special tokens, and documents are separated
by ONE id: the tokenizer's BOS token before every document when it has one (LLaMA-2 "<s>", LLaMA-3
"<|begin_of_text|>", Gemma "<bos>"), otherwise its EOS token after every document (GPT-2 and Qwen
"<|endoftext|>", "</s>"); --bos TOKEN or --eos TOKEN chooses explicitly. gtrain-sample --tokenizer
applies the same rule to prompts.

Chat and instruction data (--format chat, JSONL): each record is a conversation, a "messages" list of
{"role", "content"} (roles system, user, assistant, ...), or "prompt" and "response" fields (and an
optional "system"). It is rendered with the checkpoint's own chat template (the "chat_template" of the
tokenizer_config.json beside --tokenizer, or --chat-template FILE), the way transformers'
apply_chat_template renders it (Jinja2, trim_blocks and lstrip_blocks, bos_token and eos_token from the
config), and tokenized whole; a mask shard beside each token shard (PREFIX.train.000000.mask next to
PREFIX.train.000000.bin) marks the tokens the loss counts: those of the assistant's turns (what the
template adds for the turn after the generation prompt, its end-of-turn token included). Everything
else (system, user, the template's headers, the separators) is not counted. gtrain reads the masks
(data.loss_mask).

Validation split: document number d (counted over all inputs in order, from 0) goes to validation
when mix64(mix64(seed) + (d + 1) * 0x9E3779B97F4A7C15) / 2^64 < --val-fraction (splitmix64, the hash
of gtrain's sampler), so the split does not depend on --workers and spreads over the whole corpus.

Output: PREFIX.train.000000.bin, PREFIX.train.000001.bin, ... and PREFIX.val.000000.bin, ..., each
at most --shard-tokens tokens (default 100,000,000), in gtrain's shard format: 2-byte ids, 4-byte
when the vocabulary is over 65,536. Each shard is written under a temporary name; all are renamed
into place only when the whole input was read without error (a failed run leaves an earlier run's
shards as they were); shards of an earlier run with the same PREFIX and higher numbers are removed, so the globs
PREFIX.train.*.bin and PREFIX.val.*.bin name exactly this run's output. The output is the same for
any --workers.

Progress (stderr): input bytes read, tokens, tokens/s and an ETA; in place on a terminal, a line
every 15 s otherwise. Exit status: 0 done; 2 bad invocation or input (a missing file, JSON that does
not parse, a missing text field, a tokenizer that cannot be loaded or has no separator token, no
document for validation); 1 an I/O error while writing.
"""
import argparse
import array
import json
import multiprocessing
import os
import re
import struct
import sys
import time

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MAGIC = b"GTRNTOK\0"
MASK_MAGIC = b"GTRNMSK\0"
# Looked up in this order; the same lists are in src/core/sample_main.c (gtrain-sample --tokenizer).
BOS_NAMES = ["<|begin_of_text|>", "<s>", "<bos>", "[BOS]", "<|startoftext|>"]
EOS_NAMES = ["<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "[EOS]"]


class BadInput(Exception):
    """A problem with the invocation or the input: exit 2 with this message."""


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def load_tokenizer(path):
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise BadInput("the Python package 'tokenizers' is missing from %s (pip install tokenizers, or run "
                       "this script with /opt/gtrain-venv/bin/python)" % sys.executable)
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # the library's message, on one line
        raise BadInput("%s: cannot load the tokenizer: %s" % (path, str(e).splitlines()[0] if str(e) else e))


def choose_separator(tok, bos, eos, path):
    """(mode, token, id): mode 'bos' (before each document) or 'eos' (after each)."""
    def idof(name, opt):
        i = tok.token_to_id(name)
        if i is None:
            raise BadInput("%s: %s %r is not a token of this tokenizer" % (path, opt, name))
        return i
    if bos is not None:
        return "bos", bos, idof(bos, "--bos")
    if eos is not None:
        return "eos", eos, idof(eos, "--eos")
    for name in BOS_NAMES:
        if tok.token_to_id(name) is not None:
            return "bos", name, tok.token_to_id(name)
    for name in EOS_NAMES:
        if tok.token_to_id(name) is not None:
            return "eos", name, tok.token_to_id(name)
    raise BadInput("%s: no BOS (%s) or EOS (%s) token to separate documents; name one with --bos TOKEN or "
                   "--eos TOKEN" % (path, ", ".join(BOS_NAMES), ", ".join(EOS_NAMES)))


# ---------------------------------------------------------------------------------- reading documents
#
# The reader (main process) cuts the input into pieces: (doc, first, last, text_or_line, where), where
# doc is the global document number, first/last say whether the piece starts/ends its document, and
# a JSONL piece carries the raw line (parsed in the worker) with where = (file, line number).

def read_text(path, doc_sep, piece_bytes, next_doc):
    """Yields (piece, raw_bytes) for a text file."""
    try:
        f = open(path, "r", encoding="utf-8", newline="")
    except OSError as e:
        raise BadInput("%s: %s" % (path, e.strerror))
    with f:
        buf, size, raw, first, lineno = [], 0, 0, True, 0
        try:
            for line in f:
                lineno += 1
                n = len(line.encode("utf-8"))
                raw += n
                if doc_sep is None:
                    is_sep = False
                elif doc_sep == "":
                    is_sep = line.strip() == ""
                else:
                    is_sep = line.rstrip("\r\n") == doc_sep
                if is_sep:
                    if buf:
                        yield (next_doc[0], first, True, "".join(buf), None), raw
                        next_doc[0] += 1
                        raw = 0
                    buf, size, first = [], 0, True
                    continue
                buf.append(line)
                size += n
                if size >= piece_bytes and line.endswith("\n"):
                    yield (next_doc[0], first, False, "".join(buf), None), raw
                    raw, buf, size, first = 0, [], 0, False
        except UnicodeDecodeError as e:
            raise BadInput("%s:%d: not UTF-8 text (%s)" % (path, lineno + 1, e.reason))
        if buf or not first:
            yield (next_doc[0], first, True, "".join(buf), None), raw
            next_doc[0] += 1


def read_jsonl(path, next_doc):
    try:
        f = open(path, "rb")
    except OSError as e:
        raise BadInput("%s: %s" % (path, e.strerror))
    with f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            yield (next_doc[0], True, True, line, (path, lineno)), len(line)
            next_doc[0] += 1


# ---------------------------------------------------------------------------------- encoding (workers)

_W = {}


def worker_init(tokenizer_path, field, sep_mode, sep_id, val_fraction, seed, token_bytes, pool=True, chat=None):
    if pool:  # one thread per worker process; alone, the library's own threads may help
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _W.update(tok=load_tokenizer(tokenizer_path), field=field, sep_mode=sep_mode, sep_id=sep_id,
              val_fraction=val_fraction, seed_mix=mix64(seed & MASK64),
              typecode="H" if token_bytes == 2 else "I",
              chat=ChatTemplate(*chat) if chat else None)


class ChatTemplate:
    """A tokenizer_config.json chat template, rendered as transformers' apply_chat_template renders it."""

    def __init__(self, template, bos_token, eos_token):
        try:
            import jinja2
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise BadInput("--format chat needs the Python package 'jinja2' (pip install jinja2)")

        def raise_exception(msg):
            raise jinja2.exceptions.TemplateError(msg)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, indent=indent, ensure_ascii=False)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: time.strftime(fmt)
        try:
            self.t = env.from_string(template)
        except Exception as e:
            raise BadInput("the chat template does not parse: %s" % e)
        self.bos, self.eos = bos_token or "", eos_token or ""

    def render(self, messages, add_generation_prompt):
        return self.t.render(messages=messages, add_generation_prompt=add_generation_prompt,
                             bos_token=self.bos, eos_token=self.eos)


def conversation(rec, where):
    """A record -> its messages list, or raise ValueError with why not."""
    if isinstance(rec, dict) and isinstance(rec.get("messages"), list):
        msgs = rec["messages"]
        for m in msgs:
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise ValueError("a message that is not {\"role\": ..., \"content\": ...} (strings)")
        return msgs
    if isinstance(rec, dict) and isinstance(rec.get("prompt"), str) and isinstance(rec.get("response"), str):
        msgs = [{"role": "user", "content": rec["prompt"]}, {"role": "assistant", "content": rec["response"]}]
        if isinstance(rec.get("system"), str):
            msgs.insert(0, {"role": "system", "content": rec["system"]})
        return msgs
    raise ValueError("neither a \"messages\" list nor \"prompt\" and \"response\" strings")


def render_chat(chat, msgs):
    """(text, [(start, end)] character spans of the assistant turns)."""
    text = chat.render(msgs, False)
    spans = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        before = chat.render(msgs[:i], True)  # the prompt up to the turn, with the generation prompt
        upto = chat.render(msgs[:i + 1], False)
        if not (upto.startswith(before) and text.startswith(upto)):
            raise ValueError("the chat template does not render turn %d as a continuation of the turns "
                             "before it, so its tokens cannot be told from the prompt's" % i)
        spans.append((len(before), len(upto)))
    if not spans:
        raise ValueError("no assistant message: nothing would be trained on")
    return text, spans


def encode_chat(pieces):
    """The chat form of encode_chunk: also the masks, one byte per token."""
    tok, chat = _W["tok"], _W["chat"]
    out = {False: array.array(_W["typecode"]), True: array.array(_W["typecode"])}
    masks = {False: bytearray(), True: bytearray()}
    docs = {False: 0, True: 0}
    sep, bos = _W["sep_id"], _W["sep_mode"] == "bos"
    for doc, first, last, line, where in pieces:
        try:
            rec = json.loads(line)
        except ValueError as e:
            return ("error", "%s:%d: not JSON: %s" % (where[0], where[1], e))
        try:
            text, spans = render_chat(chat, conversation(rec, where))
        except ValueError as e:
            return ("error", "%s:%d: %s" % (where[0], where[1], e))
        except Exception as e:  # the template's own raise_exception and errors
            return ("error", "%s:%d: the chat template fails: %s" % (where[0], where[1], e))
        enc = tok.encode(text, add_special_tokens=False)
        ids = list(enc.ids)
        m = bytearray(1 if any(a <= st < b for a, b in spans) else 0 for st, _ in enc.offsets)
        v = is_val(doc)
        if bos and (not ids or ids[0] != sep):  # the template may start with the separator itself
            ids.insert(0, sep)
            m.insert(0, 0)
        if not bos and (not ids or ids[-1] != sep):
            ids.append(sep)
            m.append(0)
        out[v].extend(ids)
        masks[v].extend(m)
        docs[v] += 1
    if sys.byteorder != "little":
        for a in out.values():
            a.byteswap()
    n = len(out[False]) + len(out[True])
    return (out[False].tobytes(), out[True].tobytes(), docs[False], docs[True], n, bytes(masks[False]),
            bytes(masks[True]))


def is_val(doc):
    if _W["val_fraction"] <= 0:
        return False
    u = mix64((_W["seed_mix"] + (doc + 1) * GOLDEN) & MASK64)
    return u < _W["val_fraction"] * 2.0 ** 64


def encode_chunk(pieces):
    """pieces -> (train bytes, val bytes, train docs, val docs, tokens) or ('error', message)."""
    if _W["chat"] is not None:
        return encode_chat(pieces)
    texts = []
    for doc, first, last, text, where in pieces:
        if where is not None:  # a JSONL line
            try:
                rec = json.loads(text)
            except ValueError as e:
                return ("error", "%s:%d: not JSON: %s" % (where[0], where[1], e))
            value = rec.get(_W["field"]) if isinstance(rec, dict) else None
            if not isinstance(value, str):
                return ("error", "%s:%d: no text field %r (a string) in this record; name the field with "
                                 "--text-field" % (where[0], where[1], _W["field"]))
            text = value
        texts.append(text)
    tok = _W["tok"]
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
    encodings = encode(texts, add_special_tokens=False)
    out = {False: array.array(_W["typecode"]), True: array.array(_W["typecode"])}
    docs = {False: 0, True: 0}
    sep, bos = _W["sep_id"], _W["sep_mode"] == "bos"
    for (doc, first, last, _, _), enc in zip(pieces, encodings):
        v = is_val(doc)
        a = out[v]
        if bos and first:
            a.append(sep)
        a.extend(enc.ids)
        if not bos and last:
            a.append(sep)
        if last:
            docs[v] += 1
    if sys.byteorder != "little":
        for a in out.values():
            a.byteswap()
    n = len(out[False]) + len(out[True])
    return out[False].tobytes(), out[True].tobytes(), docs[False], docs[True], n


# ---------------------------------------------------------------------------------- writing shards

class ShardWriter:
    """PREFIX.SPLIT.NNNNNN.bin files of at most max_tokens tokens each, opened only when needed."""

    def __init__(self, prefix, split, token_bytes, vocab, max_tokens, mask=False):
        # mask: the loss masks beside the shards (PREFIX.SPLIT.NNNNNN.mask, one byte per token), cut
        # at the same places as the token shards since they count the same tokens
        self.mask = mask
        if mask:
            token_bytes, vocab = 1, 0
        self.prefix, self.split, self.tb, self.vocab, self.max = prefix, split, token_bytes, vocab, max_tokens
        self.paths, self.counts, self.f, self.n, self.tmp = [], [], None, 0, None
        self.done = []  # temporary names of the finished shards, renamed to self.paths by finish()
        self.dropped = 0

    def _path(self, i):
        return "%s.%s.%06d.%s" % (self.prefix, self.split, i, "mask" if self.mask else "bin")

    def _header(self, count):
        return struct.pack("<8sIIQII", MASK_MAGIC if self.mask else MAGIC, 1, self.tb, count, self.vocab, 0)

    def write(self, data):
        mv = memoryview(data)
        while len(mv):
            if self.f is None:
                self.tmp = self._path(len(self.paths)) + ".tmp.%d" % os.getpid()
                self.f = open(self.tmp, "wb")
                self.f.write(self._header(0))
                self.n = 0
            k = min(len(mv) // self.tb, self.max - self.n) * self.tb
            self.f.write(mv[:k])
            self.n += k // self.tb
            mv = mv[k:]
            if self.n == self.max:
                self._close()

    def _close(self):
        f, self.f = self.f, None
        if self.n < 2:  # gtrain refuses shards of fewer than 2 tokens
            f.close()
            os.unlink(self.tmp)
            self.dropped += self.n
            return
        f.seek(0)
        f.write(self._header(self.n))
        f.flush()
        os.fsync(f.fileno())
        f.close()
        os.chmod(self.tmp, 0o644)
        self.done.append(self.tmp)
        self.paths.append(self._path(len(self.paths)))
        self.counts.append(self.n)

    def finish(self):
        if self.f is not None:
            self._close()
        for tmp, path in zip(self.done, self.paths):
            os.replace(tmp, path)
        self.done = []
        # shards of an earlier, longer run with this prefix would join the glob: remove them
        stale, i = [], len(self.paths)
        while os.path.exists(self._path(i)):
            os.unlink(self._path(i))
            stale.append(self._path(i))
            i += 1
        return stale

    def remove_masks(self, n_shards):
        """A run without masks: an earlier chat run's masks beside these shards would be read; remove them."""
        stale, i = [], 0
        while True:
            m = "%s.%s.%06d.mask" % (self.prefix, self.split, i)
            if not os.path.exists(m):
                if i >= n_shards:
                    return stale
            else:
                os.unlink(m)
                stale.append(m)
            i += 1

    def abort(self):
        """Removes this run's temporary files; an earlier run's shards stay as they were."""
        if self.f is not None:
            self.f.close()
            os.unlink(self.tmp)
            self.f = None
        for tmp in self.done:
            os.unlink(tmp)
        self.done = []


# ---------------------------------------------------------------------------------- progress

def fmt_count(n):
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= div:
            return "%.1f%s" % (n / div, unit)
    return "%d" % n


def fmt_time(s):
    s = int(s + 0.5)
    return "%d:%02d:%02d" % (s // 3600, s // 60 % 60, s % 60)


class Progress:
    def __init__(self, total_bytes):
        self.total, self.done, self.tokens, self.t0 = max(total_bytes, 1), 0, 0, time.monotonic()
        self.tty, self.last = sys.stderr.isatty(), 0.0

    def update(self, raw_bytes, tokens, final=False):
        self.done += raw_bytes
        self.tokens += tokens
        now = time.monotonic()
        if not final and now - self.last < (0.2 if self.tty else 15.0):
            return
        self.last = now
        dt = max(now - self.t0, 1e-9)
        frac = min(self.done / self.total, 1.0)
        eta = dt * (1 - frac) / frac if frac > 0 else float("nan")
        bar = "#" * int(frac * 20) + "." * (20 - int(frac * 20))
        line = "prep: [%s] %3.0f%%  %sB of %sB  %s tokens  %s tokens/s  ETA %s" % (
            bar, 100 * frac, fmt_count(self.done), fmt_count(self.total), fmt_count(self.tokens),
            fmt_count(self.tokens / dt), fmt_time(eta) if eta == eta else "?")
        if self.tty:
            sys.stderr.write("\r\033[K" + line + ("\n" if final else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


# ---------------------------------------------------------------------------------- main

def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="prep_tokenized.py",
        description="Tokenise text or JSONL files with a Hugging Face tokenizer.json into gtrain shards "
                    "(PREFIX.train.NNNNNN.bin, PREFIX.val.NNNNNN.bin).")
    p.add_argument("files", nargs="+", metavar="FILE", help="text or JSONL input files, in this order")
    p.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer.json")
    p.add_argument("-o", "--output", required=True, metavar="PREFIX", help="output prefix")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="--format chat: a tokenizer_config.json (or a file holding the Jinja template) "
                        "(default: the tokenizer_config.json beside --tokenizer)")
    p.add_argument("--format", choices=["auto", "text", "jsonl", "chat"], default="auto",
                   help="input format; auto: .jsonl/.ndjson/.json are JSONL, the rest text (default auto)")
    p.add_argument("--text-field", default="text", help="JSONL: the field with the text (default text)")
    p.add_argument("--doc-sep", default=None, metavar="LINE",
                   help="text: a line equal to LINE ends a document ('' = a blank line); "
                        "default: one document per file")
    p.add_argument("--bos", default=None, metavar="TOKEN", help="put TOKEN before every document")
    p.add_argument("--eos", default=None, metavar="TOKEN", help="put TOKEN after every document")
    p.add_argument("--val-fraction", type=float, default=0.01,
                   help="fraction of the documents for validation, 0 <= F < 1 (default 0.01)")
    p.add_argument("--seed", type=int, default=0, help="seed of the validation split (default 0)")
    p.add_argument("--shard-tokens", type=int, default=100_000_000,
                   help="at most this many tokens per shard (default 100,000,000)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="encoding processes (default: the number of CPUs)")
    p.add_argument("--chunk-bytes", type=int, default=1 << 20, help=argparse.SUPPRESS)
    p.add_argument("--piece-bytes", type=int, default=16 << 20,
                   help="text: encode longer documents in pieces of about this size (default 16 MiB)")
    a = p.parse_args(argv)
    if not 0 <= a.val_fraction < 1:
        raise BadInput("--val-fraction %g must be in [0, 1)" % a.val_fraction)
    if a.shard_tokens < 2:
        raise BadInput("--shard-tokens %d must be at least 2" % a.shard_tokens)
    if a.workers < 1:
        raise BadInput("--workers %d must be at least 1" % a.workers)
    if a.bos is not None and a.eos is not None:
        raise BadInput("give --bos or --eos, not both")
    out_dir = os.path.dirname(a.output) or "."
    if not os.path.isdir(out_dir):
        raise BadInput("-o %s: the directory %s does not exist" % (a.output, out_dir))
    for f in a.files:
        if not os.path.isfile(f):
            raise BadInput("%s: %s" % (f, "not a regular file" if os.path.exists(f) else "no such file"))
    return a


def pieces_of(args, next_doc):
    for path in args.files:
        fmt = args.format
        if fmt == "chat":
            pass
        elif fmt == "auto":
            fmt = "jsonl" if re.search(r"\.(jsonl|ndjson|json)$", path) else "text"
        if fmt in ("jsonl", "chat"):
            yield from read_jsonl(path, next_doc)
        else:
            yield from read_text(path, args.doc_sep, args.piece_bytes, next_doc)


def chunks_of(args, next_doc):
    chunk, size, raw = [], 0, 0
    for piece, nraw in pieces_of(args, next_doc):
        chunk.append(piece)
        size += len(piece[3])
        raw += nraw
        if size >= args.chunk_bytes or len(chunk) >= 4096:
            yield chunk, raw
            chunk, size, raw = [], 0, 0
    if chunk or raw:
        yield chunk, raw


def load_chat_template(args):
    """(template, bos_token, eos_token) from --chat-template or the tokenizer_config.json beside --tokenizer."""
    path = args.chat_template or os.path.join(os.path.dirname(os.path.abspath(args.tokenizer)), "tokenizer_config.json")
    try:
        raw = open(path, encoding="utf-8").read()
    except OSError as e:
        raise BadInput("%s: %s (--format chat renders with the checkpoint's chat template: name the "
                       "tokenizer_config.json with --chat-template)" % (path, e.strerror))
    try:
        cfg = json.loads(raw)
    except ValueError:
        ChatTemplate(raw, None, None)
        return raw, None, None  # a file holding the template itself
    def tok_str(v):
        return v.get("content") if isinstance(v, dict) else v
    tpl = cfg.get("chat_template") if isinstance(cfg, dict) else None
    if isinstance(tpl, list):  # named templates: the default one
        tpl = next((t.get("template") for t in tpl if isinstance(t, dict) and t.get("name") == "default"), None)
    if not isinstance(tpl, str):
        jinja = os.path.join(os.path.dirname(path), "chat_template.jinja")
        if os.path.exists(jinja):
            tpl = open(jinja, encoding="utf-8").read()
        else:
            raise BadInput("%s: no \"chat_template\" (and no chat_template.jinja beside it): this tokenizer has "
                           "no chat template" % path)
    out = (tpl, tok_str(cfg.get("bos_token")), tok_str(cfg.get("eos_token")))
    ChatTemplate(*out)  # parses here, so a bad template is one message, not one per worker
    return out


def run(args):
    tok = load_tokenizer(args.tokenizer)
    vocab = max(tok.get_vocab(with_added_tokens=True).values()) + 1
    token_bytes = 2 if vocab <= 65536 else 4
    mode, sep_name, sep_id = choose_separator(tok, args.bos, args.eos, args.tokenizer)
    where = "before" if mode == "bos" else "after"
    print("prep: %s: vocabulary %d (%d-byte ids); documents separated by %s %r (id %d) %s each document"
          % (args.tokenizer, vocab, token_bytes, mode.upper(), sep_name, sep_id, where), file=sys.stderr)
    del tok

    chat = load_chat_template(args) if args.format == "chat" else None
    init = (args.tokenizer, args.text_field, mode, sep_id, args.val_fraction, args.seed, token_bytes, True, chat)
    writers = {False: ShardWriter(args.output, "train", token_bytes, vocab, args.shard_tokens),
               True: ShardWriter(args.output, "val", token_bytes, vocab, args.shard_tokens)}
    if chat:
        mask_writers = {v: ShardWriter(args.output, w.split, 1, 0, args.shard_tokens, mask=True)
                        for v, w in writers.items()}
        writers_all = list(writers.values()) + list(mask_writers.values())
    else:
        mask_writers, writers_all = {}, list(writers.values())
    docs = {False: 0, True: 0}
    progress = Progress(sum(os.path.getsize(f) for f in args.files))
    next_doc = [0]

    def consume(result, raw):
        if result[0] == "error":
            raise BadInput(result[1])
        tr, va, dt, dv, n = result[:5]
        writers[False].write(tr)
        writers[True].write(va)
        if mask_writers:
            mask_writers[False].write(result[5])
            mask_writers[True].write(result[6])
        docs[False] += dt
        docs[True] += dv
        progress.update(raw, n)

    pool = None
    try:
        if args.workers == 1:
            worker_init(*init[:7], pool=False, chat=chat)
            for chunk, raw in chunks_of(args, next_doc):
                consume(encode_chunk(chunk), raw)
        else:
            pool = multiprocessing.get_context("spawn").Pool(args.workers, worker_init, init)
            pending = []  # in input order, at most 2 per worker: bounded memory, ordered output
            for chunk, raw in chunks_of(args, next_doc):
                pending.append((pool.apply_async(encode_chunk, (chunk,)), raw))
                if len(pending) >= 2 * args.workers:
                    r, nraw = pending.pop(0)
                    consume(r.get(), nraw)
            for r, nraw in pending:
                consume(r.get(), nraw)
            pool.close()
            pool.join()
            pool = None
    except BaseException:
        if pool is not None:
            pool.terminate()
        for w in writers_all:  # nothing of this run stays behind
            w.abort()
        raise
    progress.update(0, 0, final=True)

    n_docs = docs[False] + docs[True]
    if n_docs == 0:
        for w in writers_all:
            w.abort()
        raise BadInput("empty input: no document in %s" % ", ".join(args.files))
    if args.val_fraction > 0 and docs[True] == 0:
        raise_after = ("no document went to validation (%d document%s, --val-fraction %g): give more "
                       "documents (e.g. --doc-sep), a larger --val-fraction, another --seed, or "
                       "--val-fraction 0" % (n_docs, "" if n_docs == 1 else "s", args.val_fraction))
        for w in writers_all:
            w.abort()
        raise BadInput(raise_after)
    for split in (False, True):
        w = writers[split]
        stale = w.finish()
        if split in mask_writers:
            mw = mask_writers[split]
            stale += mw.finish()
            assert mw.counts == w.counts, "masks and shards cut differently"
        else:
            stale += w.remove_masks(len(w.paths))
        if stale:
            print("prep: removed %d stale shard%s of an earlier run: %s" %
                  (len(stale), "" if len(stale) == 1 else "s", ", ".join(stale)), file=sys.stderr)
        if w.dropped:
            print("prep: dropped a last %s shard of %d token (gtrain needs 2)" % (w.split, w.dropped),
                  file=sys.stderr)
    dt = time.monotonic() - progress.t0
    total = sum(writers[False].counts) + sum(writers[True].counts)
    print("prep: %d documents (%d train, %d validation), %d tokens in %.1f s (%s tokens/s)" %
          (n_docs, docs[False], docs[True], total, dt, fmt_count(total / max(dt, 1e-9))))
    for split in (False, True):
        w = writers[split]
        if w.paths:
            print("  %s: %d shard%s, %d tokens" % (w.split, len(w.paths), "" if len(w.paths) == 1 else "s",
                                                   sum(w.counts)))
    print("In the config:\n  [model] vocab_size = %d   ; or more\n  [data] train = %s.train.*.bin" %
          (vocab, args.output))
    if writers[True].paths:
        print("  [data] val = %s.val.*.bin" % args.output)
    else:
        print("  [data] val =          ; no validation shards (--val-fraction 0)")
    print("  [data] separator = %d   ; separator_role = %s (for document_mask, reset_positions)" % (sep_id, mode))


def main(argv=None):
    try:
        run(parse_args(sys.argv[1:] if argv is None else argv))
    except BadInput as e:
        print("prep_tokenized.py: %s" % e, file=sys.stderr)
        return 2
    except OSError as e:
        print("prep_tokenized.py: %s: %s" % (e.filename or "", e.strerror or e), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
