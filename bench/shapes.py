"""Request shapes that clients send, rebuilt from the development prompts.

The dataset has one request shape per item (a single user message, HumanEval stubs as a
completions prompt) and one RAG template. Real traffic wraps the same tasks in other shapes;
:func:`shaped` rebuilds every item in each of them, so that the classifier can be fitted on
several shapes and scored on one it never saw (leave-one-shape-out, ``bench.classify``).

Every shape keeps the item's task. Templates vary per item (a stable choice by the item's id),
so no shape is a single fixed string. Shapes:

- ``plain``: the item as the dataset gives it (``bench.classify_data.to_body``);
- ``system_context``: RAG instructions and documents in the system message, the question as
  the user message; other items behind one of several system prompts;
- ``xml_documents``: RAG documents as XML blocks (``<documents><document index=...>``,
  ``<context>``, ``<search_results>``), then the question; other items unchanged;
- ``langchain_completion``: a ``/v1/completions`` prompt: LangChain's "Use the following pieces
  of context" and similar RAG templates; other items in instruction templates;
- ``context_turn``: RAG documents pasted in an earlier user turn, the question last; other
  items after a short opening exchange;
- ``multi_turn``: MT-Bench items as their real turns; others followed by a follow-up
  request (RAG: about the answer; others: "make it shorter", ...);
- ``content_parts``: message content as a list of parts (documents and question apart, or
  an image part before the text);
- ``tool_calls``: ``tools`` (weather, web search, calendar, database lookup) offered and an
  earlier tool exchange; RAG documents arrive as a search tool's result.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Row = Mapping[str, Any]
Body = dict[str, Any]

SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a helpful, respectful and honest assistant. Always answer as helpfully as "
    "possible, while being safe.",
    "You are ChatGPT, a large language model. Answer as concisely as possible.",
    "You are an AI assistant. The user will give you a task. Complete it as faithfully as you "
    "can and think step by step when it helps.",
    "You are Nova, the assistant inside a productivity app. Be friendly and direct, format "
    "answers in Markdown, and ask a clarifying question when the request is ambiguous.",
)
RAG_INSTRUCTIONS = (
    "Answer the user's question using only the context below. If the answer is not in the "
    "context, say that you don't know.",
    "You are a question-answering assistant. Use the retrieved documents to answer. Cite the "
    "documents you used.",
    "Here are some reference documents. Base your answer on them and do not invent facts.",
    "You answer questions about the knowledge base. Relevant excerpts follow.",
)
COMPLETION_RAG = (
    "Use the following pieces of context to answer the question at the end. If you don't know "
    "the answer, just say that you don't know, don't try to make up an answer.\n\n{context}\n\n"
    "Question: {question}\nHelpful Answer:",
    "Context information is below.\n---------------------\n{context}\n---------------------\n"
    "Given the context information and not prior knowledge, answer the query.\n"
    "Query: {question}\nAnswer: ",
    "Given the following extracted parts of a long document and a question, create a final "
    "answer.\n\n{context}\n\nQUESTION: {question}\nFINAL ANSWER:",
    "### Context\n{context}\n\n### Question\n{question}\n\n### Answer\n",
)
COMPLETION_CHAT = (
    "### Instruction:\n{prompt}\n\n### Response:\n",
    "User: {prompt}\nAssistant:",
    "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n",
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n### Instruction:\n{prompt}\n\n### Response:",
)
OPENINGS = (
    ("Hi! I have a request for you.", "Hello! Sure, what can I do for you?"),
    ("hey, are you there?", "Yes, I'm here. How can I help?"),
    ("Good morning. Can you help me with something?", "Good morning! Of course, go ahead."),
)
FOLLOW_UPS = (
    "Thanks! Can you make it shorter?",
    "Great, now do it again but with more detail.",
    "Can you revise that? The second half could be better.",
    "OK. Please continue.",
)
RAG_FOLLOW_UPS = (
    "Which document says that? Quote the sentence.",
    "Are you sure? Check the passages again.",
    "What else do the documents say about this?",
)
ACKS = ("Thanks, I have read it. What is your question?", "Got it.", "OK, I've read the text.")
TOOLS = {
    "get_weather": ("Get the current weather for a city", {"city": "string", "unit": "string"}),
    "web_search": ("Search the web and return the top results", {"query": "string"}),
    "create_event": ("Create a calendar event", {"title": "string", "start": "string"}),
    "lookup_customer": ("Look up a customer record by email", {"email": "string"}),
}
TOOL_EXCHANGES = (
    ("What's the weather in Oslo right now?", "get_weather", {"city": "Oslo"},
     {"city": "Oslo", "temperature": 4, "unit": "C", "conditions": "light snow"},
     "It's 4°C with light snow in Oslo."),
    ("Put a dentist appointment in my calendar for Friday at 3pm.", "create_event",
     {"title": "Dentist", "start": "Friday 15:00"}, {"status": "created", "id": "evt_8812"},
     "Done, the appointment is in your calendar."),
    ("Can you check the account of jane@example.com?", "lookup_customer",
     {"email": "jane@example.com"}, {"name": "Jane Roe", "plan": "pro", "since": "2021-04-02"},
     "Jane Roe has been on the Pro plan since April 2021."),
)  # fmt: skip


def _pick(options: Sequence[Any], row: Row, salt: str) -> Any:
    """A stable choice among ``options`` for ``row`` (by a hash of its id and ``salt``)."""
    return options[zlib.crc32(f"{row['id']}/{salt}".encode()) % len(options)]


def _user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def _plain(row: Row) -> Body:
    if row.get("prompt_format") == "completion":
        return {"model": "m", "prompt": row["prompt"], "max_tokens": 256}
    return {"model": "m", "messages": [_user(row["prompt"])]}


def _docs(row: Row) -> list[tuple[str, str]]:
    """(title, text) of the row's passages: all of them, or (for half of the items) the first
    two to four cut to 300-800 characters, as retrievers return short chunks."""
    docs = [(str(d.get("title", "")), str(d.get("text", ""))) for d in row["context"]]
    if _pick(range(2), row, "chunks"):
        return docs
    keep, size = 2 + _pick(range(3), row, "n"), 300 + 100 * _pick(range(6), row, "size")
    return [(t, x[:size]) for t, x in docs[:keep]]


def _docs_text(row: Row) -> str:
    """The documents as plain text, in one of several common layouts."""
    docs = _docs(row)
    style = _pick(range(4), row, "docs")
    if style == 0:
        return "\n\n".join(f"Document {i}: {t}\n{x}" for i, (t, x) in enumerate(docs, 1))
    if style == 1:
        return "\n\n".join(f"Title: {t}\nContent: {x}" for t, x in docs)
    if style == 2:
        return "\n---\n".join(f"Source: {t}\n{x}" for t, x in docs)
    return "\n\n".join(f"{t}\n{x}" for t, x in docs)


def _docs_xml(row: Row) -> str:
    docs = _docs(row)
    style = _pick(range(3), row, "xml")
    if style == 0:
        inner = "".join(
            f'<document index="{i}">\n<source>{t}</source>\n<document_content>\n{x}\n'
            "</document_content>\n</document>\n"
            for i, (t, x) in enumerate(docs, 1)
        )
        return f"<documents>\n{inner}</documents>"
    if style == 1:
        inner = "\n".join(f'  <doc id="{i}" title="{t}">{x}</doc>' for i, (t, x) in enumerate(docs))
        return f"<context>\n{inner}\n</context>"
    inner = "".join(
        f"<result>\n<title>{t}</title>\n<content>{x}</content>\n</result>\n" for t, x in docs
    )
    return f"<search_results>\n{inner}</search_results>"


def system_context(row: Row) -> Body:
    if row["task"] != "rag":
        body = _plain(row)
        if "messages" in body:
            system = {"role": "system", "content": _pick(SYSTEM_PROMPTS, row, "sys")}
            body["messages"] = [system, *body["messages"]]
        return body
    instruction = _pick(RAG_INSTRUCTIONS, row, "instr")
    system = f"{instruction}\n\n{_docs_text(row)}"
    return {"messages": [{"role": "system", "content": system}, _user(row["question"])]}


def xml_documents(row: Row) -> Body:
    if row["task"] != "rag":
        return _plain(row)
    docs, q = _docs_xml(row), row["question"]
    style = _pick(range(3), row, "xmlq")
    if style == 0:
        text = f"{docs}\n\n{q}"
    elif style == 1:
        text = f"{docs}\n\nAnswer the question using the documents above.\n<question>{q}</question>"
    else:
        text = f"Here are some documents for you to reference:\n{docs}\n\nQuestion: {q}"
    return {"messages": [_user(text)]}


def langchain_completion(row: Row) -> Body:
    if row["task"] == "rag":
        template = _pick(COMPLETION_RAG, row, "lc")
        prompt = template.format(context=_docs_text(row), question=row["question"])
    elif row.get("prompt_format") == "completion":
        prompt = row["prompt"]
    else:
        prompt = _pick(COMPLETION_CHAT, row, "lc").format(prompt=row["prompt"])
    return {"model": "m", "prompt": prompt, "max_tokens": 256}


def context_turn(row: Row) -> Body:
    if row["task"] == "rag":
        intro = _pick(("Here is some background:", "Read this first.", "Context:"), row, "ct")
        return {"messages": [
            _user(f"{intro}\n\n{_docs_text(row)}"),
            {"role": "assistant", "content": _pick(ACKS, row, "ack")},
            _user(row["question"]),
        ]}  # fmt: skip
    body = _plain(row)
    if "messages" in body:
        hello, reply = _pick(OPENINGS, row, "open")
        body["messages"] = [
            _user(hello),
            {"role": "assistant", "content": reply},
            *body["messages"],
        ]
    return body


def multi_turn(row: Row) -> Body:
    turns = list(row.get("turns") or [])
    if row["task"] == "rag":
        answer = row.get("reference_answer") or "The passages do not say."
        if isinstance(answer, list):
            answer = answer[0] if answer else "The passages do not say."
        turns = [row["prompt"], _pick(RAG_FOLLOW_UPS, row, "fu")]
        answers = [str(answer)]
    else:
        if len(turns) < 2:
            turns = [row["prompt"], _pick(FOLLOW_UPS, row, "fu")]
        answers = ["Sure. Here is my answer to your request."] * (len(turns) - 1)
    messages: list[dict[str, Any]] = []
    for i, turn in enumerate(turns):
        if i:
            messages.append({"role": "assistant", "content": answers[i - 1]})
        messages.append(_user(turn))
    return {"model": "m", "messages": messages}


def content_parts(row: Row) -> Body:
    if row["task"] == "rag":
        parts = [{"type": "text", "text": _docs_text(row)},
                 {"type": "text", "text": f"Question: {row['question']}"}]  # fmt: skip
        return {"messages": [_user(parts)]}
    body = _plain(row)
    if "messages" in body:
        parts = [{"type": "text", "text": row["prompt"]}]
        if _pick(range(3), row, "img") == 0:
            image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0K"}}
            parts.insert(0, image)
        body["messages"] = [_user(parts)]
    return body


def tool_definitions(names: Sequence[str]) -> list[dict[str, Any]]:
    """OpenAI ``tools`` entries for some of :data:`TOOLS`."""
    return [
        {"type": "function", "function": {
            "name": name, "description": TOOLS[name][0],
            "parameters": {"type": "object", "required": list(TOOLS[name][1])[:1],
                           "properties": {k: {"type": v} for k, v in TOOLS[name][1].items()}},
        }}
        for name in names
    ]  # fmt: skip


def _call(name: str, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [{
        "id": call_id, "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }]}  # fmt: skip


def tool_calls(row: Row) -> Body:
    tools = tool_definitions(sorted(TOOLS, key=lambda n: zlib.crc32(f"{row['id']}{n}".encode())))
    if row["task"] == "rag":
        hits = [{"title": t, "snippet": x} for t, x in _docs(row)]
        result = {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(hits)}
        messages = [
            _user(row["question"]),
            _call("web_search", {"query": row["question"]}, "call_1"),
            result,
        ]
        return {"model": "m", "messages": messages, "tools": tools}
    body = _plain(row)
    if "messages" in body:
        ask, name, args, result, reply = _pick(TOOL_EXCHANGES, row, "tool")
        body["messages"] = [
            _user(ask), _call(name, args, "call_0"),
            {"role": "tool", "tool_call_id": "call_0", "content": json.dumps(result)},
            {"role": "assistant", "content": reply}, *body["messages"],
        ]  # fmt: skip
        body["tools"] = tools[: 1 + _pick(range(4), row, "ntools")]
    return body


SHAPES: dict[str, Callable[[Row], Body]] = {
    "plain": _plain,
    "system_context": system_context,
    "xml_documents": xml_documents,
    "langchain_completion": langchain_completion,
    "context_turn": context_turn,
    "multi_turn": multi_turn,
    "content_parts": content_parts,
    "tool_calls": tool_calls,
}


def shaped(
    rows: Sequence[Row], names: Sequence[str] = tuple(SHAPES)
) -> list[tuple[str, str, str, Body]]:
    """(id, task, shape, body) for every row in every named shape (RAG rows need ``context``
    and ``question``; rows without them keep the plain shape)."""
    out: list[tuple[str, str, str, Body]] = []
    for row in rows:
        for name in names:
            if row["task"] == "rag" and not (row.get("context") and row.get("question")):
                body = _plain(row)
            else:
                body = SHAPES[name](row)
            out.append((str(row["id"]), str(row["task"]), name, body))
    return out
